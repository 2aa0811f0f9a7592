"""`MinRoundTrip`: the smallest round trip of a path, one that expires (sans I/O: time is `now`).

What a stream we drive keeps in flight, and what the receive budget invites, is twice the
bandwidth-delay product, and its delay is the smallest round trip measured: once bytes queue on
the link every later sample carries the queue, and a product sized from those would grow the
queue it measures. A smallest round trip kept forever is wrong the other way: a session born on
a near path whose round trip then grew (a route change, a failover to a far site) kept the near
path's few milliseconds, so twice the product stayed about one chunk and a stream moved one
chunk per round trip (4.7 MB/s over 200 ms where a session born there moved 30.9 MB/s:
docs/benchmarks.md, "A round trip that follows the path").

So, as BBR's min-RTT filter and its ProbeRTT phase do:

- a sample at most the minimum is the minimum at once (a round trip that shrinks is taken at
  once), and a sample equal to it keeps it fresh;
- a minimum not refreshed for `span` seconds has expired, and a *probe* begins when it does
  (`probing`): its owner holds back what it has in flight (a stream: to half the product, one
  cycle where that is about a chunk; the receive budget: to half the product, never below its
  floor), so little or none of its own queue lies ahead of what it measures. The smallest sample
  of a cycle sent since the probe began is the new minimum, taken at the first such sample once
  `probe` seconds of the probe passed (a far path answers one cycle after that anyway; a near
  one answers many meanwhile). Not simply the newest sample: with twice the product in flight a
  sample carries about one product of queue, and a minimum taken from it doubles what is in
  flight at every expiry;
- `current(now)` is the minimum while it is fresh and None once it expired until a probe
  measured it again: what the connection's calls, which cannot be held back, tell its streams
  (a stale near minimum would hold every stream to it).

The owner gives each sample with the time its answer came (`now`); the cycle went out at
`now - seconds`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = ["PROBE_SPAN", "RTT_SPAN", "MinRoundTrip"]

RTT_SPAN: Final = 10.0
"""Seconds a smallest round trip counts unless a sample matches it again (BBR's window)."""

PROBE_SPAN: Final = 0.2
"""Seconds a probe lasts at least before its smallest sample is the minimum (BBR's ProbeRTT)."""


@dataclass(slots=True)
class MinRoundTrip:
    """The smallest round trip of the last `span` seconds, probed again when it expires."""

    span: float = RTT_SPAN
    probe: float = PROBE_SPAN
    _value: float | None = None  # the minimum measured last
    _stamp: float = 0.0  # when it was taken or last matched
    _best: float | None = None  # the probe's smallest sample so far (cycles sent in the probe)

    @property
    def value(self) -> float | None:
        """The minimum measured last, however old (None: no sample yet)."""
        return self._value

    def probing(self, now: float) -> bool:
        """Whether the minimum expired and no probe has measured it again: the owner holds back
        what it has in flight."""
        return self._value is not None and now > self._stamp + self.span

    def current(self, now: float) -> float | None:
        """The minimum while it is fresh; None before any sample and while probing."""
        return None if self.probing(now) else self._value

    def sample(self, seconds: float, now: float) -> None:
        """A cycle answered at `now` took `seconds`."""
        if self._value is None or seconds <= self._value:
            self._value, self._stamp, self._best = seconds, now, None
            return
        began = self._stamp + self.span
        if now <= began or now - seconds < began:
            return  # fresh, or a cycle sent before the probe: it may carry our own queue
        self._best = seconds if self._best is None else min(self._best, seconds)
        if now >= began + self.probe:
            self._value, self._stamp, self._best = self._best, now, None
