"""Memory comes back: the trimmer asks the allocator once the byte budget has been idle for
its delay (on the agent's clock), never while a transfer draws, and reports what came back; the
cycles it collects first are the young generations' only, the pause measured in its log line."""

from __future__ import annotations

import asyncio
import gc
import weakref

import structlog

from agent.transfers.budget import ByteBudget
from agent.transfers.memory import Trimmer, resident_bytes, trim_function
from tests.clock import ManualClock


class Recorder:
    def __init__(self) -> None:
        self.trimmed: list[int] = []

    def budget_changed(self, *, limit: int, held: int, waiting: int) -> None:
        pass

    def budget_waited(self, *, seconds: float) -> None:
        pass

    def memory_trimmed(self, *, released: int) -> None:
        self.trimmed.append(released)


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_memory_is_given_back_once_the_budget_was_idle_for_the_delay() -> None:
    clock = ManualClock()
    budget = ByteBudget(100, clock=clock)
    calls: list[str] = []
    sizes = iter([500, 200])  # resident before and after the trim
    recorder = Recorder()
    trimmer = Trimmer(
        clock=clock,
        delay=1.0,
        trim=lambda: calls.append("trim"),
        rss=lambda: next(sizes),
        observer=recorder,
        busy=lambda: budget.held > 0,
    )
    budget.on_idle(trimmer.idle)
    task = asyncio.create_task(trimmer.run())
    assert budget.try_take(10)
    budget.give(10)  # the last transfer ended
    await settle()
    clock.advance(0.5)
    await settle()
    assert calls == []  # not before the delay
    clock.advance(0.5)
    await settle()
    assert calls == ["trim"]
    assert recorder.trimmed == [300]
    task.cancel()


async def test_no_trim_while_a_transfer_draws_again_within_the_delay() -> None:
    clock = ManualClock()
    budget = ByteBudget(100, clock=clock)
    calls: list[str] = []
    trimmer = Trimmer(
        clock=clock,
        delay=1.0,
        trim=lambda: calls.append("trim"),
        rss=lambda: 0,
        busy=lambda: budget.held > 0,
    )
    budget.on_idle(trimmer.idle)
    task = asyncio.create_task(trimmer.run())
    assert budget.try_take(10)
    budget.give(10)
    await settle()
    assert budget.try_take(10)  # the next transfer starts within the delay
    clock.advance(1.0)
    await settle()
    assert calls == []
    task.cancel()


def test_the_trim_function_and_the_resident_size_are_there_on_linux() -> None:
    """glibc's malloc_trim (the agent's platform) and /proc/self/statm."""
    trim = trim_function()
    assert trim is not None
    trim()
    assert resident_bytes() > 0


async def test_the_collection_pause_is_measured_in_the_log_line() -> None:
    """The cycle collection holds the loop: its pause (on the agent's clock) and what it found
    are in `memory_trimmed`."""
    clock = ManualClock()

    def collect() -> int:
        clock.advance(0.0125)  # the collection takes 12.5 ms of the clock
        return 7

    trimmer = Trimmer(clock=clock, trim=lambda: None, rss=lambda: 0, collect=collect)
    with structlog.testing.capture_logs() as logs:
        await trimmer.trim_now()
    [line] = [line for line in logs if line["event"] == "memory_trimmed"]
    assert (line["gc_pause_ms"], line["gc_collected"]) == (12.5, 7)


class _Cycle:
    """An object in a reference cycle with itself."""

    def __init__(self) -> None:
        self.me = self


async def test_the_trim_collects_the_young_generations_and_leaves_the_oldest() -> None:
    """A cycle made since the last collection is freed; one that became garbage in the oldest
    generation is left to the interpreter's own full collections (no full pause on the loop)."""
    trimmer = Trimmer(clock=ManualClock(), trim=lambda: None, rss=lambda: 0)
    gc.disable()  # no automatic collection in between: only the trimmer's runs
    try:
        old = _Cycle()
        gc.collect()  # alive, it moves to the oldest generation
        old_ref = weakref.ref(old)
        del old
        young = _Cycle()
        young_ref = weakref.ref(young)
        del young
        await trimmer.trim_now()
        assert (young_ref() is None, old_ref() is None) == (True, False)
    finally:
        gc.enable()
        gc.collect()
