"""The relay job state machine and the rule that answers a request, as data (pure).

A relay job is one run of `backupClusterService` or `restoreClusterService`. A backup's key is
exact (cluster, node, `backup`, backupId, serviceId): one backupId is one backup. A restore's
key adds its run number (1, 2, ... per service on its node): a backup may be restored many
times, and every restore request is a run of its own.

One table, `JOB_TABLE` (an `agent.domain.table.TransitionTable`), says which operation may move a
job from which status to which; `JOB_TABLE.decide()` answers the next status or raises
`IllegalTransition` and changes nothing. The store builds its compare-and-swap SQL from the same
table, so an illegal move cannot be persisted either.

    from status   operation  to status   note
    ------------  ---------  ----------  ---------------------------------------------------
    (absent)      start      running     written before any Corestore call or byte moves
    running       succeed    succeeded   the result is recorded; a backup's repeat gets it
    running       fail       failed      the error is recorded
    running       resume     running     a backup found running with no task (a restart)
    failed        retry      running     a backup's identical request runs it again

A second table, `REQUESTS`, answers a request by what it meets (`Meets`: the job of its key,
for a restore the run of its service that is running) with an `Answer`; `answer()` reads it.
For a backup: the recorded result of its key, the running work joined, a failure retried, an
interrupted job resumed, another body refused `job-conflict`. For a restore: a new run, unless
one of the service runs here: the identical request joins it, any other is refused
`restore-in-progress` (retryable). A restore is never resumed: a run found `running` with no
task in this process (the agent stopped) is recorded failed, and the next request is a new run.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final, Literal, get_args

from agent.domain.table import TransitionTable
from agent.errors import InvalidState

__all__ = [
    "FINISHED",
    "JOB_KINDS",
    "JOB_STATUSES",
    "JOB_TABLE",
    "REQUESTS",
    "Answer",
    "JobKind",
    "JobOp",
    "JobStatus",
    "Meets",
    "answer",
    "backup_meets",
    "render_requests",
    "restore_meets",
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


FINISHED: Final[frozenset[JobStatus]] = frozenset({"succeeded", "failed"})
"""The statuses a job's work has ended in, which retention may forget once old enough. A
forgotten job is a key with no job: its request then meets `NOTHING` and starts (for a failed
backup the same as `retry`; for a succeeded one a rerun that Corestore's idempotent backup PUT
answers with the same record; docs/relay.md, "Retention")."""

JOB_TABLE: Final = TransitionTable[JobStatus, JobOp](
    {
        (None, JobOp.START): "running",
        ("running", JobOp.SUCCEED): "succeeded",
        ("running", JobOp.FAIL): "failed",
        ("running", JobOp.RESUME): "running",
        ("failed", JobOp.RETRY): "running",
    }
)
"""The job machine (no guarded moves)."""


# --- the request rule -----------------------------------------------------------------------


class Meets(enum.StrEnum):
    """What a request finds: for a backup, the job of its key; for a restore, the run of its
    service on its node that works in this process."""

    NOTHING = "nothing"
    RUNNING_SAME = "running-same"
    RUNNING_OTHER = "running-other"
    UNOWNED = "unowned"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    OTHER_BODY = "other-body"


class Answer(enum.StrEnum):
    """What the request gets: work that starts (`start`, `resume`, `retry`: the job operation
    of the same name), the running work's outcome, the recorded response, or a refusal."""

    START = "start"
    RESUME = "resume"
    RETRY = "retry"
    JOIN = "join"
    RECORDED = "recorded"
    CONFLICT = "conflict"
    BUSY = "busy"


_MEETS_TEXT: Final[Mapping[tuple[JobKind, Meets], str]] = MappingProxyType(
    {
        ("backup", Meets.NOTHING): "no job of its key",
        ("backup", Meets.RUNNING_SAME): "its job running in this process",
        ("backup", Meets.UNOWNED): "its job `running`, left so by a stopped agent",
        ("backup", Meets.SUCCEEDED): "its job `succeeded`",
        ("backup", Meets.FAILED): "its job `failed`",
        ("backup", Meets.OTHER_BODY): "a job of its key made by another request body",
        ("restore", Meets.NOTHING): "no run of the service running",
        ("restore", Meets.RUNNING_SAME): "a run of the service running for the same body",
        ("restore", Meets.RUNNING_OTHER): "a run of the service running for another body",
    }
)

_ANSWER_TEXT: Final[Mapping[Answer, str]] = MappingProxyType(
    {
        Answer.START: "`start`: the work runs",
        Answer.RESUME: "`resume`: the work runs again from the start, idempotently",
        Answer.RETRY: "`retry`: the work runs again",
        Answer.JOIN: "joins it: the same outcome, no second run",
        Answer.RECORDED: "the recorded response, at once; nothing runs",
        Answer.CONFLICT: "`job-conflict` (not retryable); nothing changes",
        Answer.BUSY: "`restore-in-progress` (retryable); nothing changes",
    }
)

# Where an answer reads differently for one kind.
_KIND_ANSWER_TEXT: Final[Mapping[tuple[JobKind, Answer], str]] = MappingProxyType(
    {("restore", Answer.START): "`start`: a new run, the service's next, whatever ran before"}
)

REQUESTS: Final[Mapping[tuple[JobKind, Meets], Answer]] = MappingProxyType(
    {
        ("backup", Meets.NOTHING): Answer.START,
        ("backup", Meets.RUNNING_SAME): Answer.JOIN,
        ("backup", Meets.UNOWNED): Answer.RESUME,
        ("backup", Meets.SUCCEEDED): Answer.RECORDED,
        ("backup", Meets.FAILED): Answer.RETRY,
        ("backup", Meets.OTHER_BODY): Answer.CONFLICT,
        ("restore", Meets.NOTHING): Answer.START,
        ("restore", Meets.RUNNING_SAME): Answer.JOIN,
        ("restore", Meets.RUNNING_OTHER): Answer.BUSY,
    }
)


def backup_meets(status: JobStatus | None, *, same_body: bool, here: bool) -> Meets:
    """What a backup request meets: the stored job's `status` (None: none), whether it was made
    by the same body, whether its work runs in this process."""
    if status is None:
        return Meets.NOTHING
    if not same_body:
        return Meets.OTHER_BODY
    if here:
        return Meets.RUNNING_SAME
    return {"running": Meets.UNOWNED, "succeeded": Meets.SUCCEEDED, "failed": Meets.FAILED}[status]


def restore_meets(*, running: bool, same_body: bool) -> Meets:
    """What a restore request meets: whether a run of its service works in this process, and
    whether that run was made by the same body."""
    if not running:
        return Meets.NOTHING
    return Meets.RUNNING_SAME if same_body else Meets.RUNNING_OTHER


def answer(kind: JobKind, meets: Meets) -> Answer:
    """The table's answer; `InvalidState` for a situation the kind cannot meet (a bug)."""
    found = REQUESTS.get((kind, meets))
    if found is None:
        raise InvalidState(f"a {kind} request cannot meet {meets.value}")
    return found


def render_requests() -> str:
    """The request rule as Markdown (docs/relay.md embeds exactly this)."""
    lines = ["| request | meets | gets |", "|---|---|---|"]
    for (kind, meets), to in REQUESTS.items():
        gets = _KIND_ANSWER_TEXT.get((kind, to), _ANSWER_TEXT[to])
        lines.append(f"| {kind} | {_MEETS_TEXT[(kind, meets)]} | {gets} |")
    return "\n".join(lines)
