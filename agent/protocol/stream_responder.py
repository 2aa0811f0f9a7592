"""The responder side of one VirtualStream (wire.md §4.2-4.4): we only answer the peer's frames.

Its life is `RESPONDER_TABLE` (`agent.table.TransitionTable`); what it holds is data: its queue,
the frames waiting behind a chunk being decoded, the `read`s it parked. Every answer is a
`StreamAnswer`: the envelope and whether it invites the initiator's next chunk (the
connection's receive budget counts those).

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
initiator that reads while `next` is true neither spins nor stalls. An initiator that keeps
several `read`s in flight gets them parked in order (at most `window`; one more answers the
oldest empty), and data answers them oldest first.

Pipelined receive: a chunk whose payload is at least `inline_decode_max` characters (a
`RawChunk`: the frame decoder cut it out undecoded) is answered as soon as it is queued, as a
`PendingChunk`; the driver decodes it off the event loop (`PendingChunk.decode()`, pure) and
reports the outcome with `settle()`. A chunk that does not decode breaks the stream
(`undecodable chunk: ...`): what came before it is still delivered, nothing after it is. The
consumer only ever sees decoded bytes, in order (`take()` waits for the oldest chunk to be
settled). A frame of the stream that arrives while one of its chunks is still being decoded
waits (`handle` answers None) and is answered by `release()` once the chunk is settled, so a
bad chunk has broken the stream before the peer's next frame of it is answered: one frame
later at most (frames of other streams, and requests, do not wait). At most `2 x window`
frames may wait; more break the stream. Smaller chunks are decoded at once.

Bounds: the receive queue holds at most `window` chunks, and at most `window_bytes` bytes
(a queued chunk counts the frame it keeps alive until it is decoded, then its bytes), before we
report backpressure; a stream whose reader is not ready yet (HELD: its request waits for a
transfer slot) reports backpressure whatever it holds, so its initiator probes instead of
sending and the stream holds no more than it took before; a peer that keeps sending past twice
either bound breaks the stream.

A `feedback` probe on a HELD stream is parked like a `read` (long poll): answered as soon as
its reader reads (`read_now()` gives the answer), with backpressure still on once
`park_timeout` passes, or once the stream is over. typedrequest 3.3.0 waits for the answer to
a probe and probes again 50 ms after a backpressured one, so a stream that waits its turn for
minutes costs one probe per `park_timeout` instead of twenty a second, and it starts moving
the moment it is read rather than up to 50 ms later. A stream whose queue is full answers a
probe at once, as before: its reader empties it within milliseconds, and an answer released
by a `take` would invite a sender that keeps several chunks in flight to burst them into a
byte budget others have filled meanwhile. At most `window` probes wait; one more answers the
oldest. The send queue holds `window` chunks; the producer waits for
`has_space()`. Memory per stream is at most 2 x `window_bytes` of queued frames, never stream
length.
"""

from __future__ import annotations

import enum
from collections import deque
from dataclasses import dataclass
from typing import Final

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
from agent.protocol.events import broken_error
from agent.protocol.settings import StreamSettings
from agent.protocol.stream_frames import Purpose, StreamPackage, stream_reply
from agent.table import TransitionTable

__all__ = [
    "RESPONDER_TABLE",
    "PendingChunk",
    "ResponderEvent",
    "ResponderStream",
    "Role",
    "StreamAnswer",
    "StreamState",
]


class Role(enum.Enum):
    """Which way the bytes go, seen from us."""

    RECEIVE = "receive"
    SEND = "send"


class StreamState(enum.Enum):
    """Life of a stream we answer for; ENDED and BROKEN are final."""

    OPEN = "open"
    HELD = "held"  # RECEIVE: its reader is not ready yet: every answer says backpressure
    CLOSING = "closing"  # SEND: the producer queued the closing bit
    ABANDONED = "abandoned"  # RECEIVE: nobody reads it: what comes is discarded
    ENDED = "ended"  # the closing bit went through
    BROKEN = "broken"


class ResponderEvent(enum.Enum):
    """What moves a stream we answer for."""

    HOLD = "hold"
    READ = "read"
    CLOSE = "close"
    END = "end"
    ABANDON = "abandon"
    BREAK = "break"


_S, _E = StreamState, ResponderEvent
_LIVE: Final = (_S.OPEN, _S.HELD, _S.CLOSING, _S.ABANDONED)
_BREAKS: Final = (
    "`idle_timeout` without a frame, `keepAlive: false` before the end, an undecodable chunk, "
    "a sender past twice the window, or a local abort"
)

RESPONDER_TABLE: Final = TransitionTable[StreamState, ResponderEvent].noted(
    {
        (_S.OPEN, _E.HOLD): (_S.HELD, "RECEIVE: its request waits for a transfer slot"),
        (_S.HELD, _E.READ): (_S.OPEN, "RECEIVE: its handler reads it"),
        (_S.OPEN, _E.CLOSE): (_S.CLOSING, "SEND: the producer queued the closing bit"),
        (_S.OPEN, _E.END): (
            _S.ENDED,
            "RECEIVE: the closing bit came, every chunk before it decoded",
        ),
        (_S.HELD, _E.END): (
            _S.ENDED,
            "RECEIVE: the closing bit came, every chunk before it decoded",
        ),
        (_S.CLOSING, _E.END): (_S.ENDED, "SEND: a `read` took the closing bit"),
        (_S.OPEN, _E.ABANDON): (_S.ABANDONED, "RECEIVE: nobody will read it (its request ended)"),
        (_S.HELD, _E.ABANDON): (_S.ABANDONED, "RECEIVE: nobody will read it (its request ended)"),
        **{(state, _E.BREAK): (_S.BROKEN, _BREAKS) for state in _LIVE},
    }
)
"""How a stream we answer for moves (docs/wire-notes.md embeds `render()`, checked by a test)."""


@dataclass(frozen=True, slots=True)
class StreamAnswer:
    """One answer to send on a stream, and whether it invites the initiator's next chunk (a
    `feedback` package saying `backpressure: false` on a stream we receive that is not over)."""

    envelope: Envelope
    invites: bool = False


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


class _LongPolls:
    """Frames of one kind whose answer waits (a long poll), oldest first, each at most
    `timeout` after it came; at most `limit` wait, one more evicts the oldest (answered as the
    stream stands)."""

    __slots__ = ("_frames", "_limit", "_timeout")

    def __init__(self, limit: int, timeout: float) -> None:
        self._frames: deque[_Parked] = deque()
        self._limit = limit
        self._timeout = timeout

    def __bool__(self) -> bool:
        return bool(self._frames)

    def park(self, env: Envelope, package: StreamPackage, now: float) -> _Parked | None:
        """Park one frame; returns the oldest one when that is one too many (answer it now)."""
        self._frames.append(_Parked(env, package, now + self._timeout))
        return self._frames.popleft() if len(self._frames) > self._limit else None

    def pop(self) -> _Parked | None:
        """The oldest frame, no longer waiting."""
        return self._frames.popleft() if self._frames else None

    def due(self, now: float) -> list[_Parked]:
        """The frames whose time is up, oldest first, no longer waiting."""
        due: list[_Parked] = []
        while self._frames and now >= self._frames[0].deadline:
            due.append(self._frames.popleft())
        return due

    def drain(self) -> list[_Parked]:
        """Every frame, oldest first, no longer waiting."""
        frames = list(self._frames)
        self._frames.clear()
        return frames

    @property
    def deadline(self) -> float | None:
        """When the oldest frame's time is up."""
        return self._frames[0].deadline if self._frames else None


class ResponderStream:
    """One stream we answer for."""

    not_served = False  # only a stream we drive can find its peer serving none

    def __init__(self, stream_id: str, role: Role, settings: StreamSettings, *, now: float) -> None:
        self.stream_id = stream_id
        self.role = role
        self.state = StreamState.OPEN
        self.broken_reason = ""
        self.malformed = False  # broken at a chunk that does not decode
        self.last_seen = now
        self.closed_at: float | None = None  # when it ended, broke or was abandoned
        self._window = settings.window
        self._window_bytes = settings.window_bytes
        self._inline_max = settings.inline_decode_max
        self._idle_timeout = settings.idle_timeout
        self._form: ChunkForm = settings.chunk_form
        self._queue: deque[Item] = deque()
        self._queued_bytes = 0  # RECEIVE: what the queue holds, for the byte window
        # RECEIVE: the queued chunk being decoded off the loop (at most one: the stream's
        # frames wait behind it), and the ones not yet handed to the driver to decode.
        self._decoding: PendingChunk | None = None
        self._to_decode: list[PendingChunk] = []
        # RECEIVE: frames that arrived while a chunk was being decoded, answered after it
        self._deferred: deque[tuple[Envelope, StreamPackage, float]] = deque()
        self._reads = _LongPolls(self._window, settings.park_timeout)  # SEND: waiting for data
        self._probes = _LongPolls(self._window, settings.park_timeout)  # RECEIVE: for room
        self.end_reported = False  # the connection told its driver the stream is over

    # --- frames from the initiator -------------------------------------------------------

    def handle(self, env: Envelope, package: StreamPackage, now: float) -> StreamAnswer | None:
        """The answer to one stream frame, or None when a `read` is parked or the frame waits
        behind a chunk not decoded yet (`release()` answers it once that chunk is settled)."""
        if self._decoding is not None or self._deferred:
            self.last_seen = now
            self._deferred.append((env, package, now))
            if len(self._deferred) > 2 * self._window:
                self._break("the initiator ignored backpressure", now)
            return None
        return self._handle_now(env, package, now)

    def release(self) -> list[StreamAnswer]:
        """Answer the frames that waited for the stream's chunks to be decoded, in order, until
        one leaves a chunk to decode again (or none waits); then the parked probes, once the
        stream has room (or is over)."""
        answers: list[StreamAnswer] = []
        while self._deferred and self._decoding is None:
            env, package, at = self._deferred.popleft()
            answer = self._handle_now(env, package, at)
            if answer is not None:
                answers.append(answer)
        if self._probes and not self._parks_probes():
            answers += self._release_probes()
        return answers

    @property
    def queued_bytes(self) -> int:
        """What the receive queue holds, for the byte window (frames until decoded, then bytes)."""
        return self._queued_bytes

    @property
    def waiting(self) -> int:
        """Frames waiting for the stream's chunks to be decoded."""
        return len(self._deferred)

    def take_to_decode(self) -> list[PendingChunk]:
        """The chunks queued undecoded since the last call: the driver decodes each off the
        event loop and reports with `settle()`."""
        chunks, self._to_decode = self._to_decode, []
        return chunks

    def _handle_now(self, env: Envelope, package: StreamPackage, now: float) -> StreamAnswer | None:
        self.last_seen = max(self.last_seen, now)
        if package.keep_alive is False and self.state in _LIVE:
            # The initiator stopped the stream; without a closing bit it is broken.
            self._break("the initiator stopped the stream before its end", now)
        purpose = package.main_purpose
        if purpose == "chunk":
            self._accept_chunk(package, now)
            return self._feedback(package, echo_request=False)
        if purpose == "read":
            return self._answer_read(env, package, now)
        if purpose == "keepAlive":
            answer = self._package(package, "keepAlive", keep_alive=self.keep_alive)
            return StreamAnswer(stream_reply(package, answer, echo_request=True))
        if purpose == "feedback" and self._parks_probes():
            evicted = self._probes.park(env, package, now)
            return None if evicted is None else self._answer_probe(evicted)
        # feedback, and the unused start/end, get a feedback package
        return self._feedback(package, echo_request=True)

    def _parks_probes(self) -> bool:
        """Whether a `feedback` probe waits for the reader: the stream is HELD."""
        return self.state is StreamState.HELD

    def _answer_probe(self, parked: _Parked) -> StreamAnswer:
        return self._feedback(parked.package, echo_request=True)

    def _release_probes(self) -> list[StreamAnswer]:
        return [self._answer_probe(parked) for parked in self._probes.drain()]

    def _feedback(self, request: StreamPackage, *, echo_request: bool) -> StreamAnswer:
        answer = self._package(request, "feedback")
        invites = self.role is Role.RECEIVE and not self.done and answer.backpressure is False
        return StreamAnswer(stream_reply(request, answer, echo_request=echo_request), invites)

    @property
    def keeps_chunks(self) -> bool:
        """Whether a chunk frame of it is kept (queued for its reader), and so drawn for from
        the byte budget before it is handled: it receives and is not over."""
        return self.role is Role.RECEIVE and not self.done

    @property
    def done(self) -> bool:
        """Whether the stream is over (ENDED or BROKEN)."""
        return self.state in (StreamState.ENDED, StreamState.BROKEN)

    @property
    def broken(self) -> bool:
        """Whether the stream is over without its end."""
        return self.state is StreamState.BROKEN

    @property
    def keep_alive(self) -> bool:
        """The flag we answer: false once nothing more will move."""
        return self.state in (StreamState.OPEN, StreamState.HELD, StreamState.CLOSING)

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
            self.state is StreamState.HELD
            or len(self._queue) >= self._window
            or self._queued_bytes >= self._window_bytes
        )

    def _accept_chunk(self, package: StreamPackage, now: float) -> None:
        if self.role is not Role.RECEIVE or self.state not in (StreamState.OPEN, StreamState.HELD):
            return  # nobody reads it (late chunk, or data on a stream we send on): drop it
        if len(self._queue) >= 2 * self._window or self._queued_bytes >= 2 * self._window_bytes:
            self._break("the initiator ignored backpressure", now)
            return
        raw = package.chunk_data
        item: Item
        if isinstance(raw, RawChunk) and len(raw.text) >= self._inline_max:
            item = self._decoding = PendingChunk(raw)
            self._to_decode.append(item)
        else:
            try:
                item = decode_chunk(raw)
            except RemoteProtocolError as exc:
                self._break(f"undecodable chunk: {exc}", now)
                self.malformed = True
                return
        self._queue.append(item)
        self._queued_bytes += _size(item)
        if item is CLOSING:
            # Nothing is being decoded: this frame would have waited behind it.
            self._move(ResponderEvent.END, now)

    def settle(self, chunk: PendingChunk, outcome: bytes | RemoteProtocolError, now: float) -> None:
        """The driver decoded `chunk` (its bytes), or could not (the error): deliver it, or
        break the stream there. A chunk no longer queued (abandoned, broken) is ignored."""
        if chunk is not self._decoding:
            chunk.raw = None
            return
        if isinstance(outcome, RemoteProtocolError):
            # What came before it is delivered; it and everything after it count for nothing.
            self._break(f"undecodable chunk: {outcome}", now)
            self.malformed = True
            return
        self._decoding = None
        self._queued_bytes += len(outcome) - chunk.size
        chunk.raw, chunk.data, chunk.size = None, outcome, len(outcome)

    def _answer_read(
        self, env: Envelope, package: StreamPackage, now: float
    ) -> StreamAnswer | None:
        if self.role is Role.SEND and not self._queue and self.state is StreamState.OPEN:
            evicted = self._reads.park(env, package, now)  # one read per window slot
            return None if evicted is None else self._answer_parked_read(evicted)
        return self._read_answer(env, package, now)

    def _read_answer(self, env: Envelope, package: StreamPackage, now: float) -> StreamAnswer:
        if self.role is Role.SEND and self._queue and self.state is not StreamState.BROKEN:
            item = self._queue.popleft()
            if item is CLOSING:
                self._move(ResponderEvent.END, now)
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
            return StreamAnswer(stream_reply(package, answer, echo_request=True))
        return self._feedback(package, echo_request=True)

    def _answer_parked_read(self, parked: _Parked) -> StreamAnswer:
        return self._read_answer(parked.env, parked.package, parked.deadline)

    def _release_parked(self) -> StreamAnswer | None:
        parked = self._reads.pop()
        return None if parked is None else self._answer_parked_read(parked)

    def _release_fed(self) -> list[StreamAnswer]:
        """Parked `read`s that the queue can answer now, oldest first."""
        answers: list[StreamAnswer] = []
        while self._reads and self._queue:
            answer = self._release_parked()
            assert answer is not None
            answers.append(answer)
        if self.done:  # the closing bit went: the other parked reads learn it now
            answers += self._release_all()
        return answers

    def _release_all(self) -> list[StreamAnswer]:
        answers: list[StreamAnswer] = []
        while (answer := self._release_parked()) is not None:
            answers.append(answer)
        return answers

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
            raise broken_error(self.stream_id, self.broken_reason, False, self.malformed)
        if self.state is StreamState.ABANDONED:
            raise InvalidState("take() on an abandoned stream")
        return None

    def hold(self) -> None:
        """Its reader is not ready yet: answer backpressure until `read_now()`."""
        if RESPONDER_TABLE.allows(self.state, ResponderEvent.HOLD):
            self._move(ResponderEvent.HOLD, self.last_seen)

    def read_now(self) -> list[StreamAnswer]:
        """Its reader is ready: answers report the queue again; returns the answers to the
        probes that waited for it."""
        if RESPONDER_TABLE.allows(self.state, ResponderEvent.READ):
            self._move(ResponderEvent.READ, self.last_seen)
        return self.release()

    def abandon(self, now: float) -> list[StreamAnswer]:
        """Nobody will read: drop what is queued, discard what comes, answer keepAlive false;
        returns the answers to the probes that waited for room."""
        if RESPONDER_TABLE.allows(self.state, ResponderEvent.ABANDON):
            self._move(ResponderEvent.ABANDON, now)
        self._drop_queue()
        if self.closed_at is None:
            self.closed_at = now
        return self._release_probes()

    # --- the local producer (SEND) ---------------------------------------------------------

    def has_space(self) -> bool:
        """Whether `offer` may queue one more chunk now."""
        return len(self._queue) < self._window

    def offer(self, data: bytes | bytearray | memoryview) -> list[StreamAnswer]:
        """Queue `data`; returns the answers to parked `read`s to send now."""
        self._check_producer()
        if not self.has_space():
            raise InvalidState("offer() on a full send queue; wait for has_space()")
        if data:
            self._queue.append(bytes(data))
        return self._release_fed()

    def close(self) -> list[StreamAnswer]:
        """Queue the closing bit after the data; returns the answers to parked `read`s."""
        self._check_producer()
        self._move(ResponderEvent.CLOSE, self.last_seen)
        self._queue.append(CLOSING)
        return self._release_fed()

    def _check_producer(self) -> None:
        if self.role is not Role.SEND:
            raise InvalidState("producer call on a stream we receive on")
        if self.state is StreamState.BROKEN:
            raise StreamBroken(f"stream {self.stream_id} broke: {self.broken_reason}")
        if self.state is not StreamState.OPEN:
            raise InvalidState("the stream is already closed")

    # --- both --------------------------------------------------------------------------------

    def abort(self, reason: str, now: float) -> list[StreamAnswer]:
        """Break the stream locally; returns the answers to parked `read`s and probes (now
        saying it is over)."""
        if self.state in _LIVE:
            self._break(reason, now)
        return self._release_probes() + self._release_all()

    def expire(self, now: float) -> list[StreamAnswer]:
        """Apply the clock: idle timeout, parked-read and parked-probe timeouts. Returns
        answers to send."""
        if self.state in _LIVE and now - self.last_seen > self._idle_timeout:
            self._break(f"no frame from the initiator within {self._idle_timeout:g} s", now)
        answers: list[StreamAnswer] = []
        if not self._parks_probes():
            answers += self._release_probes()
        answers += [self._answer_probe(parked) for parked in self._probes.due(now)]
        if self.state not in (StreamState.OPEN, StreamState.CLOSING):
            return answers + self._release_all()
        answers += [self._answer_parked_read(parked) for parked in self._reads.due(now)]
        return answers

    def next_wakeup(self) -> float | None:
        """When `expire` (or `finished`) may next have something to do."""
        deadlines = (self._reads.deadline, self._probes.deadline)
        parked = min((d for d in deadlines if d is not None), default=None)
        if self.done:
            if parked is not None:
                return parked
            return self._linger_end() if self._drained() else None
        idle = self.last_seen + self._idle_timeout
        return idle if parked is None else min(idle, parked)

    def finished(self, now: float) -> bool:
        """Whether the registration may go: over, drained, and quiet for `idle_timeout` s (a
        late frame of the initiator still finds it and is answered `keepAlive: false`)."""
        if self.closed_at is None or self._reads or self._probes or self._deferred:
            return False
        return self._drained() and now >= self._linger_end()

    def _drained(self) -> bool:
        return not self._queue or self.role is Role.SEND

    def _linger_end(self) -> float:
        assert self.closed_at is not None
        return max(self.closed_at, self.last_seen) + self._idle_timeout

    def _move(self, event: ResponderEvent, now: float) -> None:
        self.state = RESPONDER_TABLE.next(self.state, event, subject=f"stream {self.stream_id}")
        if self.done and self.closed_at is None:  # abandon() may have started the clock
            self.closed_at = now

    def _break(self, reason: str, now: float) -> None:
        self._move(ResponderEvent.BREAK, now)
        self.broken_reason = reason
        if self.role is Role.SEND:
            self._queue.clear()
        elif self._decoding is not None:
            # A chunk not decoded yet is never delivered once the stream broke (its verdict is
            # not awaited), and nothing after it is; the chunks before it still are.
            decoding, self._decoding = self._decoding, None
            while self._queue and self._pop_last() is not decoding:
                pass
            self._to_decode.clear()

    def _pop_last(self) -> Item:
        item = self._queue.pop()
        self._queued_bytes -= _size(item)
        if isinstance(item, PendingChunk):
            item.raw = None
        return item

    def _drop_queue(self) -> None:
        while self._queue:
            self._pop_last()
        self._decoding = None
        self._to_decode.clear()


def _size(item: Item) -> int:
    if isinstance(item, PendingChunk):
        return item.size
    return 0 if isinstance(item, Closing) else len(item)
