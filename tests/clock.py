"""`ManualClock`: an `agent.clock.Clock` that moves only when a test says so.

`sleep()` parks the caller until `advance()` moves the clock past its deadline;
`next_wakeup()` waits until someone sleeps and says until when, so a test can step a waiting
task forward without a real sleep. `advancing(clock)` does that for every sleeper while a test
drives something else: each sleep ends at once in virtual time, and `slept` keeps its delay.
`timeout()` and `timeout_at()` bound a block in the same virtual time: the block is cancelled
(and `TimeoutError` raised) when `advance()` moves the clock to its deadline, never by real
time passing. A timeout is no sleeper: `next_wakeup()` and `advancing()` step only sleeps, so
a deadline fires once something (a test, a sleeper's step) moves the clock past it.
`sleepers` and `timeouts` say which waits are pending right now (their deadlines);
`until(condition)` waits, without polling, until a wait a test looks for has begun: it asks
again each time someone starts a sleep or a bounded block on this clock. A test that drives a
whole agent moves time only once the wait it means to end is in place.
`monotonic()` and `time()` move together; wall time starts at
the real time rounded down to a whole second (identities issued by a stand-in on its own clock
are then valid, and epoch milliseconds convert back without rounding).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from types import TracebackType

__all__ = ["ManualClock", "advancing"]


class ManualClock:
    """Time that moves by hand."""

    def __init__(self, *, start: float | None = None) -> None:
        self.start = float(int(time.time())) if start is None else start
        self._elapsed = 0.0
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []
        self._timeouts: list[_ManualTimeout] = []
        self._sleeping: asyncio.Event | None = None
        self._began: asyncio.Event | None = None  # set (and replaced) as any wait begins
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
        self._wait_began()
        try:
            await wake
        finally:
            if entry in self._sleepers:
                self._sleepers.remove(entry)

    def timeout(self, seconds: float | None) -> _ManualTimeout:
        """Bound a block to `seconds` of this clock's time from now (None: unbounded)."""
        return _ManualTimeout(self, None if seconds is None else self._elapsed + seconds)

    def timeout_at(self, deadline: float | None) -> _ManualTimeout:
        """Bound a block to the `monotonic()` time `deadline` (None: unbounded)."""
        return _ManualTimeout(self, deadline)

    @property
    def sleepers(self) -> list[float]:
        """The deadlines of the sleeps pending right now, earliest first."""
        return sorted(deadline for deadline, _ in self._sleepers)

    @property
    def timeouts(self) -> list[float]:
        """The deadlines of the blocks bounded right now, earliest first."""
        return sorted(t.deadline for t in self._timeouts if t.deadline is not None)

    async def until(self, condition: Callable[[], bool]) -> None:
        """Return once `condition()` holds, asking it now and again each time a sleep or a
        bounded block begins on this clock (bound the wait from outside, in real time)."""
        while not condition():
            if self._began is None:
                self._began = asyncio.Event()
            await self._began.wait()

    def _wait_began(self) -> None:
        began, self._began = self._began, None
        if began is not None:
            began.set()

    async def next_wakeup(self) -> float:
        """The earliest monotonic deadline anyone sleeps until (waits until someone sleeps)."""
        while not self._sleepers:
            event = self._event()
            event.clear()
            await event.wait()
        return min(deadline for deadline, _ in self._sleepers)

    def advance(self, seconds: float) -> None:
        """Move the clock; wake everyone whose deadline passed, expire every such timeout."""
        self._elapsed += seconds
        due = [entry for entry in self._sleepers if entry[0] <= self._elapsed]
        for entry in due:
            self._sleepers.remove(entry)
            if not entry[1].done():
                entry[1].set_result(None)
        for timeout in [t for t in self._timeouts if t.due(self._elapsed)]:
            timeout.expire()

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


class _ManualTimeout:
    """One `async with clock.timeout...:` block, in the manner of `asyncio.Timeout`: on expiry
    it cancels the task running the block, and turns that cancellation into `TimeoutError`."""

    def __init__(self, clock: ManualClock, deadline: float | None) -> None:
        self._clock = clock
        self.deadline = deadline
        self._task: asyncio.Task[object] | None = None
        self._cancelling = 0
        self._expired = False
        self._soon: asyncio.Handle | None = None

    def due(self, now: float) -> bool:
        return self.deadline is not None and self.deadline <= now

    def expire(self) -> None:
        if self._task is not None and not self._expired:
            self._expired = True
            self._task.cancel()

    async def __aenter__(self) -> _ManualTimeout:
        task = asyncio.current_task()
        if task is None:  # pragma: no cover - `async with` always runs in a task
            raise RuntimeError("a timeout must be entered inside a task")
        self._task, self._cancelling = task, task.cancelling()
        if self.deadline is not None:
            self._clock._timeouts.append(self)
            self._clock._wait_began()
            if self.due(self._clock.monotonic()):
                # As asyncio does: a deadline already passed cancels at the first await.
                self._soon = asyncio.get_running_loop().call_soon(self.expire)
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self in self._clock._timeouts:
            self._clock._timeouts.remove(self)
        if self._soon is not None:
            self._soon.cancel()
        # `uncancel` whenever it expired (asyncio.Timeout does too), then decide what it was.
        if (
            self._expired
            and self._task is not None
            and self._task.uncancel() <= self._cancelling
            and kind is asyncio.CancelledError
        ):
            raise TimeoutError from error
        self._task = None


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
