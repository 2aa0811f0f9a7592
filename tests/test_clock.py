"""The one Clock: its timeouts bound a block in the clock's own time, real or moved by hand."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import pytest

from agent.clock import SYSTEM_CLOCK
from tests.clock import ManualClock


async def _bounded(clock: ManualClock, seconds: float | None, release: asyncio.Event) -> str:
    async with clock.timeout(seconds):
        await release.wait()
    return "released"


async def _started(coro: Coroutine[Any, Any, str]) -> asyncio.Task[str]:
    task = asyncio.create_task(coro)
    await asyncio.sleep(0)  # let it enter its block
    return task


class TestManualTimeouts:
    async def test_a_timeout_fires_when_the_clock_is_moved_to_its_deadline(self) -> None:
        """Short of the deadline the block goes on; moved onto it, `TimeoutError` ends it."""
        clock = ManualClock()
        task = await _started(_bounded(clock, 5.0, asyncio.Event()))
        assert clock.timeouts == [5.0]
        clock.advance(4.9)
        await asyncio.sleep(0)
        assert not task.done()
        clock.advance(0.1)
        with pytest.raises(TimeoutError):
            await task
        assert clock.timeouts == []

    async def test_a_deadline_already_passed_cancels_at_the_first_await(self) -> None:
        """`timeout_at` a time the clock has passed: the first wait in the block times out."""
        clock = ManualClock()
        clock.advance(10.0)
        with pytest.raises(TimeoutError):
            async with clock.timeout_at(3.0):
                await asyncio.Event().wait()

    async def test_a_block_that_ends_in_time_is_left_alone(self) -> None:
        """Released before its deadline, the block returns; passing the deadline later
        cancels nothing."""
        clock, release = ManualClock(), asyncio.Event()
        task = await _started(_bounded(clock, 5.0, release))
        release.set()
        assert await task == "released"
        clock.advance(10.0)
        await asyncio.sleep(0)  # a stray cancellation would land here
        assert clock.timeouts == []

    async def test_no_bound_never_fires(self) -> None:
        """`timeout(None)` bounds nothing, however far the clock moves."""
        clock, release = ManualClock(), asyncio.Event()
        task = await _started(_bounded(clock, None, release))
        clock.advance(1e9)
        await asyncio.sleep(0)
        assert not task.done()
        release.set()
        assert await task == "released"

    async def test_a_cancellation_from_elsewhere_stays_a_cancellation(self) -> None:
        """Cancelled by its owner before the deadline, the block raises `CancelledError`."""
        clock = ManualClock()
        task = await _started(_bounded(clock, 5.0, asyncio.Event()))
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    async def test_a_timeout_is_no_sleeper(self) -> None:
        """Only sleeps are stepped: `next_wakeup` waits for a sleeper, not for a deadline."""
        clock = ManualClock()
        task = await _started(_bounded(clock, 5.0, asyncio.Event()))
        sleeper = asyncio.ensure_future(clock.sleep(7.0))
        assert await clock.next_wakeup() == 7.0
        clock.advance(7.0)
        await sleeper
        with pytest.raises(TimeoutError):
            await task


class TestWaitsBeginning:
    async def test_until_returns_once_the_sleep_it_looks_for_has_begun(self) -> None:
        """A 3 s sleep begun after a 1 s one: `until` holds on through the first and returns
        at the second, which `sleepers` then lists by its deadline."""
        clock = ManualClock()
        clock.advance(2.0)
        looking = asyncio.create_task(clock.until(lambda: 5.0 in clock.sleepers))
        first = asyncio.ensure_future(clock.sleep(1.0))
        await asyncio.sleep(0)  # the first sleep begins; `until` asks again
        assert not looking.done()
        second = asyncio.ensure_future(clock.sleep(3.0))
        async with asyncio.timeout(5):
            await looking
        assert clock.sleepers == [3.0, 5.0]
        clock.advance(3.0)
        await asyncio.gather(first, second)
        assert clock.sleepers == []

    async def test_until_sees_a_bounded_block_begin(self) -> None:
        """A block bounded on the clock wakes `until` as a sleep does."""
        clock = ManualClock()
        looking = asyncio.create_task(clock.until(lambda: clock.timeouts == [5.0]))
        await asyncio.sleep(0)
        assert not looking.done()
        task = await _started(_bounded(clock, 5.0, asyncio.Event()))
        async with asyncio.timeout(5):
            await looking
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


class TestSystemTimeouts:
    async def test_a_passed_deadline_times_out_at_once(self) -> None:
        """`timeout_at` a monotonic time already gone, and `timeout(0)`: `TimeoutError`."""
        with pytest.raises(TimeoutError):
            async with SYSTEM_CLOCK.timeout_at(SYSTEM_CLOCK.monotonic() - 1.0):
                await asyncio.Event().wait()
        with pytest.raises(TimeoutError):
            async with SYSTEM_CLOCK.timeout(0):
                await asyncio.Event().wait()

    async def test_no_bound_lets_the_block_finish(self) -> None:
        """`timeout(None)` and `timeout_at(None)` bound nothing."""
        async with SYSTEM_CLOCK.timeout(None), SYSTEM_CLOCK.timeout_at(None):
            await asyncio.sleep(0)
