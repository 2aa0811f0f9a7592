"""`ReceiveBudget`: how many bytes of chunk frames the connection's answers invite at once,
across all the streams it receives (sans I/O: time is `now`).

A typedrequest initiator sends a stream's next chunk when the answer to its last one (or to
its `feedback` probe) says `backpressure: false`; so each such answer is an *invitation* for
one more frame. Every stream of a connection shares one TCP stream, and whatever is invited
queues at the peer and in the kernel ahead of everything the peer sends next: a request such as
a status call waits behind all of it. Sixteen streams inviting a ~4 MB Buffer-form frame each
put ~60 MB ahead of it.

The budget bounds that: an invitation counts its stream's last frame size until the stream's
next chunk or probe arrives (or `expiry` seconds pass, so an initiator that has nothing to send
holds no budget for long); an answer that would invite past `limit` bytes is *held*, not sent,
and held answers go out in the order they were held as invitations are used up, so the
streams take turns. One invitation is always allowed: a lone stream is never held, and a
frame larger than the limit still moves. Answers that invite nothing (backpressure, keep-alive
answers, a stream that is over) are never held.

Held answers are bounded by the number of streams (one in flight each); nothing here holds a
payload, only the small answer envelopes.

Sized from the measured round trip. A fixed budget is a ceiling on the streams' throughput
together of about one budget per round trip: fine next to Cloudly (a few milliseconds), but 8
MiB per 200 ms is 42 MB/s of frames, ~11 MB/s of payload in the Buffer form, whatever the link
could carry (measured: four stages at 200 ms moved 9.5 MB/s under it, 18.5 MB/s with a 64 MiB
budget and 17.3 MB/s sized as below; docs/benchmarks.md, "Far links"). So with a `ceiling` the
budget follows the link's bandwidth-delay product: the round trip is the smallest seen on the
connection in the last `round_trip.RTT_SPAN` seconds (its calls' round trips, told by the
connection through `round_trip()`, and each invitation's: answer out -> that stream's next chunk
in), the delivery rate the largest of the last `RATE_SPAN` seconds (each invitation used up is a
sample: the chunk bytes arrived since it went out, over that time), and the budget is twice
their product, never below `limit` (what it was tuned for next to Cloudly) nor above `ceiling`
(memory at the peer and in the kernel's buffers, and what a request may queue behind). The
smallest, not a recent one: once bytes queue on the link every later sample carries the queue,
and a budget sized from those would grow the queue it measures; the authentication's calls cross
an idle link. Of a span, not ever: a path whose round trip grew (a route change, a failover)
would keep the budget sized for the old one. When the smallest expires the budget probes
(`round_trip.MinRoundTrip`): a quarter of itself (half the product), never below `limit`, until
an invitation sent since is used up, whose round trip then carries little or none of the queue
the budget invites, and that is the smallest again. While the budget
is what holds the streams back the rate it delivers is `budget / rtt`, so it doubles per round
trip until the link (or the peer, or the agent) is the bound, and a request waits behind about
two round trips of bytes. Near Cloudly twice the product is far below `limit`: nothing changes
there.

`gate` (the connection's draw from the agent's byte budget, `agent.protocol.pool`): asked last,
before an answer goes; an answer it refuses is held like one past `limit`, first in line.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from agent.protocol.envelope import Envelope
from agent.protocol.round_trip import MinRoundTrip

__all__ = ["DEFAULT_ESTIMATE", "RATE_SPAN", "SIZE_MEMORY", "ReceiveBudget"]

DEFAULT_ESTIMATE: Final = 1 << 20
"""What an invitation counts before its stream sent any chunk (one 1 MiB chunk's payload)."""

RATE_SPAN: Final = 10.0
"""Seconds a delivery-rate sample counts towards the maximum."""

SIZE_MEMORY: Final = 4096
"""How many streams' last frame sizes are remembered (the least recently updated go first):
a long-running connection sees many streams come and go, and not every one ends in a way the
connection reports here."""


@dataclass(slots=True)
class _Invitation:
    size: int
    sent: float
    expires: float
    arrived: int  # chunk bytes arrived before it went out


@dataclass(slots=True)
class ReceiveBudget:
    """Invitations outstanding per stream, and the answers held until one is used up."""

    limit: int | None  # bytes; None: no bound
    expiry: float  # seconds an unused invitation counts
    ceiling: int | None = None  # bytes it may grow to from the measured round trip; None: never
    gate: Callable[[str], bool] | None = None  # may `stream_id` be invited now (byte budget)
    _invited: dict[str, _Invitation] = field(default_factory=dict)
    _rtt: MinRoundTrip = field(default_factory=MinRoundTrip)  # the smallest of the span, probed
    _arrived: int = 0  # chunk frame bytes arrived so far
    # (when, bytes per s), the rates falling: each sample a later, smaller one may still outlive
    _rates: deque[tuple[float, float]] = field(default_factory=deque)
    _held: deque[tuple[str, Envelope]] = field(default_factory=deque)
    _last_size: dict[str, int] = field(default_factory=dict)
    _used: int = 0

    @property
    def invited_bytes(self) -> int:
        """What the outstanding invitations count."""
        return self._used

    @property
    def held(self) -> int:
        """Answers waiting for room in the budget."""
        return len(self._held)

    def arrived(self, stream_id: str, *, size: int, chunk: bool, now: float | None = None) -> None:
        """A chunk (`chunk`) or a probe of `stream_id` arrived: its invitation is used up. With
        `now`, a chunk counts towards the delivery rate, and the round trip since its
        invitation went out is a sample."""
        if chunk:
            self._last_size.pop(stream_id, None)
            self._last_size[stream_id] = size
            if len(self._last_size) > SIZE_MEMORY:
                del self._last_size[next(iter(self._last_size))]
        invitation = self._invited.pop(stream_id, None)
        if invitation is not None:
            self._used -= invitation.size
        if chunk and now is not None and self.ceiling is not None:
            self._arrived += size
            if invitation is not None:
                took = now - invitation.sent
                self.round_trip(took, now)
                if took > 0:
                    rate = (self._arrived - invitation.arrived) / took
                    # Only what can still be the largest is kept: a sample at most this one,
                    # and older, never will be (the first is the largest of the span).
                    while self._rates and self._rates[-1][1] <= rate:
                        self._rates.pop()
                    self._rates.append((now, rate))
            self._forget_before(now - RATE_SPAN)

    def round_trip(self, seconds: float, now: float) -> None:
        """A round trip seen on the connection (a call's, an invitation's), ended at `now`."""
        self._rtt.sample(seconds, now)

    def limit_at(self, now: float) -> int | None:
        """The budget now: `limit`, or twice the measured bandwidth-delay product, up to
        `ceiling`; a quarter of that (half the product) while the round trip is probed (module
        docstring)."""
        if self.limit is None or self.ceiling is None or self.ceiling <= self.limit:
            return self.limit
        self._forget_before(now - RATE_SPAN)
        rtt = self._rtt.value
        if rtt is None or not self._rates:
            return self.limit
        product = 2 * self._rates[0][1] * rtt  # the largest rate of the span
        if self._rtt.probing(now):
            product /= 4
        return int(min(self.ceiling, max(self.limit, product)))

    def _forget_before(self, horizon: float) -> None:
        while self._rates and self._rates[0][0] <= horizon:
            self._rates.popleft()

    def admit(self, stream_id: str, answer: Envelope, now: float) -> list[Envelope]:
        """An answer that invites one more frame of `stream_id`: the answers to send now (it,
        and any held before it that fit), or none when it must wait its turn."""
        if self.limit is None and self.gate is None:
            return [answer]
        self._held.append((stream_id, answer))
        return self.release(now)

    def release(self, now: float) -> list[Envelope]:
        """Held answers that fit now, oldest first (none overtakes an earlier one)."""
        self._expire(now)
        limit = self.limit_at(now)
        sent: list[Envelope] = []
        while self._held:
            stream_id, answer = self._held[0]
            size = self._last_size.get(stream_id, DEFAULT_ESTIMATE)
            if self._invited and limit is not None and self._used + size > limit:
                break
            if self.gate is not None and not self.gate(stream_id):
                break
            self._held.popleft()
            self._invite(stream_id, size, now)
            sent.append(answer)
        return sent

    def forget(self, stream_id: str, now: float) -> list[Envelope]:
        """`stream_id` is over: its invitation no longer counts and its held answers go now
        (they invite nothing any more); then whatever else fits."""
        self.arrived(stream_id, size=0, chunk=False)
        self._last_size.pop(stream_id, None)
        mine = [answer for held_id, answer in self._held if held_id == stream_id]
        if mine:
            self._held = deque(item for item in self._held if item[0] != stream_id)
        return mine + self.release(now)

    def next_deadline(self) -> float | None:
        """When an invitation expires (and a held answer may go), if any is outstanding while
        answers wait."""
        if not self._held or not self._invited:
            return None
        return min(invitation.expires for invitation in self._invited.values())

    def clear(self) -> None:
        """The connection is gone: nothing is outstanding, nothing will be sent."""
        self._invited.clear()
        self._held.clear()
        self._last_size.clear()
        self._used = 0
        self._rates.clear()

    def _invite(self, stream_id: str, size: int, now: float) -> None:
        previous = self._invited.pop(stream_id, None)
        if previous is not None:
            self._used -= previous.size
        self._invited[stream_id] = _Invitation(size, now, now + self.expiry, self._arrived)
        self._used += size

    def _expire(self, now: float) -> None:
        for stream_id in [s for s, i in self._invited.items() if i.expires <= now]:
            self._used -= self._invited.pop(stream_id).size
