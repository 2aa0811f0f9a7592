"""`ManualClock`: an `agent.clock.Clock` that moves only when a test says so.

`sleep()` parks the caller until `advance()` moves the clock past its deadline;
`next_wakeup()` waits until someone sleeps and says until when, so a test can step a waiting
task forward without a real sleep. `advancing(clock)` does that for every sleeper while a test
drives something else: each sleep ends at once in virtual time, and `slept` keeps its delay.
`monotonic()` and `time()` move together; wall time starts at
the real time rounded down to a whole second (identities issued by a stand-in on its own clock
are then valid, and epoch milliseconds convert back without rounding).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

__all__ = ["ManualClock", "advancing"]


class ManualClock:
    """Time that moves by hand."""

    def __init__(self, *, start: float | None = None) -> None:
        self.start = float(int(time.time())) if start is None else start
        self._elapsed = 0.0
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []
        self._sleeping: asyncio.Event | None = None
        self.slept: list[float] = []  # every delay anyone asked to sleep, in order

    def monotonic(self) -> float:
        """Seconds since the clock was made."""
        return self._elapsed

    def time(self) -> float:
        """Wall seconds: `start` plus what was advanced."""
        return self.start + self._elapsed

    async def sleep(self, seconds: float) -> None:
        """Wait until the clock is advanced `seconds` past now (at once for `seconds <= 0`)."""
        self.slept.append(seconds)
        if seconds <= 0:
            return
        wake: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (self._elapsed + seconds, wake)
        self._sleepers.append(entry)
        self._event().set()
        try:
            await wake
        finally:
            if entry in self._sleepers:
                self._sleepers.remove(entry)

    async def next_wakeup(self) -> float:
        """The earliest monotonic deadline anyone sleeps until (waits until someone sleeps)."""
        while not self._sleepers:
            event = self._event()
            event.clear()
            await event.wait()
        return min(deadline for deadline, _ in self._sleepers)

    def advance(self, seconds: float) -> None:
        """Move the clock; wake everyone whose deadline passed."""
        self._elapsed += seconds
        due = [entry for entry in self._sleepers if entry[0] <= self._elapsed]
        for entry in due:
            self._sleepers.remove(entry)
            if not entry[1].done():
                entry[1].set_result(None)

    async def run_until_sleeping(self) -> float:
        """Advance to the next sleeper's deadline and wake it; returns the delay advanced."""
        deadline = await self.next_wakeup()
        step = max(0.0, deadline - self._elapsed)
        self.advance(step)
        return step

    def _event(self) -> asyncio.Event:
        # Made lazily: an Event must be created inside the running loop on Python 3.11.
        if self._sleeping is None:
            self._sleeping = asyncio.Event()
        return self._sleeping


@contextlib.asynccontextmanager
async def advancing(clock: ManualClock) -> AsyncIterator[ManualClock]:
    """While the block runs, move `clock` to each sleeper's deadline as soon as it sleeps.

    For code that waits through backoffs and poll intervals while the test waits on something
    else (an observer, an answer): no real time passes, and `clock.slept` says what was waited.
    """

    async def advance_forever() -> None:
        while True:
            await clock.run_until_sleeping()

    task = asyncio.create_task(advance_forever(), name="manual-clock-advancer")
    try:
        yield clock
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
