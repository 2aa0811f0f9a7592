"""When the Cloudly session waits: the reconnect count, and when to renew an identity.

`Reconnects` counts consecutive failed attempts and turns each into a wait with the agent's one
backoff shape (`agent.retry.Backoff`, full jitter). A session that stayed up for `stable_after`
seconds proves the path works again, so the next loss starts from the base window instead of
the grown one. Pure: the caller reports how long the lost session lasted; the random draw is
injected so tests pin it. `renew_delay()` says when to renew an identity.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from agent.errors import AuthenticationFailed
from agent.retry import Backoff

__all__ = ["Reconnects", "renew_delay"]


class Reconnects:
    """Consecutive failed attempts of the session, each turned into a jittered wait."""

    def __init__(
        self,
        backoff: Backoff | None = None,
        *,
        stable_after: float = 60.0,
        rng: Callable[[], float] = random.random,
    ) -> None:
        if stable_after < 0:
            raise ValueError("backoff needs stable_after >= 0")
        self._backoff = backoff or Backoff()
        self._stable_after = stable_after
        self._rng = rng
        self._failures = 0

    @property
    def backoff(self) -> Backoff:
        """The window shape in use."""
        return self._backoff

    @property
    def attempt(self) -> int:
        """Consecutive failures since the last reset."""
        return self._failures

    def next_delay(self, session_lasted: float = 0.0, *, permanent: bool = False) -> float:
        """The wait before the next attempt after a session that lasted `session_lasted` s.

        A session of at least `stable_after` seconds resets the count first; an attempt that
        never connected counts as 0 s. After a `permanent` fault (one only an operator can
        fix, `agent.session.faults`) the wait is drawn from the cap's window at once: trying
        again quickly cannot help.
        """
        if session_lasted >= self._stable_after:
            self._failures = 0
        self._failures += 1
        try:
            if permanent:
                return self._rng_checked() * self._backoff.cap
            return self._backoff.delay(self._failures, self._rng())
        except ValueError:
            self._failures -= 1
            raise

    def _rng_checked(self) -> float:
        fraction = self._rng()
        if not 0.0 <= fraction <= 1.0:
            raise ValueError("the random draw must be in [0, 1]")
        return fraction

    def reset(self) -> None:
        """Forget past failures (the next wait uses the base window)."""
        self._failures = 0


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
