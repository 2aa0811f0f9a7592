"""Time, injectable: the one `Clock` every part of the agent reads and waits on.

Three questions, three methods:

- `monotonic()`: seconds on a clock that never jumps. Deadlines, timeouts, durations and
  transfer rates use it.
- `time()`: wall-clock seconds since the epoch. Facts other parties read use it: an identity's
  expiry (Cloudly's epoch milliseconds), a node state's `updatedAt`, a status timestamp.
- `sleep(seconds)`: wait that long (at once for `seconds <= 0`).

`SYSTEM_CLOCK` is the real one. Tests pass a clock they move by hand (`tests/clock.py`), so no
test sleeps to let a timer pass. The sans-I/O protocol never holds a clock: its driver passes
`now` in.
"""

from __future__ import annotations

import asyncio
import time
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


class SystemClock:
    """The real clock: `time.monotonic`, `time.time`, `asyncio.sleep`."""

    def monotonic(self) -> float:
        """`time.monotonic()` (the clock asyncio's event loop runs on)."""
        return time.monotonic()

    def time(self) -> float:
        """`time.time()`."""
        return time.time()

    async def sleep(self, seconds: float) -> None:
        """`asyncio.sleep`, never with a negative delay."""
        await asyncio.sleep(max(0.0, seconds))


SYSTEM_CLOCK: Final = SystemClock()


def epoch_ms(clock: Clock) -> int:
    """The clock's wall time in whole epoch milliseconds (the contracts' timestamp unit)."""
    return round(clock.time() * 1000)
