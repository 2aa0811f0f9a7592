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

The composition root's attempt is `open_state` (the recipient key, then the database), its
`refused` is `state_refused`; once the agent serves, `probe_state_writes` tries a small write
after each backoff delay while the disk refuses writes, so readiness comes back by itself.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

import structlog

from agent.clock import Clock
from agent.config import Config
from agent.credentials.keys import KeyStore
from agent.errors import StateUnwritable
from agent.retry import Backoff
from agent.store import RevisionStore
from agent.store.faults import store_error
from agent.watch.status import STATE_UNWRITABLE, AgentStatus
from agent.watch.statushooks import StatusHooks
from agent.watch.tee import Tee

__all__ = ["OPEN_BACKOFF", "open_state", "open_waiting", "probe_state_writes", "state_refused"]

# The composition root's name: these lines are part of its start-up.
log = structlog.get_logger("agent.entry.app")

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


async def open_state(
    config: Config, observer: Tee, clock: Clock
) -> tuple[KeyStore | None, RevisionStore]:
    """The recipient key (created on first start; None for the file option), then the
    database. A disk that refuses their writes is `StateUnwritable` (nothing stays open)."""
    directory = config.state.directory
    keys: KeyStore | None = None
    if config.corestore.credential_source == "sealed":
        try:
            keys = await asyncio.to_thread(KeyStore.open, directory)
        except OSError as exc:
            error = store_error(exc, f"cannot write the recipient key in {directory}", directory)
            if isinstance(error, StateUnwritable):
                raise error from exc
            raise
    try:
        store = await RevisionStore.open(directory, clock=clock, observer=observer)
    except BaseException:
        if keys is not None:
            keys.close()
        raise
    return keys, store


def state_refused(
    config: Config,
    error: StateUnwritable,
    failures: int,
    observer: Tee,
    hooks: StatusHooks,
    ready: Callable[[], None],
) -> None:
    """A try to open the state met a disk that refuses writes: said at error once per cause,
    named as a condition (not ready), and the unit told it runs (`ready`: it waits, serving
    health)."""
    if failures == 1 or hooks.unwritable_cause != error.cause:
        log.error(
            "state_unwritable_at_start",
            state_directory=str(config.state.directory),
            cause=error.cause,
            error=str(error),
            hint="make room on (or remount read-write) the state directory's file system; "
            "the agent serves /healthz and /readyz meanwhile and starts by itself once the "
            "state can be written",
        )
    else:
        log.debug("state_unwritable_at_start", cause=error.cause, failures=failures)
    observer.state_write_failed(cause=error.cause)
    ready()


async def probe_state_writes(store: RevisionStore, status: AgentStatus, clock: Clock) -> None:
    """While the state disk refuses writes, try one small write after a backoff delay, so
    readiness comes back once the disk takes writes again even when nothing else writes."""
    while True:
        await status.wait_until(lambda snapshot: STATE_UNWRITABLE in snapshot.conditions)
        failures = 0
        while store.write_fault is not None or STATE_UNWRITABLE in status.snapshot().conditions:
            failures += 1
            await clock.sleep(OPEN_BACKOFF.delay(failures, random.random()))
            if await store.probe_write():
                break
