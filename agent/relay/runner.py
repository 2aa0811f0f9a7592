"""`JobRunner`: durable relay jobs, the rule that answers a repeated request, and the one owner
of their tasks.

`submit(key, digest, start)` answers a request by `agent.domain.job_machine.REQUESTS`
(docs/relay.md, "Jobs and repeats"), under the lock of what one job at a time may hold
(`JobKey.scope`: a backup's key, a restore's service on its node):

- a backup meets the job of its exact key: another body is `JobConflict`, `succeeded` answers
  its recorded response at once, work running in this process is joined, a `failed` job is
  retried, one left `running` by a stopped agent is resumed;
- a restore meets the run of its service that works in this process: the identical request
  joins it, any other is `RestoreInProgress` (retryable); with none, a new run starts. A run
  the store holds `running` while no task of this process works on it was interrupted (the
  agent stopped): it is recorded `failed` (`shutting-down`, retryable) first, never resumed,
  and the same happens to every such run at start-up (`relay_restore_interrupted`).

Work that starts runs `start()` first (checks that refuse before anything is stored, and that
may ask Corestore), then the job row moves (`start`, `resume`, `retry`;
`agent.domain.job_machine`) and the work runs as a task of `run()`'s TaskGroup. The work belongs
to the runner, not to the request: a caller that goes away (its session dropped) leaves the work
running, and the repeated request joins it. `close()` cancels the work; its row stays `running`
(a backup's next identical request after the restart resumes it; a restore's is recorded
interrupted). A job's outcome is recorded before any caller sees it: `succeed` with
`{"response", "report"}`, `fail` with `{"error": {code, message, retryable}}`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

import structlog

from agent.clock import SYSTEM_CLOCK, Clock
from agent.domain.job_machine import Answer, JobOp, answer, backup_meets, restore_meets
from agent.domain.jobs import JobKey, StoredJob
from agent.errors import AgentError, JobConflict, RestoreInProgress, ShuttingDown
from agent.locks import KeyedLocks
from agent.owner import TaskOwner
from agent.store import RevisionStore

__all__ = ["INTERRUPTED", "JobRunner", "Outcome", "Work"]

_log = structlog.get_logger("agent.relay.runner")

Outcome = tuple[dict[str, Any], dict[str, Any]]
"""What a job's work returns: the response's wire dict and the report recorded next to it."""

Work = Callable[[JobKey], Awaitable[Outcome]]
"""A job's work, given its job's key (a restore's with the run number the store gave it)."""

Scope = tuple[str, str, str, str, str]

INTERRUPTED: Final = {
    "error": {
        "code": ShuttingDown.code,
        "message": (
            "the agent stopped while this restore ran; it is not resumed: a new request "
            "restores anew"
        ),
        "retryable": True,
    }
}
"""What a restore run interrupted by the agent stopping is recorded failed with (the schema's
migration 3 writes the same for a run it finds `running`)."""

_OPS: Final = {Answer.START: JobOp.START, Answer.RESUME: JobOp.RESUME, Answer.RETRY: JobOp.RETRY}


@dataclass(frozen=True, slots=True)
class _Running:
    """Work running in this process: its job's key, the body's digest, its outcome."""

    key: JobKey
    digest: str
    outcome: asyncio.Future[dict[str, Any]]


class JobRunner:
    """Runs relay jobs for the relay service; run it in the caller's TaskGroup."""

    def __init__(self, store: RevisionStore, *, clock: Clock = SYSTEM_CLOCK) -> None:
        """`clock` bounds `close()`."""
        self._store = store
        self._locks: KeyedLocks[Scope] = KeyedLocks()
        self._running: dict[Scope, _Running] = {}
        self._owner = TaskOwner("the relay job runner", clock=clock)

    # --- lifecycle ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Own the jobs' tasks until `close()`; then cancel and await them (`agent.owner`)."""
        await self._owner.run(self._report_unfinished)

    async def started(self) -> None:
        """Wait until `run()` takes work."""
        await self._owner.started()

    async def close(self, timeout: float = 10.0) -> None:  # noqa: ASYNC109  # a shutdown bound
        """Stop taking work, cancel the running jobs, wait at most `timeout` s for `run()`."""
        await self._owner.close(timeout)

    # --- the request rule ---------------------------------------------------------------------

    async def submit(
        self, key: JobKey, digest: str, start: Callable[[], Awaitable[Work]]
    ) -> dict[str, Any]:
        """The request's response: recorded, joined, or from work started now (module
        docstring). A restore's `key` has run 0: a run that starts is numbered by the store."""
        async with self._locks.hold(key.scope):
            running = self._live(key.scope)
            stored: StoredJob | None = None
            if key.kind == "restore":
                if running is None:
                    await self._settle_interrupted(key)
                meets = restore_meets(
                    running=running is not None,
                    same_body=running is not None
                    and (running.key.backup_id, running.digest) == (key.backup_id, digest),
                )
            else:
                stored = await self._store.get_job(key)
                meets = backup_meets(
                    None if stored is None else stored.status,
                    same_body=stored is not None and stored.request_digest == digest,
                    here=running is not None,
                )
            verdict = answer(key.kind, meets)
            if verdict is Answer.CONFLICT:
                raise JobConflict(
                    kind=key.kind,
                    backup_id=key.backup_id,
                    service_id=key.service_id,
                    node_id=key.node_id,
                )
            if verdict is Answer.BUSY:
                assert running is not None
                raise RestoreInProgress(
                    service_id=key.service_id,
                    node_id=key.node_id,
                    backup_id=running.key.backup_id,
                    run=running.key.run,
                )
            if verdict is Answer.RECORDED:
                assert stored is not None
                assert stored.result is not None
                _log.info("relay_job_replayed", **_fields(key), revision=stored.revision)
                return dict(stored.result["response"])
            if verdict is Answer.JOIN:
                assert running is not None
                _log.info("relay_job_joined", **_fields(running.key))
                outcome = running.outcome
            else:
                self._owner.check()
                work = await start()
                self._owner.check()
                stored = await self._move_to_running(key, stored, digest, _OPS[verdict])
                outcome = self._spawn(stored, work)
        return await asyncio.shield(outcome)

    async def _move_to_running(
        self, key: JobKey, stored: StoredJob | None, digest: str, op: JobOp
    ) -> StoredJob:
        expected = 0 if stored is None else stored.revision
        moved = await self._store.move_job(key, op=op, expected_revision=expected, digest=digest)
        _log.info("relay_job_started", **_fields(moved.key), op=op.value, attempt=moved.attempts)
        return moved

    async def _settle_interrupted(self, key: JobKey) -> None:
        """Record the restore of `key`'s service the store holds `running` as interrupted, if
        no work of this process runs it (call under the scope's lock)."""
        if self._live(key.scope) is not None:
            return
        stored = await self._store.running_restore(key.cluster_id, key.node_id, key.service_id)
        if stored is None:
            return
        await self._store.move_job(
            stored.key,
            op=JobOp.FAIL,
            expected_revision=stored.revision,
            digest=stored.request_digest,
            result=INTERRUPTED,
        )
        _log.warning("relay_restore_interrupted", **_fields(stored.key), attempts=stored.attempts)

    def _live(self, scope: Scope) -> _Running | None:
        """The work of `scope` running in this process; work whose outcome is out (its task is
        just ending) no longer counts: a request then meets what it recorded."""
        running = self._running.get(scope)
        return None if running is None or running.outcome.done() else running

    # --- the tasks ----------------------------------------------------------------------------

    def _spawn(self, stored: StoredJob, work: Work) -> asyncio.Future[dict[str, Any]]:
        outcome: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        # Retrieve the outcome here too: a job whose callers all left must not warn.
        outcome.add_done_callback(lambda done: done.cancelled() or done.exception())
        key, scope = stored.key, stored.key.scope
        task = self._owner.spawn(self._guarded(stored, work, outcome), name=f"relay-{key.kind}")
        running = _Running(key, stored.request_digest, outcome)
        self._running[scope] = running

        def forget(done: asyncio.Task[None]) -> None:
            if self._running.get(scope) is running:
                del self._running[scope]

        task.add_done_callback(forget)
        return outcome

    async def _guarded(
        self, stored: StoredJob, work: Work, outcome: asyncio.Future[dict[str, Any]]
    ) -> None:
        """`_execute`, and a bug of the runner's own (recording an outcome) fails this job,
        `internal`: its callers are answered, and the owner's TaskGroup (the daemon) goes on."""
        try:
            await self._execute(stored, work, outcome)
        except Exception:  # noqa: BLE001  # logged with its traceback; the job fails alone
            _log.exception("relay_job_crashed", **_fields(stored.key))
            if not outcome.done():
                outcome.set_exception(
                    AgentError(f"the relay {stored.key.kind} failed unexpectedly; send it again")
                )

    async def _execute(
        self, stored: StoredJob, work: Work, outcome: asyncio.Future[dict[str, Any]]
    ) -> None:
        key = stored.key
        try:
            response, report = await work(key)
        except asyncio.CancelledError:
            again = "resume" if key.kind == "backup" else "restore anew"
            outcome.set_exception(
                ShuttingDown(f"the agent stopped while the job ran; repeat the request to {again}")
            )
            raise
        except Exception as exc:  # noqa: BLE001  # recorded; a bug is logged with its traceback
            error = (
                exc
                if isinstance(exc, AgentError)
                else AgentError(f"the relay {key.kind} failed unexpectedly ({type(exc).__name__})")
            )
            if error is not exc:
                _log.exception("relay_job_crashed", **_fields(key))
            else:
                _log.warning("relay_job_failed", **_fields(key), code=error.code, error=str(error))
            recorded = {
                "error": {
                    "code": error.code,
                    "message": error.message,
                    "retryable": error.retryable,
                }
            }
            await self._record(stored, JobOp.FAIL, recorded, outcome)
            if not outcome.done():
                outcome.set_exception(error)
            return
        recorded = {"response": response, "report": report}
        if await self._record(stored, JobOp.SUCCEED, recorded, outcome):
            _log.info("relay_job_succeeded", **_fields(key), **report)
            outcome.set_result(response)

    async def _record(
        self,
        stored: StoredJob,
        op: JobOp,
        result: dict[str, Any],
        outcome: asyncio.Future[dict[str, Any]],
    ) -> bool:
        try:
            await self._store.move_job(
                stored.key,
                op=op,
                expected_revision=stored.revision,
                digest=stored.request_digest,
                result=result,
            )
        except AgentError as exc:
            _log.error("relay_job_unrecorded", **_fields(stored.key), code=exc.code)
            outcome.set_exception(exc)
            return False
        return True

    async def _report_unfinished(self) -> None:
        """At start-up: log the backups a previous process left `running` (they resume on
        Cloudly's repeat) and record its restores left `running` as interrupted."""
        try:
            unfinished = await self._store.list_jobs("running")
        except AgentError as exc:
            _log.warning("relay_jobs_unreadable", code=exc.code)
            return
        for stored in unfinished:
            key = stored.key
            if key.kind == "backup":
                _log.info("relay_job_unfinished", **_fields(key), attempts=stored.attempts)
                continue
            try:
                async with self._locks.hold(key.scope):
                    await self._settle_interrupted(key)
            except AgentError as exc:  # a request settles it when it comes
                _log.warning("relay_restore_unsettled", **_fields(key), code=exc.code)


def _fields(key: JobKey) -> dict[str, str | int]:
    fields: dict[str, str | int] = {
        "kind": key.kind,
        "node": key.node_id,
        "backup_id": key.backup_id,
        "service_id": key.service_id,
    }
    if key.kind == "restore" and key.run:
        fields["run"] = key.run
    return fields
