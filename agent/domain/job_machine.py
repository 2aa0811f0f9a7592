"""The relay job state machine and the rule that answers a request, as data (pure).

A relay job is one run of `backupClusterService` or `restoreClusterService`. A backup's key is
exact (cluster, node, `backup`, backupId, serviceId): one backupId is one backup. A restore's
key adds its run number (1, 2, ... per service on its node): a backup may be restored many
times, and every restore request is a run of its own.

One table, `JOB_TABLE` (an `agent.table.TransitionTable`), says which operation may move a
job from which status to which; `JOB_TABLE.decide()` answers the next status or raises
`IllegalTransition` and changes nothing. The store builds its compare-and-swap SQL from the same
table, so an illegal move cannot be persisted either.

    from status   operation  to status   note
    ------------  ---------  ----------  ---------------------------------------------------
    (absent)      start      running     written before any Corestore call or byte moves
    running       succeed    succeeded   the result is recorded; a backup's repeat gets it
    running       fail       failed      the error is recorded
    running       resume     running     a backup found running with no task (a restart)
    failed        retry      running     an identical request runs it again (a restore under
                                         its keys, while Cloudly may not hold its failure)

A second table, `REQUESTS`, answers a request by what it meets (`Meets`: for a backup the job
of its key, for a restore the runs of its service) with an `Answer`; `answer()` reads it.
For a backup: the recorded result of its key, the running work joined, a failure retried, an
interrupted job resumed, another body refused `job-conflict`. For a restore: the identical
request joins a run of the service that works in this process, any other is refused
`restore-in-progress` (retryable). Otherwise it meets the service's last run:

- left `running` by a stopped agent (and reconciled with Corestore first: not every effect of
  it was applied): the identical request resumes that run under its keys, so Corestore applies
  nothing twice; another body records it interrupted and starts a new run;
- ended, for the identical request, while Cloudly may not hold its answer
  (`agent.domain.answer_fate`: it was given only on connections that ended unconfirmed, or to
  nobody, or by an earlier process that never recorded it delivered): a run that succeeded
  gives its recorded answer and nothing runs (a lost answer never makes a second import); a
  run that failed runs again under its keys (`retry`: what Corestore applied is not applied
  again), so a failure is never answered from the record;
- ended otherwise (Cloudly holds its answer: confirmed by a pong, or given on the live
  connection this request arrives on; or another body): a new run. A backup may be restored
  many times: once Cloudly has the answer, the same request restores again.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Final, Literal, get_args

from agent.domain.answer_fate import HELD
from agent.errors import InvalidState
from agent.table import TransitionTable

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
    "answer_reasons",
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
    },
    column="operation",
)
"""The job machine (no guarded moves)."""


# --- the request rule -----------------------------------------------------------------------


class Meets(enum.StrEnum):
    """What a request finds: for a backup, the job of its key; for a restore, the run of its
    service on its node that works in this process, else the service's last run."""

    NOTHING = "nothing"
    RUNNING_SAME = "running-same"
    RUNNING_OTHER = "running-other"
    UNOWNED = "unowned"
    UNOWNED_OTHER = "unowned-other"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    OTHER_BODY = "other-body"
    UNANSWERED_SUCCEEDED = "unanswered-succeeded"
    UNANSWERED_FAILED = "unanswered-failed"
    ANSWERED = "answered"


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
        ("restore", Meets.RUNNING_SAME): "a run of the service working here, for the same body",
        ("restore", Meets.RUNNING_OTHER): "a run of the service working here, for another body",
        ("restore", Meets.NOTHING): "no run of the service",
        ("restore", Meets.UNOWNED): (
            "the service's last run `running`, left so by a stopped agent, for the same body "
            "(reconciled with Corestore first: not every effect of it applied)"
        ),
        ("restore", Meets.UNOWNED_OTHER): (
            "the service's last run `running`, left so by a stopped agent, for another body "
            "(reconciled first, likewise)"
        ),
        ("restore", Meets.UNANSWERED_SUCCEEDED): (
            "the service's last run `succeeded`, for the same body, Cloudly may not hold its answer"
        ),
        ("restore", Meets.UNANSWERED_FAILED): (
            "the service's last run `failed`, for the same body, Cloudly may not hold its answer"
        ),
        ("restore", Meets.ANSWERED): (
            "the service's last run ended and Cloudly holds its answer, or it was for another body"
        ),
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

# Where an answer reads differently for what it meets.
_ROW_TEXT: Final[Mapping[tuple[JobKind, Meets], str]] = MappingProxyType(
    {
        ("restore", Meets.NOTHING): "`start`: a new run, the service's first",
        ("restore", Meets.UNOWNED): (
            "`resume`: that run again under its keys: what Corestore applied is not applied again"
        ),
        ("restore", Meets.UNOWNED_OTHER): (
            "`start`: a new run, the service's next; the one left is recorded interrupted"
        ),
        ("restore", Meets.UNANSWERED_SUCCEEDED): (
            "the recorded response, at once; nothing runs (no second import)"
        ),
        ("restore", Meets.UNANSWERED_FAILED): (
            "`retry`: that run again under its keys: what Corestore applied is not applied again"
        ),
        ("restore", Meets.ANSWERED): "`start`: a new run, the service's next",
    }
)

REQUESTS: Final[Mapping[tuple[JobKind, Meets], Answer]] = MappingProxyType(
    {
        ("backup", Meets.NOTHING): Answer.START,
        ("backup", Meets.RUNNING_SAME): Answer.JOIN,
        ("backup", Meets.UNOWNED): Answer.RESUME,
        ("backup", Meets.SUCCEEDED): Answer.RECORDED,
        ("backup", Meets.FAILED): Answer.RETRY,
        ("backup", Meets.OTHER_BODY): Answer.CONFLICT,
        ("restore", Meets.RUNNING_SAME): Answer.JOIN,
        ("restore", Meets.RUNNING_OTHER): Answer.BUSY,
        ("restore", Meets.NOTHING): Answer.START,
        ("restore", Meets.UNOWNED): Answer.RESUME,
        ("restore", Meets.UNOWNED_OTHER): Answer.START,
        ("restore", Meets.UNANSWERED_SUCCEEDED): Answer.RECORDED,
        ("restore", Meets.UNANSWERED_FAILED): Answer.RETRY,
        ("restore", Meets.ANSWERED): Answer.START,
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


def restore_meets(*, here: bool, last: JobStatus | None, same_body: bool, held: bool) -> Meets:
    """What a restore request meets: whether a run of its service works in this process (`here`),
    else the status of the service's last run (`last`, None: none, `running`: left so by a
    stopped agent and not fully applied); `same_body`: whether that run was made by the same
    body; `held`: whether Cloudly holds that run's answer (`agent.domain.answer_fate`)."""
    if here:
        return Meets.RUNNING_SAME if same_body else Meets.RUNNING_OTHER
    if last is None:
        return Meets.NOTHING
    if last == "running":
        return Meets.UNOWNED if same_body else Meets.UNOWNED_OTHER
    if not same_body or held:
        return Meets.ANSWERED
    return Meets.UNANSWERED_SUCCEEDED if last == "succeeded" else Meets.UNANSWERED_FAILED


def answer(kind: JobKind, meets: Meets) -> Answer:
    """The table's answer; `InvalidState` for a situation the kind cannot meet (a bug)."""
    found = REQUESTS.get((kind, meets))
    if found is None:
        raise InvalidState(f"a {kind} request cannot meet {meets.value}")
    return found


_JUDGED: Final = frozenset({Meets.ANSWERED, Meets.UNANSWERED_SUCCEEDED, Meets.UNANSWERED_FAILED})


def answer_reasons() -> Iterator[tuple[JobKind, Answer, str]]:
    """Every (kind, answer, reason) a request can be reported with: the reason is what it met,
    or for a restore meeting its service's ended run with the same body, where that run's
    answer went (`agent.domain.answer_fate`)."""
    for (kind, meets), to in REQUESTS.items():
        if kind == "restore" and meets in _JUDGED:
            held = meets is Meets.ANSWERED
            yield from ((kind, to, fate.value) for fate, holds in HELD.items() if holds is held)
        if not (kind == "restore" and meets in _JUDGED and meets is not Meets.ANSWERED):
            yield kind, to, meets.value


def render_requests() -> str:
    """The request rule as Markdown (docs/relay.md embeds exactly this)."""
    lines = ["| request | meets | gets |", "|---|---|---|"]
    for (kind, meets), to in REQUESTS.items():
        gets = _ROW_TEXT.get((kind, meets), _ANSWER_TEXT[to])
        lines.append(f"| {kind} | {_MEETS_TEXT[(kind, meets)]} | {gets} |")
    return "\n".join(lines)
