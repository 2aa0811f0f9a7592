"""Memory comes back: when the transfers are over, the allocator gives its free memory back.

glibc's malloc keeps what a process freed (in its arenas, one per thread that allocated, and
above its mmap threshold, which rises to the largest block freed: a 4 MB chunk frame freed once
makes every later one come from the heap). A transfer frees all its bytes when it ends, but the
process keeps the pages: measured, an agent idle after work held 50-60 MiB more than a fresh one
(docs/benchmarks.md, "One byte budget"). `malloc_trim(0)` hands every free page of every arena
back to the system.

`Trimmer` asks for it once the byte budget has been idle (nothing drawn, nobody waiting) for
`TRIM_DELAY_S` seconds on the agent's clock, in a worker thread (the call walks every arena),
and reports how much the resident size fell. First it collects the cycles a broken transfer
leaves, in the young generations only (`COLLECTED_GENERATION`): the collector holds the GIL, so
its pause is the event loop's, measured and logged (`gc_pause_ms`). Without glibc
(`trim_function()` finds no `malloc_trim`) it does nothing. The task runs in the app's TaskGroup.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import os
from collections.abc import Callable
from typing import Final

import structlog

from agent.clock import Clock
from agent.observe import NULL_OBSERVER, BudgetObserver

__all__ = [
    "COLLECTED_GENERATION",
    "FRAME_COPIES",
    "IDLE_ALLOWANCE",
    "SLACK",
    "TRIM_DELAY_S",
    "Trimmer",
    "memory_high",
    "resident_bytes",
    "trim_function",
]

TRIM_DELAY_S: Final = 1.0
"""Seconds the budget stays idle before the memory is given back (a short pause between two
transfers gives nothing back; the next would take it again)."""

COLLECTED_GENERATION: Final = 1
"""The oldest generation the trim's cycle collection takes (0 and 1, the young ones; a full
collection is 2). Measured with bench.memory (Python 3.11, about 71,500 objects tracked, 2 cores
at load 5; rounds of 4 or 8 refused 15 MiB chunk frames at once, then a 64 or 128 MiB stage):
the young collection found the cycles the refused transfers left (384-776 objects a round) in
0.1-1.3 ms; a full collection right after it found at most 29 objects more, gave back 0.0 MiB,
and held the event loop 68-91 ms each time (50-110 ms run alone). With the young collection
alone a round kept 0.2-0.4 MiB after 4 s and idle after work was 1.5 MiB above fresh (at
most 0.2 and 0.9 with the full one). What outlives two young collections is left to the
interpreter's own full collections."""

MiB: Final = 1024 * 1024

IDLE_ALLOWANCE: Final = 96 * MiB
"""What an idle agent may hold: measured 70-85 MiB (fresh, and after work once trimmed, with
a cluster's restores prepared; docs/benchmarks.md, "One byte budget")."""

FRAME_COPIES: Final = 3
"""How many times the websocket's read path may hold the frame being read besides the budget
(its read buffer, the frame cut out of it, the message joined from it): per `max_frame_bytes`."""

SLACK: Final = 16 * MiB
"""The rest of the measured constant: interpreter, allocator and the small answers."""


def memory_high(budget_bytes: int, max_frame_bytes: int) -> int:
    """The unit's `MemoryHigh=` for a budget and a frame limit: idle + budget + the constant
    (`FRAME_COPIES` x the frame limit + `SLACK`)."""
    return IDLE_ALLOWANCE + budget_bytes + FRAME_COPIES * max_frame_bytes + SLACK


_log = structlog.get_logger("agent.transfers.memory")


def trim_function() -> Callable[[], object] | None:
    """glibc's `malloc_trim(0)` as a callable, or None where there is none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        function = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_size_t]
    function.restype = ctypes.c_int
    return lambda: function(0)


def resident_bytes() -> int:
    """This process's resident set size (0 where /proc is not there)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class Trimmer:
    """Gives free memory back once the byte budget was idle for `delay` seconds."""

    def __init__(
        self,
        *,
        clock: Clock,
        delay: float = TRIM_DELAY_S,
        trim: Callable[[], object] | None = None,
        rss: Callable[[], int] = resident_bytes,
        observer: BudgetObserver = NULL_OBSERVER,
        busy: Callable[[], bool] = lambda: False,
        collect: Callable[[], int] = lambda: gc.collect(COLLECTED_GENERATION),
    ) -> None:
        self._clock = clock
        self._collect = collect
        self._delay = delay
        self._trim = trim
        self._rss = rss
        self._observer = observer
        self._busy = busy
        self._idle = asyncio.Event()
        self.trims = 0

    def idle(self) -> None:
        """The budget went idle: trim after the delay, unless a transfer draws again first."""
        self._idle.set()

    async def run(self) -> None:
        """Trim after every idle spell of `delay` seconds; runs until cancelled."""
        if self._trim is None:
            return
        while True:
            await self._idle.wait()
            self._idle.clear()
            await self._clock.sleep(self._delay)
            if self._busy() or self._idle.is_set():
                continue  # a transfer drew meanwhile (or went idle again: wait once more)
            await self.trim_now()

    async def trim_now(self) -> None:
        """Give free memory back now; report what it freed."""
        if self._trim is None:
            return
        before = self._rss()
        # Refused and broken transfers leave cycles (an exception, its traceback, the frame
        # that held a chunk) that only the cycle collector frees: free them first. It holds
        # the GIL throughout (no thread takes it off the loop), so it collects only the young
        # generations (COLLECTED_GENERATION says why), and its pause is measured.
        started = self._clock.monotonic()
        collected = self._collect()
        pause_s = self._clock.monotonic() - started
        await asyncio.to_thread(self._trim)
        released = before - self._rss()
        self.trims += 1
        self._observer.memory_trimmed(released=released)
        _log.debug(
            "memory_trimmed",
            released_mib=round(released / 2**20, 1),
            gc_pause_ms=round(pause_s * 1000, 1),
            gc_collected=collected,
        )
