"""The one retry policy of the agent: exponential backoff with full jitter, and `retrying()`.

Who retries what (one layer each, so a budget is never multiplied by another):

- the Cloudly session reconnects for ever, waiting `Backoff.delay(n)` after the n-th consecutive
  failed attempt (`agent.session.client`);
- the Corestore client resends one *idempotent* call while Corestore is unavailable:
  `RetryPolicy.attempts` sends at least (`[corestore] retries` + 1 in the configuration), and
  more for as long as the node's outage is younger than `RetryPolicy.tolerance` seconds
  (`[corestore] outage_tolerance_s`; `retrying(patience=...)`), so a blip of a minute or two is
  ridden out (`agent.corestore.transport`). Nothing above it resends the same call for
  availability: the engine's work fails its step when the client gives up, and Cloudly's
  replay (or the next cleanup request) resumes it. Where a step is sent again for another
  reason (a commit whose outcome was unknown, a chunk Corestore refused for its digest), it
  waits `Backoff.delay` first, as every resend does.

Full jitter (delay = U(0, min(cap, base * factor**n))) spreads a fleet of agents that lost the
same peer at the same moment over the whole window instead of retrying in lockstep.

Considered and not taken: `stamina` (its waits cannot be injected per call, only switched off
globally for tests) and `tenacity` (its stop/wait/retry objects are a larger surface than the
forty lines here, and neither models the session's "reset after a stable connection").
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, TypeVar

import structlog

if TYPE_CHECKING:
    # Only a type: the configuration checks a backoff's shape here without loading asyncio.
    from agent.clock import Clock

__all__ = ["Backoff", "RetryPolicy", "retrying"]

_T = TypeVar("_T")
# factor**_MAX_EXPONENT * base is far above any sane cap; clamping keeps the float finite.
_MAX_EXPONENT: Final = 62
_log = structlog.get_logger("agent.retry")


@dataclass(frozen=True, slots=True)
class Backoff:
    """The shape of the wait before a retry (seconds)."""

    base: float = 1.0
    cap: float = 60.0
    factor: float = 2.0

    def __post_init__(self) -> None:
        if not (self.base > 0 and self.cap >= self.base and self.factor >= 1):
            raise ValueError("backoff needs 0 < base <= cap and factor >= 1")

    def window(self, failures: int) -> float:
        """The longest wait after `failures` consecutive failures (1-based)."""
        exponent = min(max(failures - 1, 0), _MAX_EXPONENT)
        return float(min(self.cap, self.base * self.factor**exponent))

    def delay(self, failures: int, fraction: float) -> float:
        """The wait after `failures` consecutive failures; `fraction` is a draw from U(0, 1)."""
        return _draw(fraction) * self.window(failures)

    def from_cap(self, fraction: float) -> float:
        """A wait drawn from the cap's whole window (after a failure retrying cannot mend
        soon); `fraction` is a draw from U(0, 1)."""
        return _draw(fraction) * self.cap


def _draw(fraction: float) -> float:
    if not 0.0 <= fraction <= 1.0:
        raise ValueError("the random draw must be in [0, 1]")
    return fraction


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """`attempts` tries at least (1 means no retry), waiting by `backoff` in between; then more
    for as long as the caller's patience lasts, which is `tolerance` seconds of an outage (0:
    none, `attempts` is all)."""

    attempts: int = 4
    backoff: Backoff = field(default_factory=lambda: Backoff(base=0.25, cap=5.0))
    tolerance: float = 0.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("attempts must be at least 1")
        if self.tolerance < 0:
            raise ValueError("tolerance must not be negative")


async def retrying(
    step: Callable[[], Awaitable[_T]],
    *,
    policy: RetryPolicy,
    retry_on: type[Exception] | tuple[type[Exception], ...],
    clock: Clock,
    rng: Callable[[], float],
    what: str,
    patience: Callable[[], bool] | None = None,
) -> _T:
    """`await step()`, again after a backoff while it raises `retry_on`: `policy.attempts` in
    all, and beyond that for as long as `patience()` says so (asked after each failure).

    The last attempt's error propagates. `what` names the step in the log (never a secret).
    """
    attempt = 0
    while True:
        attempt += 1
        try:
            return await step()
        except retry_on as exc:
            if attempt >= policy.attempts and (patience is None or not patience()):
                raise
            delay = policy.backoff.delay(attempt, rng())
            _log.warning(
                "retrying",
                step=what,
                attempt=attempt,
                of=policy.attempts,
                delay_s=round(delay, 3),
                error=type(exc).__name__,
            )
            await clock.sleep(delay)
