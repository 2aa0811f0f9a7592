"""The engine's tunables (`EngineSettings`) and its one retry loop (`retrying`).

Two retry layers exist on purpose. The Corestore client resends one idempotent HTTP call while
Corestore is unavailable (`RetryPolicy`, a few attempts within seconds). The engine retries one
*step* of its work (restore one mapping, verify one, delete one resource) when that whole step
ended `CorestoreUnavailable`, with a longer backoff; after `attempts` the step's error decides the
outcome (`failed`, `cleanup-failed`). Nothing else is retried here: a refusal (4xx) or an
integrity failure says the same request cannot succeed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, TypeVar

import structlog

from agent.corestore.shapes import MAX_CHUNK_SIZE
from agent.errors import CorestoreUnavailable, InvalidState

if TYPE_CHECKING:
    from agent.config import CorestoreConfig

__all__ = ["DEFAULT_CHUNK_SIZE", "EngineSettings", "Sleep", "retrying"]

DEFAULT_CHUNK_SIZE: Final = 4 * 1024 * 1024

Sleep = Callable[[float], Awaitable[None]]
_T = TypeVar("_T")
_log = structlog.get_logger("agent.restore")


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """How the engine moves bytes and how patiently it works.

    `chunk_size` is what one chunk PUT carries (1 byte .. Corestore's 16 MiB cap; the config
    file allows 64 KiB .. 16 MiB, tests use less). `max_in_flight` is how many chunks may wait
    between the incoming stream and Corestore: memory per staged object stays below
    `(max_in_flight + 2) * chunk_size` plus the stream window. `transfer_timeout` bounds one
    attempt of a bulk Corestore call (chunk PUT, commit, verification); the engine does not
    apply it itself: whoever builds the Corestore clients passes it as their `transfer` timeout
    (`handlers.install`), so the configuration has one source for it.
    """

    chunk_size: int = DEFAULT_CHUNK_SIZE
    max_in_flight: int = 4
    attempts: int = 3  # tries of one work step while Corestore is unavailable
    first_delay: float = 1.0  # engine backoff between those tries, doubling
    max_delay: float = 30.0
    chunk_attempts: int = 3  # sends of one chunk Corestore found corrupted in transit
    commit_attempts: int = 3  # commits of one object whose outcome was unknown
    poll_interval: float = 1.0  # between resource-restore status reads
    transfer_timeout: float = 300.0  # one bulk Corestore call (the clients' `transfer` timeout)
    restore_timeout: float = 3600.0  # one resource restore, start to finish
    progress_interval: float = 5.0  # at most one staging_progress log line per object this often

    def __post_init__(self) -> None:
        if not 0 < self.chunk_size <= MAX_CHUNK_SIZE:
            raise InvalidState(f"chunk_size must be 1 to {MAX_CHUNK_SIZE} bytes")
        for name in ("max_in_flight", "attempts", "chunk_attempts", "commit_attempts"):
            if getattr(self, name) < 1:
                raise InvalidState(f"{name} must be at least 1")
        for name in ("first_delay", "max_delay", "poll_interval", "progress_interval"):
            if getattr(self, name) < 0:
                raise InvalidState(f"{name} must not be negative")
        for name in ("restore_timeout", "transfer_timeout"):
            if getattr(self, name) <= 0:
                raise InvalidState(f"{name} must be positive")

    @classmethod
    def from_config(cls, corestore: CorestoreConfig) -> EngineSettings:
        """The settings a configuration file asks for (`[corestore]`)."""
        return cls(
            chunk_size=corestore.chunk_size,
            max_in_flight=corestore.max_in_flight,
            attempts=corestore.retries + 1,
            poll_interval=corestore.restore_poll_interval_s,
            transfer_timeout=corestore.transfer_timeout_s,
        )

    def delay(self, retry: int) -> float:
        """Seconds before retry number `retry` (1-based)."""
        return float(min(self.max_delay, self.first_delay * 2 ** (retry - 1)))


async def retrying(
    step: Callable[[], Awaitable[_T]],
    *,
    settings: EngineSettings,
    sleep: Sleep,
    what: str,
    attempts: int | None = None,
) -> _T:
    """`await step()`, again after a backoff while it raises `CorestoreUnavailable`.

    The last attempt's error propagates. `what` names the step in the log (never a secret).
    """
    tries = settings.attempts if attempts is None else attempts
    for attempt in range(1, tries + 1):
        try:
            return await step()
        except CorestoreUnavailable as exc:
            if attempt >= tries:
                raise
            delay = settings.delay(attempt)
            _log.warning(
                "restore_step_retry", step=what, attempt=attempt, delay_s=delay, code=exc.code
            )
            await sleep(delay)
    raise AssertionError("unreachable: the last attempt returns or raises")
