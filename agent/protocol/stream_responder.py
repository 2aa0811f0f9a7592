"""The responder side of one VirtualStream (wire.md §4.2-4.4): we only answer the peer's frames.

The peer that fired the outer request is the initiator and drives all stream traffic; we are
the responder for every marker in a request we handle (role RECEIVE: the initiator sends
`chunk`s) and for every marker we put into a response (role SEND: the initiator sends `read`).

Answers follow typedrequest 3.3.0 (`handleStreamTr`): `keepAlive` -> our keep-alive flag,
`next` (we have data to send) and `backpressure` (our receive queue is full); `feedback` -> the
same without the flag; `chunk` -> a `feedback` package with `request: null`. Where TS echoes
the frame's `request`, we echo the package as we read it, without its `chunkData`: an answer
never carries the peer's payload back (`stream_frames.stream_reply`). Beyond 3.3.0 we
answer `read` with the next chunk and `next`. A `read` that finds the queue empty while the
stream is still open is parked (long poll) until data arrives or `park_timeout` passes, so an
initiator that reads while `next` is true neither spins nor stalls.

Pipelined receive: a chunk whose payload is at least `inline_decode_max` characters (a
`RawChunk`: the frame decoder cut it out undecoded) is answered as soon as it is queued, as a
`PendingChunk`; the driver decodes it off the event loop (`PendingChunk.decode()`, pure) and
reports the outcome with `settle()`. A chunk that does not decode breaks the stream
(`undecodable chunk: ...`): what came before it is still delivered, nothing after it is. The
consumer only ever sees decoded bytes, in order (`take()` waits for the oldest chunk to be
settled); a closing bit behind undecoded chunks ends the stream once they all decoded. A frame
of the stream that arrives while one of its chunks is still being decoded waits (`handle`
answers None) and is answered by `release()` once the chunk is settled, so a bad chunk has
broken the stream before the peer's next frame of it is answered: one frame later at most
(frames of other streams, and requests, do not wait). At most `2 x window` frames may wait;
more break the stream. Smaller chunks are decoded at once, as before.

Bounds: the receive queue holds at most `window` chunks, and at most `window_bytes` bytes
(a queued chunk counts the frame it keeps alive until it is decoded, then its bytes), before we
report backpressure; a stream whose reader is not ready yet (`held`: its request waits for a
transfer slot) reports backpressure whatever it holds, so its initiator probes instead of
sending and the stream holds no more than it took before; a peer that keeps sending past twice
either bound breaks the stream. The send queue holds `window` chunks; the producer waits for
`has_space()`. Memory per stream is at most 2 x `window_bytes` of queued frames, never stream
length.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass

from agent.errors import InvalidState, RemoteProtocolError, StreamBroken
from agent.protocol.chunks import (
    CLOSING,
    ChunkForm,
    Closing,
    RawChunk,
    decode_chunk,
    encode_chunk,
)
from agent.protocol.envelope import Envelope
from agent.protocol.settings import StreamSettings
from agent.protocol.stream_frames import Purpose, StreamPackage, stream_reply

__all__ = ["TRANSITIONS", "PendingChunk", "ResponderStream", "Role", "StreamState"]


class Role(enum.Enum):
    """Which way the bytes go, seen from us."""

    RECEIVE = "receive"
    SEND = "send"


class StreamState(enum.Enum):
    """Life of a stream; ENDED and BROKEN are final."""

    OPEN = "open"
    ENDED = "ended"  # the closing bit went through
    BROKEN = "broken"


# One transition table for both roles; an illegal move raises and changes nothing.
TRANSITIONS: dict[StreamState, frozenset[StreamState]] = {
    StreamState.OPEN: frozenset({StreamState.ENDED, StreamState.BROKEN}),
    StreamState.ENDED: frozenset(),
    StreamState.BROKEN: frozenset(),
}


class PendingChunk:
    """A received chunk queued before it was decoded (identity matters: `settle()` finds it)."""

    __slots__ = ("data", "raw", "size")

    def __init__(self, raw: RawChunk) -> None:
        self.raw: RawChunk | None = raw
        self.data: bytes | None = None
        self.size = raw.frame_bytes  # what it holds now, for the window

    def __repr__(self) -> str:
        state = "pending" if self.data is None else f"{len(self.data)} bytes"
        return f"PendingChunk({state})"

    def decode(self) -> bytes:
        """Decode the raw payload (pure; safe in a worker thread): `RemoteProtocolError` if it
        is no chunk, or was dropped meanwhile (its stream broke: `settle` ignores it then)."""
        raw = self.raw
        if raw is None:
            raise RemoteProtocolError("the chunk was dropped before it was decoded")
        return raw.decode()

    def decode_quick(self) -> bytes | None:
        """The bytes if a quick decoder takes them at once (`RawChunk.decode_quick`, fit for
        the event loop), else None: `decode()` in a worker thread."""
        return None if self.raw is None else self.raw.decode_quick()


Item = bytes | Closing | PendingChunk


@dataclass(slots=True)
class _Parked:
    env: Envelope
    package: StreamPackage
    deadline: float


class ResponderStream:
    """One stream we answer for."""

    not_served = False  # only a stream we drive can find its peer serving none

    def __init__(self, stream_id: str, role: Role, settings: StreamSettings, *, now: float) -> None:
        self.stream_id = stream_id
        self.role = role
        self.state = StreamState.OPEN
        self.broken_reason = ""
        self.last_seen = now
        self.closed_at: float | None = None  # when ENDED/BROKEN was reached
        self._window = settings.window
        self._window_bytes = settings.window_bytes
        self._inline_max = settings.inline_decode_max
        self._idle_timeout = settings.idle_timeout
        self._park_timeout = settings.park_timeout
        self._form: ChunkForm = settings.chunk_form
        self._queue: deque[Item] = deque()
        self._queued_bytes = 0  # RECEIVE: what the queue holds, for the byte window
        self._unsettled = 0  # RECEIVE: queued chunks not decoded yet
        self._closing = False  # RECEIVE: the closing bit is queued behind unsettled chunks
        self.received: list[PendingChunk] = []  # RECEIVE: queued undecoded; the driver drains it
        # RECEIVE: frames that arrived while a chunk was being decoded, answered after it
        self._deferred: deque[tuple[Envelope, StreamPackage, float]] = deque()
        self._queued_close = False  # SEND: the producer called close()
        self._abandoned = False  # RECEIVE: nobody will read; accept and discard
        self.held = False  # RECEIVE: the reader is not ready yet; answer backpressure
        self._parked: _Parked | None = None
        self.end_reported = False  # the connection told its driver the stream is over

    # --- frames from the initiator -------------------------------------------------------

    def handle(self, env: Envelope, package: StreamPackage, now: float) -> Envelope | None:
        """The answer to one stream frame, or None when a `read` is parked or the frame waits
        behind a chunk not decoded yet (`release()` answers it once that chunk is settled)."""
        if self._unsettled or self._deferred:
            self.last_seen = now
            self._deferred.append((env, package, now))
            if len(self._deferred) > 2 * self._window:
                self._break("the initiator ignored backpressure", now)
            return None
        return self._handle_now(env, package, now)

    def release(self) -> list[Envelope]:
        """Answer the frames that waited for the stream's chunks to be decoded, in order, until
        one leaves a chunk to decode again (or none waits)."""
        answers: list[Envelope] = []
        while self._deferred and not self._unsettled:
            env, package, at = self._deferred.popleft()
            answer = self._handle_now(env, package, at)
            if answer is not None:
                answers.append(answer)
        return answers

    @property
    def queued_bytes(self) -> int:
        """What the receive queue holds, for the byte window (frames until decoded, then bytes)."""
        return self._queued_bytes

    @property
    def waiting(self) -> int:
        """Frames waiting for the stream's chunks to be decoded."""
        return len(self._deferred)

    def _handle_now(self, env: Envelope, package: StreamPackage, now: float) -> Envelope | None:
        self.last_seen = max(self.last_seen, now)
        if package.keep_alive is False and self.state is StreamState.OPEN:
            # The initiator stopped the stream; without a closing bit it is broken.
            self._break("the initiator stopped the stream before its end", now)
        purpose = package.main_purpose
        if purpose == "chunk":
            self._accept_chunk(package, now)
            return stream_reply(package, self._package(package, "feedback"), echo_request=False)
        if purpose == "read":
            return self._answer_read(env, package, now)
        if purpose == "keepAlive":
            answer = self._package(package, "keepAlive", keep_alive=self.keep_alive)
            return stream_reply(package, answer, echo_request=True)
        # feedback, and the unused start/end, get a feedback package
        return stream_reply(package, self._package(package, "feedback"), echo_request=True)

    @property
    def done(self) -> bool:
        """Whether the stream is over (ENDED or BROKEN)."""
        return self.state is not StreamState.OPEN

    @property
    def broken(self) -> bool:
        """Whether the stream is over without its end."""
        return self.state is StreamState.BROKEN

    @property
    def keep_alive(self) -> bool:
        """The flag we answer: false once nothing more will move."""
        return self.state is StreamState.OPEN and not self._abandoned

    def _package(
        self, request: StreamPackage, purpose: Purpose, *, keep_alive: bool | None = None
    ) -> StreamPackage:
        return StreamPackage(
            stream_id=self.stream_id,
            cycle_id=request.cycle_id,
            cycle="response",
            main_purpose=purpose,
            keep_alive=keep_alive,
            next=self._has_next(),
            backpressure=self._backpressured(),
        )

    def _has_next(self) -> bool:
        if self.role is not Role.SEND:
            return False
        return bool(self._queue) or self.state is StreamState.OPEN

    def _backpressured(self) -> bool:
        return self.role is Role.RECEIVE and (
            self.held
            or len(self._queue) >= self._window
            or self._queued_bytes >= self._window_bytes
        )

    def _accept_chunk(self, package: StreamPackage, now: float) -> None:
        if (
            self.role is not Role.RECEIVE
            or self.state is not StreamState.OPEN
            or self._abandoned
            or self._closing
        ):
            return  # nobody reads it (late chunk, or data on a stream we send on): drop it
        if len(self._queue) >= 2 * self._window or self._queued_bytes >= 2 * self._window_bytes:
            self._break("the initiator ignored backpressure", now)
            return
        raw = package.chunk_data
        item: Item
        if isinstance(raw, RawChunk) and len(raw.text) >= self._inline_max:
            item = PendingChunk(raw)
            self._unsettled += 1
            self.received.append(item)
        else:
            try:
                item = decode_chunk(raw)
            except RemoteProtocolError as exc:
                self._break(f"undecodable chunk: {exc}", now)
                return
        self._queue.append(item)
        self._queued_bytes += _size(item)
        if item is CLOSING:
            if self._unsettled:
                self._closing = True  # ends once the chunks before it are decoded
            else:
                self._end(now)

    def settle(self, chunk: PendingChunk, outcome: bytes | RemoteProtocolError, now: float) -> None:
        """The driver decoded `chunk` (its bytes), or could not (the error): deliver it, or
        break the stream there. A chunk no longer queued (abandoned, broken) is ignored."""
        if chunk.data is not None or not any(item is chunk for item in self._queue):
            chunk.raw = None
            return
        if isinstance(outcome, RemoteProtocolError):
            # What came before it is delivered; it and everything after it count for nothing.
            self._break(f"undecodable chunk: {outcome}", now)
            return
        self._unsettled -= 1
        self._queued_bytes += len(outcome) - chunk.size
        chunk.raw, chunk.data, chunk.size = None, outcome, len(outcome)
        if self._closing and not self._unsettled:
            self._closing = False
            self._end(now)

    def _answer_read(self, env: Envelope, package: StreamPackage, now: float) -> Envelope | None:
        if self.role is Role.SEND and not self._queue and self.state is StreamState.OPEN:
            if self._parked is not None:
                released = self._release_parked()
                self._parked = _Parked(env, package, now + self._park_timeout)
                return released
            self._parked = _Parked(env, package, now + self._park_timeout)
            return None
        return self._read_answer(env, package, now)

    def _read_answer(self, env: Envelope, package: StreamPackage, now: float) -> Envelope:
        if self.role is Role.SEND and self._queue and self.state is not StreamState.BROKEN:
            item = self._queue.popleft()
            if item is CLOSING:
                self._end(now)
            assert not isinstance(item, PendingChunk)  # only received chunks are ever pending
            answer = StreamPackage(
                stream_id=self.stream_id,
                cycle_id=package.cycle_id,
                cycle="response",
                main_purpose="chunk",
                next=self._has_next(),
                backpressure=False,
                chunk_data=encode_chunk(item, self._form),
            )
            return stream_reply(package, answer, echo_request=True)
        return stream_reply(package, self._package(package, "feedback"), echo_request=True)

    def _release_parked(self) -> Envelope | None:
        parked, self._parked = self._parked, None
        if parked is None:
            return None
        return self._read_answer(parked.env, parked.package, parked.deadline)

    # --- the local consumer (RECEIVE) ------------------------------------------------------

    def take(self) -> bytes | Closing | None:
        """The next received item, None if none yet; raises `StreamBroken` once broken."""
        if self.role is not Role.RECEIVE:
            raise InvalidState("take() on a stream we send on")
        if self._queue:
            head = self._queue[0]
            if isinstance(head, PendingChunk):
                if head.data is None:
                    return None  # the oldest chunk is still being decoded
                self._queue.popleft()
                self._queued_bytes -= head.size
                return head.data
            self._queue.popleft()
            self._queued_bytes -= _size(head)
            return head
        if self.state is StreamState.BROKEN:
            raise StreamBroken(f"stream {self.stream_id} broke: {self.broken_reason}")
        if self._abandoned:
            raise InvalidState("take() on an abandoned stream")
        return None

    def abandon(self, now: float) -> None:
        """Nobody will read: drop what is queued, discard what comes, answer keepAlive false."""
        self._abandoned = True
        self._drop_queue()
        if self.closed_at is None:
            self.closed_at = now

    # --- the local producer (SEND) ---------------------------------------------------------

    def has_space(self) -> bool:
        """Whether `offer` may queue one more chunk now."""
        return len(self._queue) < self._window

    def offer(self, data: bytes | bytearray | memoryview) -> Envelope | None:
        """Queue `data`; returns a parked `read` answer to send now, if any."""
        self._check_producer()
        if not self.has_space():
            raise InvalidState("offer() on a full send queue; wait for has_space()")
        if data:
            self._queue.append(bytes(data))
        return self._release_parked() if self._queue else None

    def close(self) -> Envelope | None:
        """Queue the closing bit after the data; returns a parked `read` answer, if any."""
        self._check_producer()
        self._queued_close = True
        self._queue.append(CLOSING)
        return self._release_parked()

    def _check_producer(self) -> None:
        if self.role is not Role.SEND:
            raise InvalidState("producer call on a stream we receive on")
        if self.state is StreamState.BROKEN:
            raise StreamBroken(f"stream {self.stream_id} broke: {self.broken_reason}")
        if self._queued_close:
            raise InvalidState("the stream is already closed")

    # --- both --------------------------------------------------------------------------------

    def abort(self, reason: str, now: float) -> Envelope | None:
        """Break the stream locally; returns a parked `read` answer (now empty), if any."""
        if self.state is StreamState.OPEN:
            self._break(reason, now)
        return self._release_parked()

    def expire(self, now: float) -> Envelope | None:
        """Apply the clock: idle timeout, parked-read timeout. Returns an answer to send."""
        if self.state is StreamState.OPEN and now - self.last_seen > self._idle_timeout:
            self._break(f"no frame from the initiator within {self._idle_timeout:g} s", now)
        if self._parked is not None and (
            now >= self._parked.deadline or self.state is not StreamState.OPEN
        ):
            return self._release_parked()
        return None

    def next_wakeup(self) -> float | None:
        """When `expire` (or `finished`) may next have something to do."""
        if self.state is not StreamState.OPEN:
            if self._parked is not None:
                return self._parked.deadline
            return self._linger_end() if self._drained() else None
        idle = self.last_seen + self._idle_timeout
        return idle if self._parked is None else min(idle, self._parked.deadline)

    def finished(self, now: float) -> bool:
        """Whether the registration may go: over, drained, and quiet for `idle_timeout` s (a
        late frame of the initiator still finds it and is answered `keepAlive: false`)."""
        if self.closed_at is None or self._parked is not None or self._deferred:
            return False
        return self._drained() and now >= self._linger_end()

    def _drained(self) -> bool:
        return not self._queue or self._abandoned or self.role is Role.SEND

    def _linger_end(self) -> float:
        assert self.closed_at is not None
        return max(self.closed_at, self.last_seen) + self._idle_timeout

    def _move(self, to: StreamState, now: float) -> None:
        if to not in TRANSITIONS[self.state]:
            raise InvalidState(f"stream {self.stream_id}: {self.state.value} -> {to.value}")
        self.state = to
        if self.closed_at is None:  # abandon() may have started the clock already
            self.closed_at = now

    def _end(self, now: float) -> None:
        self._move(StreamState.ENDED, now)

    def _break(self, reason: str, now: float) -> None:
        self._move(StreamState.BROKEN, now)
        self.broken_reason = reason
        if self.role is Role.SEND:
            self._queue.clear()
        elif self._unsettled:
            # A chunk not decoded yet is never delivered once the stream broke (its verdict is
            # not awaited), and nothing after it is; the chunks before it still are.
            first = next(i for i, item in enumerate(self._queue) if _unsettled(item))
            while len(self._queue) > first:
                self._pop_last()
            self._drop_unsettled()

    def _pop_last(self) -> None:
        item = self._queue.pop()
        self._queued_bytes -= _size(item)
        if isinstance(item, PendingChunk):
            item.raw = None

    def _drop_queue(self) -> None:
        while self._queue:
            self._pop_last()
        self._drop_unsettled()

    def _drop_unsettled(self) -> None:
        self._unsettled = 0
        self._closing = False
        self.received.clear()


def _unsettled(item: Item) -> bool:
    return isinstance(item, PendingChunk) and item.data is None


def _size(item: Item) -> int:
    if isinstance(item, PendingChunk):
        return item.size
    return 0 if isinstance(item, Closing) else len(item)
