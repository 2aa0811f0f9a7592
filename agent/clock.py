"""Time, injectable: the one `Clock` every part of the agent reads and waits on.

Four questions, five methods:

- `monotonic()`: seconds on a clock that never jumps. Deadlines, timeouts, durations and
  transfer rates use it.
- `time()`: wall-clock seconds since the epoch. Facts other parties read use it: an identity's
  expiry (Cloudly's epoch milliseconds), a node state's `updatedAt`, a status timestamp.
- `sleep(seconds)`: wait that long (at once for `seconds <= 0`).
- `timeout(seconds)` / `timeout_at(deadline)`: bound a block, as `asyncio.timeout` and
  `asyncio.timeout_at` do, but on this clock: `async with clock.timeout(5):` cancels the block
  once `monotonic()` passed its deadline and raises `TimeoutError` out of the `async with`
  (a cancellation from elsewhere passes through as `CancelledError`). `None` sets no bound; a
  deadline already passed cancels the block at its first `await`. `timeout_at` takes a
  `monotonic()` deadline, so a loop of waits can share one.

`SYSTEM_CLOCK` is the real one. Tests pass a clock they move by hand (`tests/clock.py`), whose
sleeps and timeouts both run in its own time, so no test sleeps to let a timer pass and no
deadline set in hand-moved time fires in real time. The sans-I/O protocol never holds a clock:
its driver passes `now` in.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import AbstractAsyncContextManager
from typing import Final, Protocol

__all__ = ["SYSTEM_CLOCK", "Clock", "SystemClock", "epoch_ms"]


class Clock(Protocol):
    """What the agent asks of time."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (for deadlines and durations)."""
        ...

    def time(self) -> float:
        """Wall-clock seconds since the epoch."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait `seconds` (return at once when `seconds <= 0`)."""
        ...

    def timeout(self, seconds: float | None) -> AbstractAsyncContextManager[object]:
        """Bound an `async with` block to `seconds` from now (None: unbounded); past it the
        block is cancelled and `TimeoutError` raised."""
        ...

    def timeout_at(self, deadline: float | None) -> AbstractAsyncContextManager[object]:
        """Bound an `async with` block to the `monotonic()` time `deadline` (None: unbounded);
        past it the block is cancelled and `TimeoutError` raised."""
        ...


class SystemClock:
    """The real clock: `time.monotonic`, `time.time`, `asyncio.sleep`, `asyncio.timeout`."""

    def monotonic(self) -> float:
        """`time.monotonic()` (the clock asyncio's event loop runs on)."""
        return time.monotonic()

    def time(self) -> float:
        """`time.time()`."""
        return time.time()

    async def sleep(self, seconds: float) -> None:
        """`asyncio.sleep`, never with a negative delay."""
        await asyncio.sleep(max(0.0, seconds))

    def timeout(self, seconds: float | None) -> asyncio.Timeout:
        """`asyncio.timeout(seconds)`."""
        return asyncio.timeout(seconds)

    def timeout_at(self, deadline: float | None) -> asyncio.Timeout:
        """`asyncio.timeout_at`, the `monotonic()` deadline read on the loop's own clock."""
        if deadline is None:
            return asyncio.timeout_at(None)
        loop = asyncio.get_running_loop()
        return asyncio.timeout_at(loop.time() + (deadline - time.monotonic()))


SYSTEM_CLOCK: Final = SystemClock()


def epoch_ms(clock: Clock) -> int:
    """The clock's wall time in whole epoch milliseconds (the contracts' timestamp unit)."""
    return round(clock.time() * 1000)
