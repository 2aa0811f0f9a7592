"""`WorkOwner`: the engine's task ownership, per-restore locks and change notifications.

The isolated-restore engine (`engine.py`) inherits this; it is split out so the request logic
reads on its own. What lives here:

- `run()` owns every background task in one `asyncio.TaskGroup`; its caller runs it as a task of
  its own TaskGroup (`await engine.run()`), waits for `started()` before sending requests, and
  stops it with `close(timeout)`: no more work is taken, the running tasks are cancelled and
  awaited, and `run()` returns. There is no other way to run the engine, so one owner (the
  caller's TaskGroup) sees its end. `running(engine)` is that pattern as an async context
  manager, for a composition root that holds its resources on an exit stack.
- `_spawn(key, coroutine)`: one background task per restore key; a crash of one is logged with
  its traceback and does not stop the others (its state stays in flight, resumable).
- `_key_lock(key)`: mutating requests of one restore run one at a time.
- `observe()`, `wait_for()`, `settled()`: who wants to know when a state changed (tests, the
  crash-test harness, a status page) waits on these instead of polling.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, TypeVar

import structlog

from agent.domain.restores import RestoreKey, StoredState
from agent.errors import ShuttingDown
from agent.locks import KeyedLocks
from agent.owner import TaskOwner
from agent.store import RevisionStore

__all__ = ["Observer", "WorkOwner", "running"]

_log = structlog.get_logger("agent.restore.engine")
Observer = Callable[[StoredState], None]
_Owner = TypeVar("_Owner", bound="WorkOwner")


class WorkOwner:
    """Owns the background work on restores and tells observers about every mutation."""

    def __init__(self, store: RevisionStore) -> None:
        self._store = store
        self._locks: KeyedLocks[RestoreKey] = KeyedLocks()
        self._work: dict[RestoreKey, asyncio.Task[None]] = {}
        self._observers: list[Observer] = []
        self._owner = TaskOwner("the isolated-restore engine")

    # --- lifecycle ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Own the background work until `close()`; then cancel and await it (`agent.owner`).

        Run it as a task of the caller's TaskGroup; it returns once `close()` was called and
        every piece of work ended.
        """
        await self._owner.run(self._report_unfinished)

    async def started(self) -> None:
        """Wait until `run()` takes work (requests before that are refused `shutting-down`)."""
        await self._owner.started()

    async def close(self, timeout: float = 10.0) -> None:  # noqa: ASYNC109  # a shutdown bound
        """Stop taking work, cancel the running work, wait at most `timeout` s for `run()` to end.

        A `run()` that overruns the bound (work that ignores its cancellation) is cancelled
        itself, and waited for.
        """
        await self._owner.close(timeout)

    # --- observation --------------------------------------------------------------------------

    def observe(self, observer: Observer) -> Callable[[], None]:
        """Call `observer(stored)` synchronously after every mutation; returns the remover."""
        self._observers.append(observer)
        return lambda: self._observers.remove(observer)

    def working(self, key: RestoreKey) -> bool:
        """Whether background work on `key` is running."""
        return key in self._work

    async def settled(self, key: RestoreKey) -> None:
        """Wait until no background work runs on `key` (at once if none does)."""
        while (task := self._work.get(key)) is not None:
            await asyncio.wait({task})

    async def wait_for(
        self, key: RestoreKey, predicate: Callable[[StoredState], bool]
    ) -> StoredState:
        """The first state of `key`, the current one included, that satisfies `predicate`."""
        found: asyncio.Future[StoredState] = asyncio.get_running_loop().create_future()

        def check(stored: StoredState) -> None:
            if stored.key == key and not found.done() and predicate(stored):
                found.set_result(stored)

        remove = self.observe(check)
        try:
            current = await self._store.get(key)
            if current is not None:
                check(current)
            return await found
        finally:
            remove()

    def _notify(self, stored: StoredState) -> None:
        for observer in list(self._observers):
            observer(stored)

    # --- background work ----------------------------------------------------------------------

    def _check_running(self) -> None:
        """`ShuttingDown` unless background work can be started now."""
        self._owner.check()

    def _spawn(
        self, key: RestoreKey, work: Coroutine[Any, Any, None], fields: dict[str, str]
    ) -> None:
        """Run `work` as the background task of `key` (the caller checked none runs)."""
        try:
            self._owner.check()
        except ShuttingDown:
            work.close()
            raise
        task = self._owner.spawn(self._guarded(work, fields), name=f"restore-{key.restore_id}")
        self._work[key] = task

        def forget(done: asyncio.Task[None]) -> None:
            if self._work.get(key) is done:
                del self._work[key]

        task.add_done_callback(forget)

    async def _guarded(self, work: Coroutine[Any, Any, None], fields: dict[str, str]) -> None:
        try:
            await work
        except Exception:  # noqa: BLE001  # logged with its traceback, see below
            # A bug in one restore's work must not stop the others: its state stays in flight
            # (visible in status, resumable by a replay) and the traceback is logged.
            _log.exception("restore_work_crashed", **fields)

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

    def _key_lock(self, key: RestoreKey) -> contextlib.AbstractAsyncContextManager[None]:
        """One holder of `key` at a time (see `agent.locks`)."""
        return self._locks.hold(key)


@contextlib.asynccontextmanager
async def running(owner: _Owner) -> AsyncIterator[_Owner]:
    """`owner.run()` in a TaskGroup of its own while the block runs; closed when it ends.

    Enter and leave it in one task (an exit stack the composition root closes itself): the
    TaskGroup is the engine's one owner, and a crash of `run()` reaches that task.
    """
    async with asyncio.TaskGroup() as group:
        group.create_task(owner.run(), name="isolated-restore-engine")
        await owner.started()
        try:
            yield owner
        finally:
            await owner.close()
