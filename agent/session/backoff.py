"""When the Cloudly session waits: reconnect backoff, identity renewal, and the clock it uses.

`Backoff` is exponential backoff with full jitter, reset after a stable session. Pure: the caller
reports how long the lost session lasted and gets the delay to wait before the next attempt; the
random source is injected so tests pin it. `renew_delay()` says when to renew an identity
(pure). `Clock` is the injectable wall clock the session waits on (`SystemClock` in production,
a manual one in tests), so neither wait needs a real sleep in a test.

Full jitter (delay = U(0, min(cap, base * 2**attempt))) spreads a fleet of agents that lost
Cloudly at the same moment over the whole window instead of letting them reconnect in lockstep.
A session that stayed up for `stable_after` seconds proves the path works again, so the next loss
starts from the base window instead of the grown one.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from agent.errors import AuthenticationFailed

__all__ = ["Backoff", "BackoffPolicy", "Clock", "SystemClock", "renew_delay"]

# 2**_MAX_EXPONENT * base is far above any sane cap; clamping keeps the float finite forever.
_MAX_EXPONENT = 62


@dataclass(frozen=True, slots=True)
class BackoffPolicy:
    """The shape of the backoff window (seconds)."""

    base: float = 1.0
    cap: float = 60.0
    stable_after: float = 60.0

    def __post_init__(self) -> None:
        if not (self.base > 0 and self.cap >= self.base and self.stable_after >= 0):
            raise ValueError("backoff needs 0 < base <= cap and stable_after >= 0")

    def window(self, attempt: int) -> float:
        """The upper bound of the delay for the `attempt`-th consecutive failure (0-based)."""
        return min(self.cap, self.base * 2.0 ** min(attempt, _MAX_EXPONENT))


class Backoff:
    """Consecutive-failure counter that turns each failure into a jittered delay."""

    def __init__(
        self,
        policy: BackoffPolicy | None = None,
        *,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self._policy = policy or BackoffPolicy()
        self._rng = rng
        self._attempt = 0

    @property
    def policy(self) -> BackoffPolicy:
        """The window shape in use."""
        return self._policy

    @property
    def attempt(self) -> int:
        """Consecutive failures since the last reset."""
        return self._attempt

    def next_delay(self, session_lasted: float = 0.0) -> float:
        """The delay before the next attempt after a session that lasted `session_lasted` s.

        A session of at least `stable_after` seconds resets the window first; an attempt that
        never connected counts as 0 s.
        """
        if session_lasted >= self._policy.stable_after:
            self._attempt = 0
        fraction = self._rng()
        if not 0.0 <= fraction <= 1.0:
            raise ValueError("the random source must return a value in [0, 1]")
        delay = fraction * self._policy.window(self._attempt)
        self._attempt += 1
        return delay

    def reset(self) -> None:
        """Forget past failures (the next delay uses the base window)."""
        self._attempt = 0


def renew_delay(expires_at_ms: int, now: float, margin_s: float) -> float:
    """Seconds to wait before renewing an identity that expires at `expires_at_ms`.

    `margin_s` before expiry; an identity living shorter than the margin is renewed at half of
    its remaining life instead, so a short-lived identity cannot make the session spin.
    """
    remaining = expires_at_ms / 1000.0 - now
    if remaining <= 0:
        raise AuthenticationFailed(
            "Cloudly issued an identity that has already expired (are the clocks in sync?)"
        )
    return max(remaining - margin_s, remaining / 2.0)


class Clock(Protocol):
    """Wall time and waiting, injectable (identity expiry is wall time: epoch milliseconds)."""

    def now(self) -> float:
        """Seconds since the epoch."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait `seconds` (<= 0 returns at once)."""
        ...


class SystemClock:
    """The real clock."""

    def now(self) -> float:
        """`time.time()`."""
        return time.time()

    async def sleep(self, seconds: float) -> None:
        """`asyncio.sleep`, never negative."""
        await asyncio.sleep(max(0.0, seconds))
