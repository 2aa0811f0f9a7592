"""`WorkOwner`: the isolated-restore engine's background tasks and per-restore locks.

The engine has one (`IsolatedRestoreEngine.owner`); it is the engine's lifecycle:

- `run()` owns every background task in one `asyncio.TaskGroup` (`agent.owner.TaskOwner`); its
  caller runs it as a task of its own TaskGroup (`await engine.owner.run()`), waits for
  `started()` before sending requests, and stops it with `close(timeout)`: no more work is
  taken, the running tasks are cancelled and awaited, and `run()` returns. There is no other
  way to run the engine, so one owner (the caller's TaskGroup) sees its end. At start it logs
  the states a previous run left in flight (`restore_unfinished`).
- `check()` refuses work (`ShuttingDown`) unless it can be started now; `spawn(key, work)`
  runs one background task per restore key (`agent.owner.KeyedTasks`): a crash of one is
  logged with its traceback (`restore_work_crashed`) and does not stop the others (its state
  stays in flight, resumable); `working(key)` says whether one runs.
- `hold(key)`: mutating requests of one restore run one at a time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Coroutine
from typing import Any

import structlog

from agent.clock import SYSTEM_CLOCK, Clock
from agent.domain.restores import RestoreKey
from agent.locks import KeyedLocks
from agent.owner import KeyedTasks, TaskOwner
from agent.store import RevisionStore

__all__ = ["WorkOwner"]

_log = structlog.get_logger("agent.restore.background")


class WorkOwner:
    """Owns the background work on restores and the per-restore locks."""

    def __init__(self, store: RevisionStore, *, clock: Clock = SYSTEM_CLOCK) -> None:
        """`clock` bounds `close()`."""
        self._store = store
        self._locks: KeyedLocks[RestoreKey] = KeyedLocks()
        self._tasks = TaskOwner("the isolated-restore engine", clock=clock)
        self._work: KeyedTasks[RestoreKey, None] = KeyedTasks(
            self._tasks, log=_log, crashed="restore_work_crashed"
        )

    # --- lifecycle ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Own the background work until `close()`; then cancel and await it (`agent.owner`).

        Run it as a task of the caller's TaskGroup; it returns once `close()` was called and
        every piece of work ended.
        """
        await self._tasks.run(self._report_unfinished)

    async def started(self) -> None:
        """Wait until `run()` takes work (requests before that are refused `shutting-down`)."""
        await self._tasks.started()

    async def close(self, timeout: float = 10.0) -> None:  # noqa: ASYNC109  # a shutdown bound
        """Stop taking work, cancel the running work, wait at most `timeout` s for `run()` to end.

        A `run()` that overruns the bound (work that ignores its cancellation) is cancelled
        itself, and waited for.
        """
        await self._tasks.close(timeout)

    # --- background work ----------------------------------------------------------------------

    def check(self) -> None:
        """`ShuttingDown` unless background work can be started now."""
        self._tasks.check()

    def working(self, key: RestoreKey) -> bool:
        """Whether background work on `key` is running."""
        return key in self._work

    def spawn(
        self, key: RestoreKey, work: Coroutine[Any, Any, None], fields: dict[str, str]
    ) -> None:
        """Run `work` as the background task of `key` (the caller checked none runs); `fields`
        name it in the log."""
        # A crash leaves the restore's state in flight: visible in status, resumable by a replay.
        _ = self._work.spawn(key, None, work, name=f"restore-{key.restore_id}", fields=fields)

    def ended(self, key: RestoreKey) -> None:
        """The running task, the work of `key`, wrote the status it ends in: `key` is free for
        new work from now (the task returns a step later and writes nothing more)."""
        self._work.release(key)

    def hold(self, key: RestoreKey) -> contextlib.AbstractAsyncContextManager[None]:
        """One holder of `key` at a time (see `agent.locks`)."""
        return self._locks.hold(key)

    async def _report_unfinished(self) -> None:
        """Log the states a previous run left in flight (they resume on Cloudly's replay)."""
        try:
            unfinished = await self._store.list_unfinished()
        except Exception as exc:  # noqa: BLE001  # a report, not a precondition
            _log.warning("restore_unfinished_unreadable", error=type(exc).__name__)
            return
        for stored in unfinished:
            _log.info(
                "restore_unfinished",
                restore_id=stored.key.restore_id,
                node=stored.key.node_name,
                status=stored.status,
                revision=stored.revision,
            )
