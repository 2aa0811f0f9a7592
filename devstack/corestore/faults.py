"""Switchable faults of the reference Corestore: plain data a test sets at runtime.

Each rule applies to the next `times` requests of one route (a `RouteName`), in the order the
rules were added, or to every request of the route until a time (`fail_for`: a storm of a
given length, on the real clock). `hits` counts every request that reached a route, faulted or
not, so a test can tell how often the client tried. `hold_restores()` keeps resource restores
`running` until `release_restores()`, so a test observes the asynchronous restore without
sleeping; `hold_prepares()` likewise keeps prepare requests waiting (counted, unanswered) until
`release_prepares()`, so a test observes the agent's `preparing` phase; `prepare_held` is set
once a prepare request waits there (a test awaits it instead of guessing when it arrived).
`hold_next(route)` does the same for the next request of any route, with its own `Hold`.
`handled` counts requests handled, before their answer is sent.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

from agent.corestore.routes import RouteName

__all__ = ["FaultKind", "FaultRule", "Faults", "Hold"]

FaultKind = Literal["status", "reset", "delay", "truncate", "wrong-digest", "hold", "disk-full"]


@dataclass(slots=True)
class Hold:
    """A request kept waiting (counted, unanswered) until `release()`: `arrived` is set once
    it waits, so a test acts at that exact point and then lets it go on."""

    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    gate: asyncio.Event = field(default_factory=asyncio.Event)

    def release(self) -> None:
        """Let the held request be handled."""
        self.gate.set()


@dataclass(slots=True)
class FaultRule:
    """One fault and how many more requests it applies to."""

    kind: FaultKind
    times: int
    status: int = 503  # "status": the error answer to give instead of handling
    code: str = "unavailable"  # "status": the error code of that answer
    after: bool = False  # "reset": handle the request, then drop the answer
    seconds: float = 0.0  # "delay": wait this long (or until the server stops) first
    drop_bytes: int = 0  # "truncate": lose the last bytes of the body read
    hold: Hold | None = None  # "hold": wait for its release first
    until: float | None = None  # applies to every request until this `time.monotonic()`


@dataclass(slots=True)
class Faults:
    """The faults of one reference Corestore; every method takes effect on the next request."""

    rules: dict[RouteName, list[FaultRule]] = field(default_factory=dict)
    hits: Counter[RouteName] = field(default_factory=Counter)
    handled: Counter[RouteName] = field(default_factory=Counter)
    """Requests of each route handled (their effect applied), counted before the answer is
    sent: a test that hooks it acts after the effect and before its answer arrives."""
    restore_gate: asyncio.Event = field(default_factory=asyncio.Event)
    prepare_gate: asyncio.Event = field(default_factory=asyncio.Event)
    prepare_held: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.restore_gate.set()
        self.prepare_gate.set()

    def fail_next(
        self, route: RouteName | str, status: int = 503, times: int = 1, code: str = "unavailable"
    ) -> None:
        """Answer `status` with an error body (`code`) instead of handling the request."""
        self._add(route, FaultRule("status", times, status=status, code=code))

    def fail_for(
        self, route: RouteName | str, seconds: float, status: int = 503, code: str = "unavailable"
    ) -> None:
        """Answer `status` to every request of `route` for the next `seconds` (a storm: a
        Corestore restarting behind its proxy)."""
        until = time.monotonic() + seconds
        self._add(route, FaultRule("status", 1, status=status, code=code, until=until))

    def reset_next(self, route: RouteName | str, times: int = 1, *, after: bool = False) -> None:
        """Drop the connection without an answer; `after=True` handles the request first."""
        self._add(route, FaultRule("reset", times, after=after))

    def delay_next(self, route: RouteName | str, seconds: float, times: int = 1) -> None:
        """Wait `seconds` (cut short when the server stops) before handling."""
        self._add(route, FaultRule("delay", times, seconds=seconds))

    def truncate_next(self, route: RouteName | str, drop_bytes: int = 1, times: int = 1) -> None:
        """Lose the last `drop_bytes` of the request body, as a broken proxy would."""
        self._add(route, FaultRule("truncate", times, drop_bytes=drop_bytes))

    def wrong_digest_next(self, route: RouteName | str, times: int = 1) -> None:
        """Handle the request, then acknowledge another sha256 than the one it verified."""
        self._add(route, FaultRule("wrong-digest", times))

    def hold_next(self, route: RouteName | str) -> Hold:
        """Keep the next request of `route` waiting until the returned hold is released."""
        hold = Hold()
        self._add(route, FaultRule("hold", 1, hold=hold))
        return hold

    def disk_full_next(self, route: RouteName | str, times: int = 1) -> None:
        """Fail the handling as a full disk does (ENOSPC): the server's own answer to that,
        `507 storage-full`, goes back."""
        self._add(route, FaultRule("disk-full", times))

    def hold_restores(self) -> None:
        """Keep every resource restore started from now on `running`."""
        self.restore_gate.clear()

    def release_restores(self) -> None:
        """Let held resource restores run."""
        self.restore_gate.set()

    def hold_prepares(self) -> None:
        """Keep every prepare request from now on waiting before it is handled."""
        self.prepare_held.clear()
        self.prepare_gate.clear()

    def release_prepares(self) -> None:
        """Let held prepare requests be handled."""
        self.prepare_gate.set()

    def clear(self) -> None:
        """Remove every rule (hits are kept)."""
        self.rules.clear()

    def take(self, route: RouteName) -> FaultRule | None:
        """The rule for this request of `route`, consuming one of its uses, or None."""
        pending = self.rules.get(route)
        if not pending:
            return None
        rule = pending[0]
        if rule.until is not None:
            if time.monotonic() < rule.until:
                return rule
            pending.pop(0)
            return self.take(route)
        rule.times -= 1
        if rule.times <= 0:
            pending.pop(0)
        return rule

    def _add(self, route: RouteName | str, rule: FaultRule) -> None:
        if rule.times < 1:
            raise ValueError("a fault applies to at least one request")
        self.rules.setdefault(RouteName(route), []).append(rule)
