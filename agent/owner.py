"""`TaskOwner`: the one TaskGroup that owns a component's background tasks.

The isolated-restore engine and the relay's job runner both start work that outlives the request
that asked for it. Each holds a `TaskOwner` and follows one lifecycle:

- `run(on_start)` runs once, as a task of the caller's TaskGroup: it opens the group, awaits
  `on_start()` (a report of what a previous run left unfinished), then waits for `close()`,
  cancels every task it spawned and returns when they all ended;
- `started()` waits until work can be taken; `check()` raises `ShuttingDown` when it cannot
  (not started yet, or closing), so a request is refused before anything is stored;
- `spawn(coroutine, name=...)` runs one piece of work in the group;
- `close(timeout)` stops taking work and waits at most `timeout` seconds of its `Clock` for
  `run()` to end; a `run()` that overruns (work that ignores its cancellation) is cancelled
  itself, and awaited as long again; one that outlives that too is left behind, logged
  (`task_owner_abandoned`): `close()` returns within twice its bound, whatever the work does.

`KeyedTasks` is the keyed side of one: at most one task per key (a restore, a relay job's
scope), each with the value its component asks of the work under that key, and a crash of one
contained: logged with its traceback under the component's own event, the key's `on_crash`
told, the others and the owner's TaskGroup (the daemon) going on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import structlog

from agent.clock import SYSTEM_CLOCK, Clock
from agent.errors import InvalidState, ShuttingDown

__all__ = ["KeyedTasks", "TaskOwner"]

_log = structlog.get_logger("agent.owner")


class TaskOwner:
    """Owns the background tasks of the component named `what` (it appears in refusals)."""

    def __init__(self, what: str, *, clock: Clock = SYSTEM_CLOCK) -> None:
        """`clock` bounds `close()`."""
        self._what = what
        self._clock = clock
        self._group: asyncio.TaskGroup | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._run_task: asyncio.Task[None] | None = None
        self._started = asyncio.Event()
        self._closing = asyncio.Event()
        self._stopped = asyncio.Event()

    async def run(self, on_start: Callable[[], Awaitable[None]]) -> None:
        """Own the tasks until `close()`; then cancel and await them."""
        if self._started.is_set():
            raise InvalidState(f"{self._what} may run once")
        self._run_task = asyncio.current_task()
        try:
            async with asyncio.TaskGroup() as group:
                self._group = group
                self._started.set()
                await on_start()
                await self._closing.wait()
                self._group = None
                for task in list(self._tasks):
                    task.cancel()
        finally:
            self._group = None
            self._stopped.set()

    async def started(self) -> None:
        """Wait until `run()` takes work."""
        await self._started.wait()

    async def close(self, timeout: float) -> None:  # noqa: ASYNC109  # a shutdown bound
        """Stop taking work, cancel the running tasks, wait at most `timeout` s for `run()` (and
        as long again for a `run()` cut off for overrunning)."""
        self._closing.set()
        if not self._started.is_set():
            return
        try:
            async with self._clock.timeout(timeout):
                await self._stopped.wait()
        except TimeoutError:
            _log.error("task_owner_close_overran", owner=self._what, timeout_s=timeout)
            if self._run_task is not None:
                self._run_task.cancel()
            # `run()` ignoring its own cancellation too (work that swallows every one) must not
            # hold the daemon's shutdown forever: the second wait has the same bound.
            try:
                async with self._clock.timeout(timeout):
                    await self._stopped.wait()
            except TimeoutError:
                _log.error("task_owner_abandoned", owner=self._what, timeout_s=timeout)

    def check(self) -> None:
        """`ShuttingDown` unless work can be started now."""
        if self._group is None or self._closing.is_set():
            raise ShuttingDown(f"{self._what} is not running")

    def spawn(self, work: Coroutine[Any, Any, None], *, name: str) -> asyncio.Task[None]:
        """Run `work` as a task of the group (`ShuttingDown`, and `work` closed, if it cannot)."""
        group = self._group
        if group is None or self._closing.is_set():
            work.close()
            raise ShuttingDown(f"{self._what} is not running")
        task = group.create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task


K = TypeVar("K")
V = TypeVar("V")


class CrashLog(Protocol):
    """Where a crash is logged: the component's own logger (its name stays in the record)."""

    def exception(self, event: str, **fields: Any) -> Any:
        """Log `event` with the traceback of the exception being handled."""
        ...


def _nothing() -> None:
    return None


@dataclass(frozen=True, slots=True)
class _Entry(Generic[V]):
    """The task running under a key, and the value it carries."""

    task: asyncio.Task[None]
    value: V


class KeyedTasks(Generic[K, V]):
    """One task per key in `owner`'s group, each carrying a value; a crash is logged to `log`
    as `crashed` and goes no further."""

    def __init__(self, owner: TaskOwner, *, log: CrashLog, crashed: str) -> None:
        self._owner = owner
        self._log = log
        self._crashed = crashed
        self._entries: dict[K, _Entry[V]] = {}

    def __contains__(self, key: K) -> bool:
        """Whether a task runs under `key`."""
        return key in self._entries

    def get(self, key: K) -> V | None:
        """The value of the task running under `key`, if one does."""
        entry = self._entries.get(key)
        return None if entry is None else entry.value

    def spawn(
        self,
        key: K,
        value: V,
        work: Coroutine[Any, Any, None],
        *,
        name: str,
        fields: Mapping[str, object],
        on_crash: Callable[[], None] = _nothing,
    ) -> asyncio.Task[None]:
        """Run `work` as the task of `key` carrying `value` (`ShuttingDown`, and `work` closed,
        if the owner takes no work); it replaces what `key` held. `fields` name it in the log
        of a crash, after which `on_crash()` runs."""
        try:
            self._owner.check()
        except ShuttingDown:
            work.close()  # it never runs: no "never awaited" warning follows
            raise
        task = self._owner.spawn(self._contained(work, fields, on_crash), name=name)
        self._entries[key] = _Entry(task, value)

        def forget(done: asyncio.Task[None]) -> None:
            # A task cancelled before its first step never awaited `work`: closed, it warns of
            # nothing (one that ran has ended it already, and this changes nothing).
            work.close()
            entry = self._entries.get(key)
            if entry is not None and entry.task is done:
                del self._entries[key]

        task.add_done_callback(forget)
        return task

    def release(self, key: K) -> None:
        """The running task, the one of `key`, is done with it: `key` is free from now (the
        task returns a step later and does nothing more under it)."""
        entry = self._entries.get(key)
        if entry is not None and entry.task is asyncio.current_task():
            del self._entries[key]

    async def _contained(
        self,
        work: Coroutine[Any, Any, None],
        fields: Mapping[str, object],
        on_crash: Callable[[], None],
    ) -> None:
        try:
            await work
        except Exception:  # noqa: BLE001  # logged with its traceback, see below
            # A bug in one key's work must not stop the others, nor the owner's TaskGroup (and
            # the daemon with it): it is logged with its traceback, and its component told.
            self._log.exception(self._crashed, **fields)
            on_crash()
