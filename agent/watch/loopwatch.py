"""`LoopWatch`: is the event loop healthy? Measured, not assumed, and the watchdog follows it.

A task sleeps `interval` seconds again and again and measures how late it wakes (expected
versus actual monotonic time). That lag is the loop's health: a handler hashing on the loop,
a blocking call, a starved loop all show up as lag. After each wake it

- reports the lag to the observer (the `event_loop_lag_seconds` histogram);
- sends `WATCHDOG=1` only if the lag is at most `max_lag` (a loop that keeps waking late stops
  the pings and systemd's `WatchdogSec=` restarts the agent; a blocked one cannot ping at all);
- remembers the lag and the time, which `/healthz` reads (`health()`): the loop is alive when
  the watch woke recently enough and on time.

`interval` is a quarter of `WatchdogSec=` when there is a watchdog (systemd asks for a ping at
least every half), at most one second, so `/healthz` is never more than about a second stale.
"""

from __future__ import annotations

from typing import Any, Final, NoReturn

import structlog

from agent.clock import SYSTEM_CLOCK, Clock
from agent.observe import NULL_OBSERVER, LoopObserver
from agent.watch.notify import Notifier

__all__ = ["LoopWatch", "watch_interval"]

_log = structlog.get_logger("agent.watch.loopwatch")
_MAX_INTERVAL: Final = 1.0


def watch_interval(watchdog_s: float | None) -> float:
    """How often the watch wakes: a quarter of the watchdog period, at most one second."""
    if watchdog_s is None:
        return _MAX_INTERVAL
    return min(_MAX_INTERVAL, watchdog_s / 4)


class LoopWatch:
    """Measures the event loop's lag; pings the watchdog only while it is small."""

    def __init__(
        self,
        *,
        interval: float,
        max_lag: float,
        notifier: Notifier | None = None,
        watchdog: bool = False,
        clock: Clock = SYSTEM_CLOCK,
        observer: LoopObserver = NULL_OBSERVER,
    ) -> None:
        if interval <= 0 or max_lag <= 0:
            raise ValueError("a loop watch needs interval > 0 and max_lag > 0")
        self._interval = interval
        self._max_lag = max_lag
        self._notifier = notifier
        self._watchdog = watchdog and notifier is not None
        self._clock = clock
        self._observer = observer
        self._started = clock.monotonic()
        self._last_wake: float | None = None
        self._last_lag = 0.0
        self._blocked = False
        self.pings = 0
        self.skipped = 0

    async def run(self) -> NoReturn:
        """Watch until cancelled."""
        self._started = self._clock.monotonic()
        while True:
            expected = self._clock.monotonic() + self._interval
            await self._clock.sleep(self._interval)
            self.woke(self._clock.monotonic() - expected)

    def woke(self, lag: float) -> None:
        """One wake, `lag` seconds late: record it, ping the watchdog if the loop is healthy."""
        lag = max(0.0, lag)
        self._last_wake, self._last_lag = self._clock.monotonic(), lag
        self._observer.loop_lag(seconds=lag)
        if lag > self._max_lag:
            self.skipped += 1
            if not self._blocked:
                self._blocked = True
                _log.warning(
                    "event_loop_lagging",
                    lag_s=round(lag, 3),
                    max_lag_s=self._max_lag,
                    consequence="watchdog ping skipped" if self._watchdog else "health 503",
                )
            return
        if self._blocked:
            self._blocked = False
            _log.info("event_loop_recovered", lag_s=round(lag, 3))
        if self._watchdog and self._notifier is not None:
            self._notifier.watchdog()
            self.pings += 1

    def health(self) -> tuple[bool, dict[str, Any]]:
        """(alive, facts) for `/healthz`: the watch woke within `interval + max_lag` seconds,
        at most `max_lag` late."""
        now = self._clock.monotonic()
        since = now - (self._last_wake if self._last_wake is not None else self._started)
        stale = since > self._interval + self._max_lag
        alive = not stale and self._last_lag <= self._max_lag
        facts: dict[str, Any] = {
            "alive": alive,
            "loopLagSeconds": round(self._last_lag, 6),
            "lastWakeSecondsAgo": round(since, 3),
            "maxLagSeconds": self._max_lag,
        }
        return alive, facts
