"""`JobExecution`: one relay job's run in its task: its work, its outcome recorded, its callers
answered.

The runner (`agent.relay.runner`) starts a job's task with `JobExecution.run(stored, work,
outcome)`: the work runs (`Work`), its outcome (`agent.domain.outcomes`: `Succeeded`,
`JobFailed`) is recorded before any caller sees it, then `outcome` (what every caller of the
job awaits, joined ones too) is resolved with the answer (`Answered`):

- a failure is recorded `failed` and answered; a bug in the work (no `AgentError`) fails the job
  `internal`, not retryable (the same request meets the same bug; `relay_job_crashed`);
- a store that refuses to record the outcome is no bug: a failure is answered as it was, a
  success `OutcomeUnrecorded` (`internal`, retryable), since the row stays `running` and the
  identical request settles it;
- cancelled (the agent stops), during the work or while its outcome is being written, the
  callers are answered `ShuttingDown` and the row stays `running` (the next identical request
  resumes it, after reconciling a restore);
- a bug in recording the outcome leaves the task: the runner's `agent.owner.KeyedTasks` logs it
  and `crashed(key, outcome)` answers the callers.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

import structlog

from agent.domain.job_machine import JobOp
from agent.domain.jobs import JobKey, StoredJob
from agent.domain.outcomes import JobFailed, JobResult, JsonObject, RunPlan, Succeeded
from agent.errors import AgentError, OutcomeUnrecorded, ShuttingDown
from agent.relay.answers import AnswerBook
from agent.store import RevisionStore

__all__ = ["Answered", "JobExecution", "Work", "crashed", "job_fields", "recorded"]

# A job's records keep the runner's name: an operator follows one job under one logger.
_log = structlog.get_logger("agent.relay.runner")

Work = Callable[[JobKey, "RunPlan | None"], Awaitable[Succeeded]]
"""A job's work, given its job's key (a restore's with the run number the store gave it) and a
restore run's plan (the keys its effects carry); its success, or it raises the `AgentError`
the job failed with."""


@dataclass(frozen=True, slots=True)
class Answered:
    """A job's outcome as its callers get it: the recorded revision (None: not recorded, so
    there is nothing to be delivered), the response or the error."""

    key: JobKey
    revision: int | None
    response: JsonObject | None = None
    error: AgentError | None = None


class JobExecution:
    """Runs jobs' work and records their outcomes in `store`, noting a restore run's end in
    `answers` (where its answer went, `agent.relay.answers`)."""

    def __init__(self, store: RevisionStore, answers: AnswerBook) -> None:
        self._store = store
        self._answers = answers

    async def run(self, stored: StoredJob, work: Work, outcome: asyncio.Future[Answered]) -> None:
        """Run the job `stored` (moved to `running`), record its outcome and resolve `outcome`
        with its answer; cancelled, during the work or while its outcome is being written, with
        `ShuttingDown`."""
        key, recording = stored.key, False
        try:
            op, result, answered = await self._execute(stored, work)
            recording = True
            revision = await self._record(stored, op, result)
        except asyncio.CancelledError:
            # A caller joined to the job waits on `outcome`, not on this task: unresolved, it
            # would wait forever. The row stays `running` (a write in flight may or may not
            # land): the repeat finds whichever row it left, resumed or reconciled.
            outcome.set_result(Answered(key, None, error=_stopped(key, recording=recording)))
            raise
        outcome.set_result(_settled(answered, revision))

    async def _execute(self, stored: StoredJob, work: Work) -> tuple[JobOp, JobResult, Answered]:
        """Run the job's work: the move that records its outcome, and its answer (recorded at
        a revision still to come)."""
        key = stored.key
        try:
            succeeded = await work(key, stored.plan)
        except Exception as exc:  # noqa: BLE001  # recorded; a bug is logged with its traceback
            failure = (
                exc
                if isinstance(exc, AgentError)
                else AgentError(f"the relay {key.kind} failed unexpectedly ({type(exc).__name__})")
            )
            if failure is not exc:
                _log.exception("relay_job_crashed", **job_fields(key))
            else:
                _log.warning(
                    "relay_job_failed", **job_fields(key), code=failure.code, error=str(failure)
                )
            return JobOp.FAIL, JobFailed.of(failure), Answered(key, None, error=failure)
        return JobOp.SUCCEED, succeeded, Answered(key, None, response=succeeded.response)

    async def _record(self, stored: StoredJob, op: JobOp, result: JobResult) -> int | None:
        """Record the job's outcome; its revision, or None when the store refused (the row
        stays `running`: the next request settles it)."""
        try:
            moved = await self._store.move_job(
                stored.key,
                op=op,
                expected_revision=stored.revision,
                digest=stored.request_digest,
                result=result,
            )
        except AgentError as exc:
            _log.error("relay_job_unrecorded", **job_fields(stored.key), code=exc.code)
            return None
        if stored.key.kind == "restore":
            self._answers.ended(stored.key, moved.revision)
        if isinstance(result, Succeeded):
            _log.info("relay_job_succeeded", **job_fields(stored.key), **result.report.log_fields())
        return moved.revision


def crashed(key: JobKey, outcome: asyncio.Future[Answered]) -> None:
    """A bug of the runner's own (recording an outcome) fails job `key`, `internal`, not
    retryable (the same request would meet it again): its callers are answered."""
    if not outcome.done():
        error = AgentError(f"the relay {key.kind} failed unexpectedly")
        outcome.set_result(Answered(key, None, error=error))


def recorded(key: JobKey, revision: int, result: JobResult) -> Answered:
    """A recorded outcome answered again."""
    if isinstance(result, JobFailed):
        return Answered(key, revision, error=result.error())
    return Answered(key, revision, response=result.response)


def job_fields(key: JobKey) -> dict[str, str | int]:
    """What names job `key` in the log."""
    fields: dict[str, str | int] = {
        "kind": key.kind,
        "node": key.node_id,
        "backup_id": key.backup_id,
        "service_id": key.service_id,
    }
    if key.kind == "restore" and key.run:
        fields["run"] = key.run
    return fields


def _settled(answered: Answered, revision: int | None) -> Answered:
    """A run's answer once its outcome was recorded at `revision` (None: the store refused; a
    failure is answered as it was, a success is `OutcomeUnrecorded`, retryable)."""
    if answered.error is not None:
        return replace(answered, revision=revision)
    if revision is None:
        unrecorded = OutcomeUnrecorded(
            f"the relay {answered.key.kind} ran but its outcome could not be recorded; "
            "send it again"
        )
        return Answered(answered.key, None, error=unrecorded)
    return replace(answered, revision=revision)


def _stopped(key: JobKey, *, recording: bool) -> ShuttingDown:
    """What the callers of job `key` get when the agent stops it, in its work or while its
    outcome was being recorded."""
    if recording:
        return ShuttingDown(
            f"the agent stopped while the {key.kind}'s outcome was being recorded; "
            "repeat the request for it"
        )
    again = "resume" if key.kind == "backup" else "restore anew"
    return ShuttingDown(f"the agent stopped while the job ran; repeat the request to {again}")
