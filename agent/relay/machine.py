"""The relay job state machine, as data (pure).

A relay job is one `backupClusterService` or `restoreClusterService` for one exact key
(cluster, node, kind, backupId, serviceId). One table, `TRANSITIONS`, says which operation may
move a job from which status to which; `decide()` answers the next status or raises
`IllegalTransition` and changes nothing. The store builds its compare-and-swap SQL from the
same table, so an illegal move cannot be persisted either.

    from status   operation  to status   note
    ------------  ---------  ----------  ---------------------------------------------------
    (absent)      start      running     written before any Corestore call or byte moves
    running       succeed    succeeded   the result is recorded; a replay answers it
    running       fail       failed      the error is recorded
    running       resume     running     a replay found it running with no task (a restart)
    failed        retry      running     a replay of a failed job runs it again

`succeeded` is terminal: an identical request answers the recorded result, a different body
for the same key is `job-conflict`. `failed` is not terminal: every step of a job is
idempotent at Corestore and at Cloudly, so the identical request simply runs it again
(`retry`). `running` with no task in this process means the agent stopped (or crashed) while
the job ran: the next identical request resumes it from the start, idempotently (`resume`).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final, Literal, get_args

from agent.errors import IllegalTransition

__all__ = [
    "JOB_KINDS",
    "JOB_STATUSES",
    "TRANSITIONS",
    "JobKind",
    "JobOp",
    "JobStatus",
    "decide",
    "render_table",
    "sources",
]

JobKind = Literal["backup", "restore"]
JOB_KINDS: Final[tuple[JobKind, ...]] = get_args(JobKind)

JobStatus = Literal["running", "succeeded", "failed"]
JOB_STATUSES: Final[tuple[JobStatus, ...]] = get_args(JobStatus)


class JobOp(enum.StrEnum):
    """Everything that may move a job: a request starting or re-running it, its outcome."""

    START = "start"
    SUCCEED = "succeed"
    FAIL = "fail"
    RESUME = "resume"
    RETRY = "retry"


TRANSITIONS: Final[Mapping[tuple[JobStatus | None, JobOp], JobStatus]] = MappingProxyType(
    {
        (None, JobOp.START): "running",
        ("running", JobOp.SUCCEED): "succeeded",
        ("running", JobOp.FAIL): "failed",
        ("running", JobOp.RESUME): "running",
        ("failed", JobOp.RETRY): "running",
    }
)


def decide(status: JobStatus | None, op: JobOp, *, revision: int) -> JobStatus:
    """The status `op` moves a job in `status` to, or `IllegalTransition` (nothing changes)."""
    to = TRANSITIONS.get((status, op))
    if to is None:
        raise IllegalTransition(operation=op.value, status=status, current=revision)
    return to


def sources(op: JobOp) -> dict[JobStatus | None, JobStatus]:
    """Every status `op` may leave, with where it goes."""
    return {source: to for (source, each), to in TRANSITIONS.items() if each is op}


def render_table() -> str:
    """The table as Markdown (docs/relay.md embeds exactly this)."""
    lines = ["| from | operation | to |", "|---|---|---|"]
    for (source, op), to in TRANSITIONS.items():
        lines.append(f"| {source or '(absent)'} | `{op.value}` | {to} |")
    return "\n".join(lines)
