"""`JobRunner`: durable, replay-safe relay jobs and the one owner of their tasks.

`submit(key, digest, start)` is the whole replay rule (docs/relay.md, "Replay"):

- another request body already owns `key`: `JobConflict` (nothing changes);
- the job `succeeded`: its recorded response, at once;
- its work runs in this process: the caller joins it (awaits the same outcome);
- otherwise `start()` runs first (checks that refuse before anything is stored, and that may
  ask Corestore), then the job row moves (`start`, `resume` after a restart, `retry` after a
  failure; `agent.relay.machine`) and the work starts as a task of `run()`'s TaskGroup.

Mutating steps of one key run under a per-key lock, so two requests never start two jobs of one
key. The work belongs to the runner, not to the request: a caller that goes away (its session
dropped) leaves the work running, and the repeated request joins it. `close()` cancels the work;
its row stays `running` and the next identical request after the restart resumes it. A job's
outcome is recorded before any caller sees it: `succeed` with `{"response", "report"}`, `fail`
with `{"error": {code, message, retryable}}`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from agent.errors import AgentError, JobConflict, ShuttingDown
from agent.locks import KeyedLocks
from agent.owner import TaskOwner
from agent.relay.machine import JobOp
from agent.store import JobKey, RevisionStore, StoredJob

__all__ = ["JobRunner", "Outcome", "Work"]

_log = structlog.get_logger("agent.relay.jobs")

Outcome = tuple[dict[str, Any], dict[str, Any]]
"""What a job's work returns: the response's wire dict and the report recorded next to it."""

Work = Callable[[], Awaitable[Outcome]]


class JobRunner:
    """Runs relay jobs for the relay service; run it in the caller's TaskGroup."""

    def __init__(self, store: RevisionStore) -> None:
        self._store = store
        self._locks: KeyedLocks[JobKey] = KeyedLocks()
        self._running: dict[JobKey, asyncio.Future[dict[str, Any]]] = {}
        self._owner = TaskOwner("the relay job runner")

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

    def working(self, key: JobKey) -> bool:
        """Whether the work of `key` runs in this process."""
        return key in self._running

    # --- the replay rule ----------------------------------------------------------------------

    async def submit(
        self, key: JobKey, digest: str, start: Callable[[], Awaitable[Work]]
    ) -> dict[str, Any]:
        """The job's response: recorded, joined, or from work started now (module docstring)."""
        async with self._key_lock(key):
            stored = await self._store.get_job(key)
            if stored is not None and stored.request_digest != digest:
                raise JobConflict(
                    kind=key.kind,
                    backup_id=key.backup_id,
                    service_id=key.service_id,
                    node_id=key.node_id,
                )
            if stored is not None and stored.status == "succeeded":
                assert stored.result is not None
                _log.info("relay_job_replayed", **_fields(key), revision=stored.revision)
                return dict(stored.result["response"])
            outcome = self._running.get(key)
            if outcome is None:
                self._owner.check()
                work = await start()
                self._owner.check()
                stored = await self._move_to_running(key, stored, digest)
                outcome = self._spawn(stored, work)
            else:
                _log.info("relay_job_joined", **_fields(key))
        return await asyncio.shield(outcome)

    async def _move_to_running(
        self, key: JobKey, stored: StoredJob | None, digest: str
    ) -> StoredJob:
        if stored is None:
            op, expected = JobOp.START, 0
        else:
            op = JobOp.RESUME if stored.status == "running" else JobOp.RETRY
            expected = stored.revision
        moved = await self._store.move_job(key, op=op, expected_revision=expected, digest=digest)
        _log.info("relay_job_started", **_fields(key), op=op.value, attempt=moved.attempts)
        return moved

    # --- the tasks ----------------------------------------------------------------------------

    def _spawn(self, stored: StoredJob, work: Work) -> asyncio.Future[dict[str, Any]]:
        outcome: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        # Retrieve the outcome here too: a job whose callers all left must not warn.
        outcome.add_done_callback(lambda done: done.cancelled() or done.exception())
        key = stored.key
        task = self._owner.spawn(self._execute(stored, work, outcome), name=f"relay-{key.kind}")
        self._running[key] = outcome

        def forget(done: asyncio.Task[None]) -> None:
            if self._running.get(key) is outcome:
                del self._running[key]

        task.add_done_callback(forget)
        return outcome

    async def _execute(
        self, stored: StoredJob, work: Work, outcome: asyncio.Future[dict[str, Any]]
    ) -> None:
        key = stored.key
        try:
            response, report = await work()
        except asyncio.CancelledError:
            outcome.set_exception(
                ShuttingDown("the agent stopped while the job ran; repeat the request to resume")
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
        """Log the jobs a previous run left `running` (they resume on Cloudly's replay)."""
        try:
            unfinished = await self._store.list_jobs("running")
        except AgentError as exc:
            _log.warning("relay_jobs_unreadable", code=exc.code)
            return
        for stored in unfinished:
            _log.info("relay_job_unfinished", **_fields(stored.key), attempts=stored.attempts)

    def _key_lock(self, key: JobKey) -> contextlib.AbstractAsyncContextManager[None]:
        """One holder of `key` at a time (see `agent.locks`)."""
        return self._locks.hold(key)


def _fields(key: JobKey) -> dict[str, str]:
    return {
        "kind": key.kind,
        "node": key.node_id,
        "backup_id": key.backup_id,
        "service_id": key.service_id,
    }
