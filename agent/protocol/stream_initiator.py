"""The initiator side of one VirtualStream (wire.md §4.2-4.4): we fired the outer request, we drive.

At most one data cycle and one keep-alive cycle are in flight, as in typedrequest 3.3.0.
- Role SEND (the marker is in our request): `chunk` frames while we have data; a reply with
  `backpressure: true` pauses us, and we re-probe with `feedback` every `probe_interval`. The
  stream ENDS when the reply to the closing-bit chunk arrives.
- Role RECEIVE (the marker is in the reply to our call): `read` frames while our receive queue
  has room; the responder answers with a chunk and `next` (our own responder parks a `read`
  until it has data). A reply without a chunk and with `next: false` makes us wait one probe
  interval. The stream ENDS at the closing bit.
- Keep-alive: a `keepAlive` frame every `park_timeout` (`StreamSettings`); `idle_timeout`
  seconds without any answer breaks the stream, and so does a data cycle unanswered that long.
  An answer `keepAlive: false` before the end breaks it too (the responder gave up).
- A stream frame of ours that comes back unanswered (the TS router echoes frames for unknown
  streams; a 3.3.0 responder answers `read` with `response: null`) breaks the stream.
- After the end (or an abort) one `keepAlive: false` frame tells the responder to let go.

A stream starts PENDING until `arm()`: its frames must not overtake the request that carries
its marker. The producer may queue up to `window` chunks meanwhile. A RECEIVE stream is
`finished` (its connection lets it go) only once its reader took the end or the break, or
left (`stop_reading`): what arrived before the end stays readable after it.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable

from agent.errors import InvalidState, RemoteProtocolError, StreamBroken, StreamNotServed
from agent.protocol.chunks import CLOSING, ChunkForm, Closing, decode_chunk, encode_chunk
from agent.protocol.settings import StreamSettings
from agent.protocol.stream_frames import StreamPackage
from agent.protocol.stream_responder import Role

__all__ = ["TRANSITIONS", "InitiatorState", "InitiatorStream"]


class InitiatorState(enum.Enum):
    """Life of a stream we drive; ENDED and BROKEN are final."""

    PENDING = "pending"  # the marker has not gone out yet
    OPEN = "open"
    ENDED = "ended"
    BROKEN = "broken"


TRANSITIONS: dict[InitiatorState, frozenset[InitiatorState]] = {
    InitiatorState.PENDING: frozenset({InitiatorState.OPEN, InitiatorState.BROKEN}),
    InitiatorState.OPEN: frozenset({InitiatorState.ENDED, InitiatorState.BROKEN}),
    InitiatorState.ENDED: frozenset(),
    InitiatorState.BROKEN: frozenset(),
}

UNSERVED = "the peer did not serve the stream (unknown stream id, or it cannot answer read)"


class InitiatorStream:
    """One stream we drive."""

    def __init__(
        self,
        stream_id: str,
        role: Role,
        settings: StreamSettings,
        *,
        new_id: Callable[[], str],
    ) -> None:
        self.stream_id = stream_id
        self.role = role
        self.state = InitiatorState.PENDING
        self.broken_reason = ""
        self.not_served = False  # broken because the peer echoed our frame: it serves no `read`
        self._window = settings.window
        self._interval = settings.park_timeout
        self._timeout = settings.idle_timeout
        self._probe = settings.probe_interval
        self._new_id = new_id
        self._form: ChunkForm = settings.chunk_form
        self._queue: deque[bytes | Closing] = deque()
        self._queued_close = False
        self._last_ok = 0.0
        self._data_cycle: str | None = None
        self._data_item: bytes | Closing | None = None
        self._data_sent_at = 0.0
        self._keepalive_cycle: str | None = None
        self._keepalive_at = 0.0
        self._remote_backpressured = False
        self._not_before = 0.0  # earliest time for the next data frame (probe / empty read)
        self._farewell_sent = False
        self._armed = False
        self._reader_done = False  # RECEIVE: the reader took the end (or the break), or left
        self.end_reported = False  # the connection told its driver the stream is over

    # --- driving --------------------------------------------------------------------------

    def arm(self, now: float) -> None:
        """The request carrying the marker has gone out: start driving."""
        self._move(InitiatorState.OPEN)
        self._armed = True
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
            data = self._data_frame(now)
            if data is not None:
                self._data_cycle, self._data_sent_at = data.cycle_id, now
                frames.append(data)
        elif self._armed and not self._farewell_sent:
            self._farewell_sent = True
            frames.append(self._frame("keepAlive", keep_alive=False))
        return frames

    def _data_frame(self, now: float) -> StreamPackage | None:
        if self._data_cycle is not None or now < self._not_before:
            return None
        if self.role is Role.RECEIVE:
            if len(self._queue) >= self._window:
                return None
            return self._frame("read", next=False, backpressure=False)
        if self._remote_backpressured:
            return self._frame("feedback", next=bool(self._queue), backpressure=False)
        if not self._queue:
            return None
        item = self._queue.popleft()
        self._data_item = item
        return self._frame(
            "chunk",
            next=bool(self._queue),
            backpressure=False,
            chunk=encode_chunk(item, self._form),
        )

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
        out (the events that change that, a write or a take, make the driver poll anyway).
        """
        if self.state is not InitiatorState.OPEN:
            return None
        times = [self._last_ok + self._timeout]
        if self._keepalive_cycle is None:
            times.append(self._keepalive_at)
        if self._data_cycle is not None:
            times.append(self._data_sent_at + self._timeout)
        elif self._not_before > 0 and self._could_send_data():
            times.append(self._not_before)
        return min(times)

    def _could_send_data(self) -> bool:
        if self.role is Role.RECEIVE:
            return len(self._queue) < self._window
        return self._remote_backpressured or bool(self._queue)

    @property
    def finished(self) -> bool:
        """Over and said so, and (RECEIVE) its reader took the end or left: nothing more will
        be polled out of this stream or taken from it."""
        said = self.done and (self._farewell_sent or not self._armed)
        return said and (self.role is Role.SEND or self._reader_done)

    def _check_timeouts(self, now: float) -> None:
        if self.state is not InitiatorState.OPEN:
            return
        if now - self._last_ok > self._timeout:
            self._break(f"no answer from the responder within {self._timeout:g} s")
        elif self._data_cycle is not None and now - self._data_sent_at > self._timeout:
            self._break(f"a data frame got no answer within {self._timeout:g} s")

    # --- answers ----------------------------------------------------------------------------

    def on_reply(self, cycle_id: str, package: StreamPackage, now: float) -> None:
        """Account the answer to one of our cycles."""
        if cycle_id == self._keepalive_cycle:
            self._keepalive_cycle = None
            self._on_keepalive(package, now)
        elif cycle_id == self._data_cycle:
            self._data_cycle = None
            self._on_data(package, now)
        # else: the answer to the farewell frame, or one after the end: nothing to do

    def on_unserved(self, cycle_id: str) -> None:
        """One of our frames came back unanswered."""
        if cycle_id in (self._keepalive_cycle, self._data_cycle):
            self._keepalive_cycle = self._data_cycle = None
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

    def _on_data(self, package: StreamPackage, now: float) -> None:
        if self.state is not InitiatorState.OPEN:
            return
        self._last_ok = now
        if self.role is Role.SEND:
            sent, self._data_item = self._data_item, None
            self._remote_backpressured = bool(package.backpressure)
            self._not_before = now + self._probe if self._remote_backpressured else 0.0
            if sent is CLOSING:
                self._move(InitiatorState.ENDED)
            return
        if package.chunk_data is None:
            self._not_before = 0.0 if package.next else now + self._probe
            return
        try:
            item = decode_chunk(package.chunk_data)
        except RemoteProtocolError as exc:
            self._break(f"undecodable chunk: {exc}")
            return
        self._queue.append(item)
        self._not_before = 0.0
        if item is CLOSING:
            self._move(InitiatorState.ENDED)

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
        self._queued_close = True
        self._queue.append(CLOSING)

    def take(self) -> bytes | Closing | None:
        """RECEIVE: the next item, None if none yet; raises `StreamBroken` once broken."""
        if self.role is not Role.RECEIVE:
            raise InvalidState("take() on a stream we send on")
        if self._queue:
            item = self._queue.popleft()
            if item is CLOSING:
                self._reader_done = True
            return item
        if self.state is InitiatorState.BROKEN:
            self._reader_done = True
            raise self._broken_error()
        return None

    def stop_reading(self) -> None:
        """RECEIVE: the reader left before the end: drop what is queued, break if still open."""
        self._reader_done = True
        self._queue.clear()
        self.abort("the reader stopped")

    def abort(self, reason: str) -> None:
        """Break the stream locally (no closing bit is sent)."""
        if self.state in (InitiatorState.PENDING, InitiatorState.OPEN):
            self._break(reason)

    @property
    def done(self) -> bool:
        """Whether the stream is over (ENDED or BROKEN)."""
        return self.state in (InitiatorState.ENDED, InitiatorState.BROKEN)

    @property
    def broken(self) -> bool:
        """Whether the stream is over without its end."""
        return self.state is InitiatorState.BROKEN

    def _check_producer(self) -> None:
        if self.role is not Role.SEND:
            raise InvalidState("producer call on a stream we receive on")
        if self.state is InitiatorState.BROKEN:
            raise self._broken_error()
        if self._queued_close:
            raise InvalidState("the stream is already closed")

    def _move(self, to: InitiatorState) -> None:
        if to not in TRANSITIONS[self.state]:
            raise InvalidState(f"stream {self.stream_id}: {self.state.value} -> {to.value}")
        self.state = to

    def _broken_error(self) -> StreamBroken:
        kind = StreamNotServed if self.not_served else StreamBroken
        return kind(f"stream {self.stream_id} broke: {self.broken_reason}")

    def _break(self, reason: str) -> None:
        self._move(InitiatorState.BROKEN)
        self.broken_reason = reason
        if self.role is Role.SEND:
            self._queue.clear()
