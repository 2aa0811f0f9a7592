"""TaskOwner: run once, refuse work outside its run, close cancels its tasks within a bound."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from agent.errors import InvalidState, ShuttingDown
from agent.owner import TaskOwner
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
