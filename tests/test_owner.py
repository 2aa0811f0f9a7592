"""TaskOwner: run once, refuse work outside its run, close cancels its tasks within a bound.
KeyedTasks: one task per key with its value, freed when it ends, a crash contained."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agent.errors import InvalidState, ShuttingDown
from agent.owner import KeyedTasks, TaskOwner
from tests.clock import ManualClock


async def _nothing() -> None:
    return None


async def test_work_is_refused_before_the_owner_runs() -> None:
    """`check()` and `spawn()` say `ShuttingDown` naming the component; the work is closed."""
    owner = TaskOwner("the test component")
    work = asyncio.sleep(1)
    with pytest.raises(ShuttingDown, match="the test component is not running"):
        owner.spawn(work, name="w")
    with pytest.raises(RuntimeError, match="cannot reuse already awaited coroutine"):
        await work  # closed: it can never run, and no "never awaited" warning follows
    with pytest.raises(ShuttingDown):
        owner.check()


async def test_close_cancels_the_running_tasks_and_run_returns() -> None:
    """A spawned task is cancelled by `close()`; `run()` then ends without an error."""
    owner = TaskOwner("the test component")
    async with asyncio.TaskGroup() as group:
        run = group.create_task(owner.run(_nothing))
        await owner.started()
        owner.check()
        task = owner.spawn(asyncio.Event().wait(), name="forever")
        await owner.close(timeout=5)
    assert task.cancelled()
    assert run.result() is None


async def test_after_close_no_work_is_taken() -> None:
    """Once closing, `check()` and `spawn()` refuse, even while `run()` is still winding down."""
    owner = TaskOwner("the test component")
    async with asyncio.TaskGroup() as group:
        group.create_task(owner.run(_nothing))
        await owner.started()
        await owner.close(timeout=5)
        with pytest.raises(ShuttingDown):
            owner.spawn(_nothing(), name="late")


async def test_an_owner_runs_once() -> None:
    """A second `run()` is an `InvalidState`."""
    owner = TaskOwner("the test component")
    async with asyncio.TaskGroup() as group:
        group.create_task(owner.run(_nothing))
        await owner.started()
        with pytest.raises(InvalidState, match="may run once"):
            await owner.run(_nothing)
        await owner.close(timeout=5)


async def test_work_that_ignores_cancellation_is_cut_off_at_the_bound() -> None:
    """A task that swallows its cancellation keeps `run()` from ending: after `timeout`,
    `close()` cancels `run()` itself and returns once it ended."""
    owner = TaskOwner("the test component")
    swallowed: list[int] = []
    waiting = asyncio.Event()

    async def stubborn() -> None:
        waiting.set()
        # The bug this bound exists for: the owner's cancellation is swallowed; the second one
        # (from `run()`'s own TaskGroup, once `run()` is cancelled) is obeyed.
        while len(swallowed) < 2:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                swallowed.append(1)

    run = asyncio.create_task(owner.run(_nothing))
    await owner.started()
    owner.spawn(stubborn(), name="stubborn")
    await waiting.wait()
    await owner.close(timeout=0.05)
    assert run.cancelled()
    assert len(swallowed) == 2


async def test_the_close_bound_runs_on_the_owners_clock() -> None:
    """With a hand-moved clock, `close(timeout)` waits for that clock to pass the bound, not
    for real time: it cuts off stubborn work only once the clock is moved past it."""
    clock = ManualClock()
    owner = TaskOwner("the test component", clock=clock)
    waiting = asyncio.Event()

    async def stubborn() -> None:
        waiting.set()
        with contextlib.suppress(asyncio.CancelledError):  # the owner's cancellation, swallowed
            await asyncio.Event().wait()
        await asyncio.Event().wait()  # the second one (`run()` cut off) is obeyed

    run = asyncio.create_task(owner.run(_nothing))
    await owner.started()
    owner.spawn(stubborn(), name="stubborn")
    await waiting.wait()
    closing = asyncio.create_task(owner.close(timeout=60))
    await asyncio.sleep(0)
    assert clock.timeouts == [60.0]
    clock.advance(59)
    await asyncio.sleep(0)
    assert not closing.done()
    clock.advance(1)
    async with asyncio.timeout(5):  # a guard against a hang, not a synchronisation
        await closing
    assert run.cancelled()


async def test_close_returns_within_twice_its_bound_even_if_run_ignores_its_own_cancellation() -> (
    None
):
    """Work that swallows every cancellation keeps `run()` alive after it was cut off too:
    `close(timeout)` gives that second wait the same bound on the owner's clock and returns,
    saying so in the log, instead of waiting forever (the daemon's shutdown must end)."""
    clock = ManualClock()
    owner = TaskOwner("the test component", clock=clock)
    waiting, release = asyncio.Event(), asyncio.Event()

    async def deaf() -> None:
        waiting.set()
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):  # every cancellation, swallowed
                await release.wait()

    run = asyncio.create_task(owner.run(_nothing))
    closing: asyncio.Task[None] | None = None
    try:
        await owner.started()
        owner.spawn(deaf(), name="deaf")
        await waiting.wait()
        closing = asyncio.create_task(owner.close(timeout=60))
        await asyncio.sleep(0)
        clock.advance(60)  # the first bound: run() is cancelled, and ignores it through its task
        for _ in range(5):
            await asyncio.sleep(0)
        assert not closing.done()
        assert clock.timeouts == [120.0]
        clock.advance(60)
        async with asyncio.timeout(5):  # a guard against the hang this test is about
            await closing
        assert not run.done()
    finally:
        release.set()  # the deaf work ends, whatever the test found
        if closing is not None:
            closing.cancel()
        await asyncio.wait({run, *([closing] if closing else [])})


async def _until(event: asyncio.Event) -> None:
    await event.wait()


class _Log:
    """A component's logger: the crashes it was told of (event, fields, the exception)."""

    def __init__(self) -> None:
        self.crashes: list[tuple[str, dict[str, Any], BaseException | None]] = []

    def exception(self, event: str, **fields: Any) -> None:
        self.crashes.append((event, fields, sys.exc_info()[1]))


@contextlib.asynccontextmanager
async def _keyed(log: _Log | None = None) -> AsyncIterator[tuple[TaskOwner, KeyedTasks[str, int]]]:
    """A running owner and its keyed tasks; closed on the way out."""
    owner = TaskOwner("the test component")
    tasks: KeyedTasks[str, int] = KeyedTasks(owner, log=log or _Log(), crashed="test_crashed")
    async with asyncio.TaskGroup() as group:
        run = group.create_task(owner.run(_nothing))
        await owner.started()
        try:
            yield owner, tasks
        finally:
            await owner.close(timeout=5)
    assert run.result() is None


async def test_a_keyed_task_carries_its_value_while_it_runs() -> None:
    """`get(key)` is the value spawned with the key's task, `key in tasks` says one runs."""
    release = asyncio.Event()
    async with _keyed() as (_, tasks):
        tasks.spawn("a", 7, _until(release), name="a", fields={})
        assert tasks.get("a") == 7
        assert "a" in tasks
        assert tasks.get("b") is None
        assert "b" not in tasks
        release.set()


async def test_a_key_is_free_once_its_task_ended() -> None:
    """The key's entry goes with its task."""
    async with _keyed() as (_, tasks):
        task = tasks.spawn("a", 1, _nothing(), name="a", fields={})
        await task
        assert "a" not in tasks


async def test_a_task_ending_does_not_free_the_key_a_later_task_holds() -> None:
    """Work spawned again under the key replaces the entry; the first task's end leaves it."""
    first_done, release = asyncio.Event(), asyncio.Event()

    async def first() -> None:
        await first_done.wait()

    async with _keyed() as (_, tasks):
        old = tasks.spawn("a", 1, first(), name="first", fields={})
        tasks.spawn("a", 2, _until(release), name="second", fields={})
        first_done.set()
        await old
        assert tasks.get("a") == 2
        release.set()


async def test_release_frees_the_key_from_inside_its_own_task() -> None:
    """The key's task says it is done with the key: free at once, before the task returns."""
    seen: list[bool] = []
    async with _keyed() as (_, tasks):

        async def work() -> None:
            tasks.release("a")
            seen.append("a" in tasks)

        await tasks.spawn("a", 1, work(), name="a", fields={})
    assert seen == [False]


async def test_release_from_another_task_changes_nothing() -> None:
    """Only the key's own task frees it early."""
    release = asyncio.Event()
    async with _keyed() as (_, tasks):
        tasks.spawn("a", 1, _until(release), name="a", fields={})
        tasks.release("a")
        assert "a" in tasks
        release.set()


async def test_a_crash_is_logged_told_and_contained() -> None:
    """A bug in one key's work is logged under the component's event with its fields and the
    exception, `on_crash` runs, and the owner's group goes on taking work."""
    log, told = _Log(), []

    async def buggy() -> None:
        raise RuntimeError("a bug")

    async with _keyed(log) as (owner, tasks):
        await tasks.spawn(
            "a", 1, buggy(), name="a", fields={"key": "a"}, on_crash=lambda: told.append(1)
        )
        owner.check()
        await tasks.spawn("b", 2, _nothing(), name="b", fields={})
    assert [(event, fields) for event, fields, _ in log.crashes] == [("test_crashed", {"key": "a"})]
    assert isinstance(log.crashes[0][2], RuntimeError)
    assert told == [1]


async def test_keyed_work_is_refused_and_closed_when_the_owner_takes_none() -> None:
    """Before the owner runs, `spawn` says `ShuttingDown`, closes the work and keeps no entry."""
    tasks: KeyedTasks[str, int] = KeyedTasks(
        TaskOwner("the test component"), log=_Log(), crashed="test_crashed"
    )
    work = asyncio.sleep(1)
    with pytest.raises(ShuttingDown):
        tasks.spawn("a", 1, work, name="a", fields={})
    with pytest.raises(RuntimeError, match="cannot reuse already awaited coroutine"):
        await work
    assert "a" not in tasks


async def test_keyed_work_cancelled_before_it_started_is_closed() -> None:
    """A task cancelled before its first step never awaited its work: the work is closed, so
    it can never run (and no "never awaited" warning follows)."""
    async with _keyed() as (_, tasks):
        work = asyncio.sleep(1)
        task = tasks.spawn("a", 1, work, name="a", fields={})
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        with pytest.raises(RuntimeError, match="cannot reuse already awaited coroutine"):
            await work
        assert "a" not in tasks
