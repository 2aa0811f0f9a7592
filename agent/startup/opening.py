"""Opening the node's state at start-up, waiting out a disk that refuses writes.

`open_waiting(attempt, ...)` calls `attempt()` (the composition root's: the recipient key, then
the database) until it returns, and answers what it returned. When it raises `StateUnwritable`
(the state disk is full, read-only or failing: `agent/store/faults.py`) the agent does not
crash and does not exit: `refused(error, failures)` is told (the root logs it at error, names
the condition, so `/readyz` says `state-unwritable`, and sends `READY=1` with a `STATUS=` that
says why), then it waits a full-jitter backoff on the injected clock (1 s doubling to 30 s) and
tries again, for as long as it takes. `stop` ends the wait at once (None is answered then).
Anything else `attempt()` raises (a damaged or newer database, a configuration error) is
raised as it is.

Why stay up rather than exit 75 and let systemd retry: the unit's start limit
(`StartLimitBurst=5` in 300 s, which a crash loop needs) would give up on a disk that stays
full for half a minute, and systemd 252 cannot exempt one exit status from it; staying up, the
agent serves `/healthz`, `/readyz` and `/metrics` throughout, so the operator sees why it is
not ready, the alert fires, and the agent starts working the moment the disk takes writes
again, with no restart (docs/operations.md, "A full or read-only state disk").
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

from agent.clock import Clock
from agent.errors import StateUnwritable
from agent.retry import Backoff

__all__ = ["OPEN_BACKOFF", "open_waiting"]

OPEN_BACKOFF: Final = Backoff(base=1.0, cap=30.0)
"""The wait between two tries to open the state on a disk that refuses writes."""

_T = TypeVar("_T")


async def open_waiting(
    attempt: Callable[[], Awaitable[_T]],
    *,
    clock: Clock,
    stop: asyncio.Event,
    refused: Callable[[StateUnwritable, int], None],
    backoff: Backoff = OPEN_BACKOFF,
    rng: Callable[[], float] = random.random,
    failed: int = 0,
) -> _T | None:
    """`attempt()`'s answer, tried again after each `StateUnwritable` (told to `refused` with
    the count of failures so far) once a backoff delay passed on `clock`; None when `stop` was
    set while waiting. `failed`: tries that failed already (the first one waits first)."""
    failures = failed
    while True:
        if failures and await _stopped_within(stop, backoff.delay(failures, rng()), clock):
            return None
        try:
            return await attempt()
        except StateUnwritable as exc:
            failures += 1
            refused(exc, failures)


async def _stopped_within(stop: asyncio.Event, seconds: float, clock: Clock) -> bool:
    """Whether `stop` is set within `seconds` of `clock`'s time (a sleep on it, cut short)."""
    waits = {asyncio.ensure_future(clock.sleep(seconds)), asyncio.ensure_future(stop.wait())}
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
        await asyncio.gather(*waits, return_exceptions=True)
    return stop.is_set()
