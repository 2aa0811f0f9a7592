"""The initiator side of one VirtualStream (wire.md §4.2-4.4): we fired the outer request, we drive.

Its life is `INITIATOR_TABLE` (`agent.table.TransitionTable`); what it has in flight is data: the
cycles it sent and awaits (`_cycles`), one keep-alive cycle, its queue.

A window of data cycles is in flight, not one (typedrequest 3.3.0 waits for each answer before
it sends the next frame, so it moves one chunk per round trip; over a far link that is the
whole rate):
- Role SEND (the marker is in our request): first one `feedback` probe, as typedrequest 3.3.0
  sends (wire.md §4.3), and no chunk until an answer says `backpressure: false`: a responder that
  has not begun to read is sent nothing it did not invite (ours holds the probe until its handler
  reads, and a chunk that came before would have to be drawn from its byte budget at once or break
  the stream; four stages opened at once broke so). Then `chunk` frames while we have data, at
  most `window` chunks and `window_bytes` of payload unanswered at once (one always goes), and no
  more payload than the link carries in two round trips: the round trip is the smallest of the
  last `round_trip.RTT_SPAN` seconds (its chunks' answers, and the connection's calls',
  `path_rtt`: they cross an idle link first), the delivery rate the largest of the last
  `RATE_SPAN` seconds (each answer is a sample: the payload answered since its chunk went out,
  over that time); twice their product, the link's bandwidth-delay product, and one chunk more (so
  one chunk in flight can become two) bounds what is in flight (a quarter of `window_bytes` until
  the first chunk is answered). The smallest round trip, not a recent one: once chunks queue on
  the link every answer carries the queue, and an allowance sized from those would grow the queue
  it measures. Of a span, not ever: a path whose round trip grew (a route change, a failover)
  would stay sized for the old one, one chunk per round trip. When the stream's smallest round
  trip expires it probes (`round_trip.MinRoundTrip`): a quarter of the allowance in flight (half
  the product; one cycle where the allowance is about a chunk) until a cycle sent in the probe is
  answered, whose round trip carries none of its own queue; the best rate of the span sets the
  allowance again at once. A round trip that shrinks counts at once. A fast far link
  so fills the window; a slow one (a few Mbit/s) keeps about two round trips of bytes queued
  instead of the whole window, so the session's pings and requests do not wait behind half a
  minute of frames. An answer with `backpressure: true` stops us: no new chunk goes out until
  an answer says `false`, and once nothing is in flight we probe with `feedback` every
  `probe_interval`. So a
  typedrequest 3.3.0 responder, whose receive queue holds 16 items and whose `push` never
  refuses, holds at most `window` + 16 chunks; our own responder, which reports backpressure
  at `window` chunks or `window_bytes` and breaks a stream pushed past twice either, never
  sees a well-behaved initiator go past it (each chunk in flight was sent before the first
  backpressure answer, and together they are at most one window). The stream ENDS when the
  answer to the closing-bit chunk arrives (answers come in the order of the frames).
- Role RECEIVE (the marker is in the reply to our call): `read` frames while our queue and the
  reads in flight have room (`window` chunks; `window_bytes` counting each read as the largest
  chunk seen), and while the reads in flight would bring no more than the allowance above
  (each answer's chunk is a delivery, measured as a sender measures its answers: the answers
  queued on a slow link stay within two round trips, and none waits past `idle_timeout`). It
  ramps up as a sender does: one read until the first chunk came (and after every empty
  answer: a responder with nothing to send is asked once per answer, not `window` times), then
  twice what the last round trip brought. An empty answer with `next: false` makes us wait one
  probe interval. The stream ENDS at the closing
  bit; chunks are queued in the order their answers arrive, which is the order the responder
  gave them out.
- Keep-alive: a `keepAlive` frame every `park_timeout` (`StreamSettings`), one in flight;
  `idle_timeout` seconds without any answer breaks the stream, and so does a data cycle
  unanswered that long. An answer `keepAlive: false` before the end breaks it too (the
  responder gave up).
- A stream frame of ours that comes back unanswered (the TS router echoes frames for unknown
  streams; a 3.3.0 responder answers `read` with `response: null`) breaks the stream.
- After the end (or a break) one `keepAlive: false` frame tells the responder to let go
  (`farewell`); then the stream is OVER.

A stream starts PENDING until `arm()`: its frames must not overtake the request that carries
its marker. The producer may queue up to `window` chunks meanwhile. A RECEIVE stream is
`finished` (its connection lets it go) only once it is OVER and its reader took the end or the
break, or left (`stop_reading`): what arrived before the end stays readable after it.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from agent.errors import InvalidState, RemoteProtocolError, StreamBroken
from agent.protocol.chunks import CLOSING, ChunkForm, Closing, decode_chunk, encode_chunk
from agent.protocol.events import broken_error
from agent.protocol.round_trip import MinRoundTrip
from agent.protocol.settings import StreamSettings
from agent.protocol.stream_frames import StreamPackage
from agent.protocol.stream_responder import Role
from agent.table import TransitionTable

__all__ = ["INITIATOR_TABLE", "RATE_SPAN", "InitiatorEvent", "InitiatorState", "InitiatorStream"]


class InitiatorState(enum.Enum):
    """Life of a stream we drive; OVER is final."""

    PENDING = "pending"  # the marker has not gone out yet
    OPEN = "open"
    ENDED = "ended"  # the end went through; the farewell is due
    BROKEN = "broken"  # broke while open; the farewell is due
    OVER = "over"  # nothing more goes out (`broken_reason` says how it ended)


class InitiatorEvent(enum.Enum):
    """What moves a stream we drive."""

    ARM = "arm"
    END = "end"
    BREAK = "break"
    FAREWELL = "farewell"


_S, _E = InitiatorState, InitiatorEvent

INITIATOR_TABLE: Final = TransitionTable[InitiatorState, InitiatorEvent].noted(
    {
        (_S.PENDING, _E.ARM): (_S.OPEN, "the request carrying its marker went out"),
        (_S.PENDING, _E.BREAK): (_S.OVER, "aborted before its marker went out: nothing to say"),
        (_S.OPEN, _E.END): (
            _S.ENDED,
            "SEND: the closing bit's answer came; RECEIVE: the closing bit came",
        ),
        (_S.OPEN, _E.BREAK): (
            _S.BROKEN,
            "no answer within `idle_timeout`, our frame echoed, `keepAlive: false`, an "
            "undecodable chunk, or a local abort",
        ),
        (_S.ENDED, _E.FAREWELL): (_S.OVER, "one `keepAlive: false` frame went out"),
        (_S.BROKEN, _E.FAREWELL): (_S.OVER, "one `keepAlive: false` frame went out"),
    }
)
"""How a stream we drive moves (docs/wire-notes.md embeds `render()`, checked by a test)."""

UNSERVED = "the peer did not serve the stream (unknown stream id, or it cannot answer read)"

RATE_SPAN: Final = 10.0
"""Seconds a delivery-rate sample of a stream we send on counts towards its maximum."""


@dataclass(slots=True)
class _Cycle:
    """A data cycle in flight: what it asked, when, and (SEND) what it carried."""

    purpose: str  # "chunk", "read" or "feedback"
    sent_at: float
    item: bytes | Closing | None = None
    size: int = 0  # payload bytes of a chunk
    delivered: int = 0  # payload answered before it went out


class InitiatorStream:
    """One stream we drive."""

    def __init__(
        self,
        stream_id: str,
        role: Role,
        settings: StreamSettings,
        *,
        new_id: Callable[[], str],
        path_rtt: Callable[[float], float | None] = lambda now: None,
    ) -> None:
        """`path_rtt(now)` says the smallest round trip its connection's calls measured, while
        that is fresh (None: none, or it expired; `round_trip.MinRoundTrip.current`)."""
        self.stream_id = stream_id
        self.role = role
        self.state = InitiatorState.PENDING
        self.broken_reason = ""  # why it broke; empty while it has not
        self.not_served = False  # broken because the peer echoed our frame: it serves no `read`
        self.malformed = False  # broken at a chunk that does not decode
        self._window = settings.window
        self._cycles_max = settings.cycles or settings.window  # data cycles in flight at most
        self._window_bytes = settings.window_bytes
        self._interval = settings.park_timeout
        self._timeout = settings.idle_timeout
        self._probe = settings.probe_interval
        self._new_id = new_id
        self._form: ChunkForm = settings.chunk_form
        # SEND: what the producer queued, not sent yet; RECEIVE: what came, not taken yet.
        self._queue: deque[bytes | Closing] = deque()
        self._queued_bytes = 0  # RECEIVE: payload bytes in the queue
        self._cycles: dict[str, _Cycle] = {}  # data cycles in flight, oldest first
        self._in_flight_bytes = 0  # SEND: payload bytes of the chunks in flight
        # SEND: what the link carries (answers' round trips, payload answered), and so how much
        # payload may be in flight: a quarter of the window until the first chunk's answer.
        self._path_rtt = path_rtt
        self._rtt = MinRoundTrip()  # the smallest answer round trip of this stream, probed
        self._delivered = 0  # payload answered so far
        self._rates: deque[tuple[float, float]] = deque()  # (when, bytes per s), rates falling
        self._allowance = max(1, settings.window_bytes // 4)
        self._keepalive_cycle: str | None = None
        self._keepalive_at = 0.0
        self._last_ok = 0.0
        # SEND: what the latest answer said; before any, that it holds us (we probe first).
        self._peer_backpressure = role is Role.SEND
        self._not_before = 0.0  # earliest time for the next data frame (probe / empty read)
        self._reads_allowed = 1  # RECEIVE: reads in flight at once (one until a chunk came)
        self._largest_chunk = 0  # RECEIVE: what one read may bring, for the byte window
        self._reader_done = False  # RECEIVE: the reader took the end (or the break), or left
        self.end_reported = False  # the connection told its driver the stream is over

    # --- driving --------------------------------------------------------------------------

    def arm(self, now: float) -> None:
        """The request carrying the marker has gone out: start driving."""
        self._move(InitiatorEvent.ARM)
        self._last_ok = now
        self._keepalive_at = now

    def poll(self, now: float) -> list[StreamPackage]:
        """Frames to send now (their cycle ids are now outstanding)."""
        self._check_timeouts(now)
        frames: list[StreamPackage] = []
        if self.state is InitiatorState.OPEN:
            if self._keepalive_cycle is None and now >= self._keepalive_at:
                frames.append(self._frame("keepAlive", keep_alive=True))
                self._keepalive_cycle = frames[-1].cycle_id
                self._keepalive_at = now + self._interval
            if now >= self._not_before:
                frames += self._data_frames(now)
        elif self.state in (InitiatorState.ENDED, InitiatorState.BROKEN):
            self._move(InitiatorEvent.FAREWELL)
            frames.append(self._frame("keepAlive", keep_alive=False))
        return frames

    def _data_frames(self, now: float) -> list[StreamPackage]:
        frames: list[StreamPackage] = []
        if self.role is Role.RECEIVE:
            while self._may_read(now):
                frames.append(self._send(self._frame("read", next=False, backpressure=False), now))
            return frames
        if self._peer_backpressure:
            if not self._cycles:  # the answers in flight will tell us first
                probe = self._frame("feedback", next=bool(self._queue), backpressure=False)
                frames.append(self._send(probe, now))
            return frames
        while self._queue and self._room_for(self._queue[0], now):
            item = self._queue.popleft()
            frame = self._frame(
                "chunk",
                next=bool(self._queue),
                backpressure=False,
                chunk=encode_chunk(item, self._form),
            )
            size = 0 if item is CLOSING else len(item)
            frames.append(self._send(frame, now, item=item, size=size))
        return frames

    def _send(
        self,
        frame: StreamPackage,
        now: float,
        *,
        item: bytes | Closing | None = None,
        size: int = 0,
    ) -> StreamPackage:
        self._cycles[frame.cycle_id] = _Cycle(frame.main_purpose, now, item, size, self._delivered)
        self._in_flight_bytes += size
        return frame

    def _room_for(self, item: bytes | Closing, now: float) -> bool:
        """SEND: whether `item` may go out at `now`: the window has room in chunks and in
        bytes (the first chunk in flight always goes, however large; `_allowed`)."""
        if len(self._cycles) >= self._cycles_max:
            return False
        size = 0 if item is CLOSING else len(item)
        return not self._cycles or self._in_flight_bytes + size <= self._allowed(now)

    def _may_read(self, now: float) -> bool:
        """RECEIVE: whether one more `read` may go out at `now`."""
        reads = len(self._cycles)
        return (
            reads < min(self._reads_allowed, self._cycles_max)
            and len(self._queue) + reads < self._window
            and self._queued_bytes + reads * self._largest_chunk < self._window_bytes
            and (reads == 0 or (reads + 1) * self._largest_chunk <= self._allowed(now))
        )

    def _allowed(self, now: float) -> int:
        """The payload that may be in flight at `now`: the allowance, and a quarter of it (half
        the bandwidth-delay product) while the round trip is probed: no queue of our own then
        lies ahead of a cycle sent, and the link still carries half its rate (BBR's ProbeRTT
        keeps four packets; half the product is what its second version keeps). Where the
        allowance is one chunk (the stale near minimum of a path that grew) it is one cycle."""
        return self._allowance // 4 if self._rtt.probing(now) else self._allowance

    def _frame(
        self,
        purpose: str,
        *,
        keep_alive: bool | None = None,
        next: bool | None = None,  # the wire name
        backpressure: bool | None = None,
        chunk: object = None,
    ) -> StreamPackage:
        return StreamPackage(
            stream_id=self.stream_id,
            cycle_id=self._new_id(),
            cycle="request",
            main_purpose=purpose,  # type: ignore[arg-type]  # one of the literals above
            keep_alive=keep_alive,
            next=next,
            backpressure=backpressure,
            chunk_data=chunk,
        )

    def next_wakeup(self) -> float | None:
        """The next time `poll` has something timed to do (None: only events matter).

        A time it reports is one at which `poll` acts, so a driver that wakes then never finds
        the same time reported again: the data pause counts only while a data frame could go
        out then (the events that change that, an answer, a write or a take, make the driver
        poll anyway).
        """
        if self.state is not InitiatorState.OPEN:
            return None
        times = [self._last_ok + self._timeout]
        if self._keepalive_cycle is None:
            times.append(self._keepalive_at)
        if self._cycles:
            times.append(next(iter(self._cycles.values())).sent_at + self._timeout)
        if self._not_before > 0 and self._could_send_data(self._not_before):
            times.append(self._not_before)
        return min(times)

    def _could_send_data(self, now: float) -> bool:
        """Whether `_data_frames` would send a frame at `now`, the pause aside."""
        if self.role is Role.RECEIVE:
            return self._may_read(now)
        if self._peer_backpressure:
            return not self._cycles
        return bool(self._queue) and self._room_for(self._queue[0], now)

    @property
    def finished(self) -> bool:
        """OVER, and (RECEIVE) its reader took the end or left: nothing more will be polled out
        of this stream or taken from it."""
        over = self.state is InitiatorState.OVER
        return over and (self.role is Role.SEND or self._reader_done)

    def _check_timeouts(self, now: float) -> None:
        if self.state is not InitiatorState.OPEN:
            return
        if now - self._last_ok > self._timeout:
            self._break(f"no answer from the responder within {self._timeout:g} s")
        elif self._cycles and now - next(iter(self._cycles.values())).sent_at > self._timeout:
            self._break(f"a data frame got no answer within {self._timeout:g} s")

    # --- answers ----------------------------------------------------------------------------

    def on_reply(self, cycle_id: str, package: StreamPackage, now: float) -> None:
        """Account the answer to one of our cycles."""
        if cycle_id == self._keepalive_cycle:
            self._keepalive_cycle = None
            self._on_keepalive(package, now)
            return
        cycle = self._cycles.pop(cycle_id, None)
        if cycle is not None:
            self._in_flight_bytes -= cycle.size
            self._on_data(cycle, package, now)
        # else: the answer to the farewell frame, or one after the end: nothing to do

    def on_unserved(self, cycle_id: str) -> None:
        """One of our frames came back unanswered."""
        if cycle_id != self._keepalive_cycle and cycle_id not in self._cycles:
            return
        if self.state is InitiatorState.OPEN:
            self._break(UNSERVED)
            # An echoed `read`: this peer serves no stream in a response (StreamNotServed);
            # an echoed data frame of ours is a break like any other.
            self.not_served = self.role is Role.RECEIVE

    def _on_keepalive(self, package: StreamPackage, now: float) -> None:
        if self.state is not InitiatorState.OPEN:
            return
        self._last_ok = now
        if package.keep_alive is False and not (self.role is Role.RECEIVE and package.next):
            self._break("the responder stopped the stream before its end")
        elif package.next:
            self._not_before = 0.0  # it has data for us now

    def _on_data(self, cycle: _Cycle, package: StreamPackage, now: float) -> None:
        if self.state is not InitiatorState.OPEN:
            return
        self._last_ok = now
        if self.role is Role.SEND:
            if cycle.purpose == "chunk":
                self._measure(cycle, cycle.size, now)
            self._peer_backpressure = bool(package.backpressure)
            self._not_before = now + self._probe if self._peer_backpressure else 0.0
            if cycle.item is CLOSING:
                self._move(InitiatorEvent.END)
            return
        if package.chunk_data is None:
            self._reads_allowed = 1
            self._not_before = 0.0 if package.next else now + self._probe
            return
        try:
            item = decode_chunk(package.chunk_data)
        except RemoteProtocolError as exc:
            self._break(f"undecodable chunk: {exc}")
            self.malformed = True
            return
        self._queue.append(item)
        self._not_before = 0.0
        self._reads_allowed = self._window
        if item is CLOSING:
            self._move(InitiatorEvent.END)
        else:
            self._queued_bytes += len(item)
            self._largest_chunk = max(self._largest_chunk, len(item))
            self._measure(cycle, len(item), now)

    def _measure(self, cycle: _Cycle, size: int, now: float) -> None:
        """A cycle's answer moved `size` bytes of payload (SEND: its chunk answered; RECEIVE: a
        chunk in answer to its read): a round trip and a delivery rate; the allowance follows
        (module docstring): twice the bandwidth-delay product and one chunk, within
        `window_bytes`."""
        self._delivered += size
        took = now - cycle.sent_at
        self._rtt.sample(took, now)
        if took > 0:
            rate = (self._delivered - cycle.delivered) / took
            # Only what can still be the largest is kept (the first is the span's largest).
            while self._rates and self._rates[-1][1] <= rate:
                self._rates.pop()
            self._rates.append((now, rate))
        while self._rates and self._rates[0][0] <= now - RATE_SPAN:
            self._rates.popleft()
        path, own = self._path_rtt(now), self._rtt.value
        assert own is not None  # sampled above
        rtt = own if path is None else min(own, path)
        rate = self._rates[0][1] if self._rates else 0.0
        # One chunk on top: a sample taken with n in flight says at most n, so twice it alone
        # would never let a lone chunk become two (its round trip is never below the minimum).
        self._allowance = int(min(self._window_bytes, 2 * rate * rtt + size))

    @property
    def allowance(self) -> int:
        """SEND: payload bytes that may be in flight now (one chunk always goes)."""
        return self._allowance

    # --- the local side ---------------------------------------------------------------------

    def has_space(self) -> bool:
        """SEND: whether `write` may queue one more chunk now."""
        return len(self._queue) < self._window

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """SEND: queue `data` (wait for `has_space()` first)."""
        self._check_producer()
        if not self.has_space():
            raise InvalidState("write() on a full send queue; wait for has_space()")
        if data:
            self._queue.append(bytes(data))

    def close(self) -> None:
        """SEND: queue the closing bit after the data."""
        self._check_producer()
        self._queue.append(CLOSING)

    def take(self) -> bytes | Closing | None:
        """RECEIVE: the next item, None if none yet; raises `StreamBroken` once broken."""
        if self.role is not Role.RECEIVE:
            raise InvalidState("take() on a stream we send on")
        if self._queue:
            item = self._queue.popleft()
            if item is CLOSING:
                self._reader_done = True
            else:
                self._queued_bytes -= len(item)
            return item
        if self.broken:
            self._reader_done = True
            raise self._broken_error()
        return None

    def stop_reading(self) -> None:
        """RECEIVE: the reader left before the end: drop what is queued, break if still open."""
        self._reader_done = True
        self._queue.clear()
        self._queued_bytes = 0
        self.abort("the reader stopped")

    def abort(self, reason: str) -> None:
        """Break the stream locally (no closing bit is sent)."""
        if self.state in (InitiatorState.PENDING, InitiatorState.OPEN):
            self._break(reason)

    @property
    def done(self) -> bool:
        """Whether the stream is over (its end went through, or it broke)."""
        return self.state not in (InitiatorState.PENDING, InitiatorState.OPEN)

    @property
    def broken(self) -> bool:
        """Whether the stream is over without its end."""
        return bool(self.broken_reason)

    @property
    def in_flight(self) -> int:
        """Data cycles sent and not answered yet."""
        return len(self._cycles)

    def _producer_closed(self) -> bool:
        """SEND: whether the producer queued the closing bit (still queued, in flight, or
        through)."""
        if self.state in (InitiatorState.ENDED, InitiatorState.OVER) and not self.broken:
            return True
        return any(item is CLOSING for item in self._queue) or any(
            cycle.item is CLOSING for cycle in self._cycles.values()
        )

    def _check_producer(self) -> None:
        if self.role is not Role.SEND:
            raise InvalidState("producer call on a stream we receive on")
        if self.broken:
            raise self._broken_error()
        if self._producer_closed():
            raise InvalidState("the stream is already closed")

    def _move(self, event: InitiatorEvent) -> None:
        self.state = INITIATOR_TABLE.next(self.state, event, subject=f"stream {self.stream_id}")

    def _broken_error(self) -> StreamBroken:
        return broken_error(self.stream_id, self.broken_reason, self.not_served, self.malformed)

    def _break(self, reason: str) -> None:
        self._move(InitiatorEvent.BREAK)
        self.broken_reason = reason
        self._cycles.clear()
        self._in_flight_bytes = 0
        self._keepalive_cycle = None
        if self.role is Role.SEND:
            self._queue.clear()
