"""`Connection`: one TypedRequest/VirtualStream connection, sans I/O.

Everything the protocol decides lives here; an I/O driver (`agent.session.peer`) only moves
bytes and runs handlers. In the shape of websockets' `Protocol` and h11's `Connection`, it
hands out values and bytes only, never its stream machines; a stream is named by its id:

- the network goes in through `receive_frame(frame, now)`, the end of the transport through
  `connection_lost(reason, now)`, time through `advance(now)`; local actions are methods
  (`call`, `respond`, `refuse`, `write`, `take`, ...). Every one that can depend on time takes
  `now`; the connection keeps no clock and no time of its own;
- what to send comes out of `data_to_send()` and what happened out of `events_received()`
  (`agent.protocol.events`), in the order it happened; both drain and clear. Frames leave in
  the order they were produced, so the request carrying a stream marker always precedes the
  stream's own frames;
- `next_deadline()` says when `advance()` is next needed. No timer is a task;
- queries by stream id: `can_write(stream_id)`, `stream_outcome(stream_id)`.

Streams, by who opens them: a handler receives a request's stream (`receive_request_stream`;
until then it may hold it back, `hold_request_stream`: every answer says backpressure) and
opens streams for its response (`open_reply_stream`); a caller opens a stream to send in its
call (`open_send_stream`) and receives one whose marker came in a response
(`receive_response_stream`); every face that hands a stream to a reader says `receive`.
Then `write` (split into chunks of at most `MAX_CHUNK`, as many as the window has room for),
`end_stream`, `abort_stream`, `take`, `stop_reading`. A stream is
over once `StreamEnded` or `StreamBroke` came out; an id the connection forgot since (a
finished stream lingers, then goes) is still answered as that stream would have been.

Intake rules for a request frame, in this order (1 to 4 and the requests in flight are
`intake.RequestIntake`'s; 5 and 6 are the connection's):

1. intake stopped (`stop_intake()`): `shutting-down`, retryable;
2. a method nobody routes: the typedrequest text "There is no available method for this call on
   the server side", code `unknown-method`;
3. a `request` that is no JSON object: `invalid-request`;
4. its class full (`agent.protocol.admission`: control requests and requests that carry or
   wait for a stream have their own seats, and each node its share of the stream seats): a
   `retry` answer (no `error`) naming the class, so the caller sends the identical request
   again after `busy_retry_ms` (typedrequest callers do this on their own; our `CallTable`
   does too). A flood therefore costs one small answer per frame, never a handler or its
   memory. A request its route may answer from memory takes no seat; should it need its
   handler after all, the driver asks for its seat (`seat()`), which may turn it away the same;
5. every stream marker in the request registers a stream we answer for; a duplicate stream id
   refuses the request (`invalid-request`) and unregisters the ones it had already opened;
6. otherwise a `RequestReceived` event: the driver runs the route and ends the request with
   `respond()` or `refuse()`. Ending it releases the request's streams (nobody reads them any
   more) and starts the streams the handler announced in its response (`open_reply_stream`);
   one it opened but left out of the response is aborted.

Received chunks: a large chunk of a stream we answer for is queued undecoded and announced as a
`ChunkToDecode` event; the driver decodes its token off the event loop (`token.decode()`) and
reports with `settle_chunk()`. Frames of that stream arriving meanwhile wait and are answered
once it is settled, so a chunk that does not decode has broken its stream before the peer's
next frame of it is answered (`stream_responder`); other streams' frames and requests do not
wait.

The byte budget (`pool`, `agent.protocol.pool`; none by default): a chunk frame of a stream we
answer for is drawn for before it is invited, and a frame the budget has no room for breaks its
stream; what each stream holds, and when it comes back, is `stream_charges.StreamCharges`'s
(`first_frame_bytes`: what the first reservation assumes). A request's stream is held (answered
`backpressure`) until its handler reads it, so nothing is invited for a stream nobody empties.

A malformed envelope that still names a method and a request correlation id gets an
`invalid-request` answer that echoes nothing of it; anything else malformed is dropped with a
log line. A frame nesting deeper than `envelope.MAX_DEPTH` is malformed. No frame a peer sends
makes `receive_frame` raise, and no reply it triggers (`respond`, `refuse` included) fails to
encode for the peer's sake: an echoed request that does not encode is sent as `request: null`.
Stream frames are routed by `StreamRegistry` (which answers a frame for an unknown stream at
most once); no answer carries a peer's payload back. Nothing here logs a payload or a secret.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Mapping
from typing import Any, Final

import structlog

from agent.errors import (
    AgentError,
    InvalidRequest,
    InvalidState,
    LocalProtocolError,
    RemoteProtocolError,
    SessionClosed,
    StreamBroken,
    wire_error_data,
)
from agent.protocol.admission import Admission, AdmissionBounds, AdmissionView, Deferred
from agent.protocol.calls import CallErrored, CallTable, Completed, Unmatched
from agent.protocol.chunks import Closing
from agent.protocol.envelope import (
    Correlation,
    Envelope,
    FrameKind,
    answerable,
    classify,
    encode_envelope,
    encode_reply,
    envelope_from_json,
    error_reply,
    parse_frame,
    reply,
    retry_reply,
)
from agent.protocol.events import (
    ChunkToDecode,
    ChunkToken,
    Event,
    RequestReceived,
    StreamBroke,
    StreamChanged,
    StreamEnded,
)
from agent.protocol.ids import new_uni_id
from agent.protocol.intake import (
    InFlight,
    Refused,
    RequestIntake,
    UnknownMethod,
)
from agent.protocol.markers import find_stream_ids
from agent.protocol.pool import BytePool
from agent.protocol.receive_budget import ReceiveBudget
from agent.protocol.round_trip import MinRoundTrip
from agent.protocol.settings import ConnectionSettings, StreamSettings
from agent.protocol.stream_charges import StreamCharges, no_room_reason
from agent.protocol.stream_initiator import InitiatorState, InitiatorStream
from agent.protocol.stream_registry import StreamRegistry, outcome_of
from agent.protocol.stream_responder import PendingChunk, ResponderStream, Role, StreamAnswer

__all__ = [
    "MAX_CHUNK",
    "CallErrored",
    "ChunkToDecode",
    "ChunkToken",
    "Completed",
    "Connection",
    "ConnectionSettings",
    "ConnectionState",
    "Event",
    "RequestReceived",
    "StreamBroke",
    "StreamChanged",
    "StreamEnded",
    "StreamSettings",
]

# A write larger than this goes out as several chunks: one 1 MiB chunk is a ~4 MB frame in the
# Buffer form already, and the window bounds memory as window x chunk size.
MAX_CHUNK: Final = 1 << 20

_Stream = InitiatorStream | ResponderStream

log = structlog.get_logger("agent.protocol")


class ConnectionState(enum.Enum):
    """OPEN until the transport is gone; CLOSED is final."""

    OPEN = "open"
    CLOSED = "closed"


class Connection:
    """The protocol state of one connection, in either role (client or server socket)."""

    def __init__(
        self,
        methods: Collection[str],
        settings: ConnectionSettings | None = None,
        *,
        new_id: Callable[[], str] = new_uni_id,
        pool: BytePool | None = None,
        first_frame_bytes: int = 16 * 1024 * 1024,
        admissions: Mapping[str, Admission] | None = None,
    ) -> None:
        self.settings = settings or ConnectionSettings()
        bounds = AdmissionBounds(
            control=self.settings.max_concurrent_requests,
            stream=self.settings.max_stream_requests,
            stream_per_node=self.settings.max_stream_requests_per_node,
        )
        self._intake = RequestIntake(methods, bounds, admissions)
        # What each stream we receive on holds of the byte budget (None: no budget).
        self._charges = None if pool is None else StreamCharges(pool, first_frame_bytes)
        self._new_id = new_id
        self._calls = CallTable(new_id=new_id, max_attempts=self.settings.max_retry_attempts)
        self._rtt = MinRoundTrip()  # the smallest call round trip of the span: the path's
        self._streams = StreamRegistry(self.settings.streams, new_id, self._rtt.current)
        self._budget = ReceiveBudget(
            self.settings.receive_budget,
            expiry=self.settings.streams.park_timeout,
            ceiling=self.settings.receive_budget_max,
            gate=None if self._charges is None else self._charges.reserve,
        )
        self._outbox: list[bytes] = []
        self._events: list[Event] = []
        self._closed: SessionClosed | None = None

    # --- what comes out ------------------------------------------------------------------------

    def data_to_send(self) -> list[bytes]:
        """Frames to send, in order; the list is handed over and cleared."""
        frames, self._outbox = self._outbox, []
        return frames

    def events_received(self) -> list[Event]:
        """What happened since the last call, in the order it happened; handed over and
        cleared."""
        events, self._events = self._events, []
        return events

    def next_deadline(self) -> float | None:
        """When `advance()` next has something to do (None: only frames and actions matter)."""
        times = [
            self._calls.next_deadline(),
            self._streams.next_wakeup(),
            self._budget.next_deadline(),
        ]
        times += [stream.next_wakeup() for stream in self._streams.initiators.values()]
        return min((t for t in times if t is not None), default=None)

    @property
    def state(self) -> ConnectionState:
        """OPEN or CLOSED."""
        return ConnectionState.OPEN if self._closed is None else ConnectionState.CLOSED

    @property
    def in_flight(self) -> int:
        """Requests being handled right now."""
        return len(self._intake)

    @property
    def seats(self) -> AdmissionView:
        """The request classes' seats held now and the requests each turned away (to read)."""
        return self._intake.seats

    def can_write(self, stream_id: str) -> bool:
        """Whether `write(stream_id, ...)` acts now (as `select` reports a socket writable):
        there is room in the window, or the stream is over and `write` raises. False only
        while a stream we send on has its window full."""
        stream = self._streams.find(stream_id)
        return stream is None or stream.done or stream.has_space()

    def stream_outcome(self, stream_id: str) -> StreamEnded | StreamBroke | None:
        """None while stream `stream_id` is open, else how it ended (also once it is
        forgotten; an id never seen, or long forgotten, reads as broken)."""
        stream = self._streams.find(stream_id)
        if stream is not None:
            if not stream.done:
                return None
            return outcome_of(stream)
        past = self._streams.past(stream_id)
        if past is None:
            return StreamBroke(stream_id, "the connection knows no such stream")
        return past

    # --- what goes in: frames, the transport's end and time ------------------------------------

    def receive_frame(self, frame: bytes, now: float) -> None:
        """Take one text frame (UTF-8 JSON) from the peer."""
        self._check_open()
        try:
            obj = parse_frame(frame)
        except RemoteProtocolError as exc:
            log.warning("frame_dropped", reason=str(exc))
            return
        try:
            env = envelope_from_json(obj)
        except RemoteProtocolError as exc:
            self._answer_malformed(obj, exc)
            return
        kind = classify(env)
        if kind is FrameKind.STREAM:
            self._on_stream_frame(env, now, len(frame))
        elif kind is FrameKind.REQUEST:
            self._on_request(env, now)
        elif kind is FrameKind.RESPONSE:
            self._on_response(env, now)
        else:
            log.warning("frame_dropped", method=env.method, reason="weirdly shaped frame")

    def advance(self, now: float) -> None:
        """Let time pass: call deadlines and advised resends, stream keep-alives and timeouts."""
        if self._closed is not None:
            return
        self._events.extend(self._calls.expire(now))
        for call in self._calls.due_resends(now):
            log.info("call_resent", method=call.method, attempt=call.sends)
            self._outbox.append(call.wire)
        for stream_id, answers in self._streams.expire(now):
            responder = self._streams.responders.get(stream_id)
            if responder is None:  # finished and forgotten: it was over, and said so, before
                self._outbox.extend(encode_envelope(answer.envelope) for answer in answers)
                continue
            for answer in answers:
                self._answer_stream(responder, answer, now)
            if responder.broken and responder.done:
                log.warning("stream_broken", stream_id=stream_id, reason=responder.broken_reason)
            self._touch(responder)
            self._release(responder, now)
        self._send_answers(self._budget.release(now))
        if self._charges is not None:
            self._charges.keep_only(self._streams.responders)
        for stream in list(self._streams.initiators.values()):
            self._pump(stream, now)

    def release_held(self, now: float) -> None:
        """Bytes came back to the budget: the held answers that fit now go out (what `advance`
        does for them, without walking every call and stream for the clock)."""
        if self._closed is not None:
            return
        self._send_answers(self._budget.release(now))

    @property
    def invitations_held(self) -> bool:
        """Whether answers wait for room (in the receive budget or the byte budget)."""
        return self._budget.held > 0

    def connection_lost(self, reason: SessionClosed, now: float) -> None:
        """The transport is gone: every call fails, every stream breaks, nothing is sent."""
        if self._closed is not None:
            return
        self._closed = reason
        self._outbox.clear()
        self._budget.clear()
        if self._charges is not None:
            self._charges.clear()
        for call_id in self._calls.clear():
            self._events.append(
                CallErrored(call_id, SessionClosed(reason.close_code, reason.reason))
            )
        for stream in list(self._streams.all_streams()):
            if isinstance(stream, ResponderStream):
                stream.abort("the session closed", now)
            else:
                stream.abort("the session closed")
            self._touch(stream)
        self._intake.clear()

    # --- requests we handle ----------------------------------------------------------------------

    def stop_intake(self) -> None:
        """Answer every new request with `shutting-down` (requests in flight go on)."""
        self._intake.stop()

    def respond(self, request_id: int, response: Mapping[str, Any], now: float) -> list[str]:
        """End request `request_id` with `response`; returns the ids of the reply streams it
        announced (and so started).

        The driver starts a producer for each announced stream; streams the handler opened but
        left out of the response are aborted. Raises `TypeError` (and ends nothing) when the
        response cannot be JSON.
        """
        request = self._intake.get(request_id)
        if request is None or self._closed is not None:
            return []  # the session closed meanwhile: nobody is waiting for the answer
        frame = encode_reply(reply(request.env, dict(response)))
        self._intake.end(request_id)
        self._outbox.append(frame)
        announced = set(find_stream_ids(response))
        self._release_request_streams(request, now)
        started: list[str] = []
        for stream in request.reply_streams:
            if stream.stream_id in announced:
                started.append(stream.stream_id)
            else:
                self._abort_responder(stream, "the stream was not announced in the response", now)
        return started

    def refuse(self, request_id: int, error: AgentError, now: float) -> None:
        """End request `request_id` with `error {text, data}` (`data` from the error's class)."""
        request = self._intake.end(request_id)
        if request is None or self._closed is not None:
            return
        self._outbox.append(
            encode_reply(error_reply(request.env, str(error), wire_error_data(error)))
        )
        self._release_request_streams(request, now)
        for stream in request.reply_streams:
            self._abort_responder(stream, "the request failed", now)

    def seat(self, request_id: int, now: float) -> bool:
        """Request `request_id`, let in without a seat (its route may answer from memory),
        needs its handler after all: True once it holds a control seat; False when its class
        is full, and it was answered `retry` (it is over)."""
        request = self._intake.get(request_id)
        if request is None:
            return False
        deferred = self._intake.seat(request_id)
        if deferred is not None:
            self._defer(request.env, deferred)
            self._release_request_streams(request, now)
            return False
        return True

    def receive_request_stream(self, request_id: int, stream_id: str, now: float) -> None:
        """Stream `stream_id` of request `request_id` is read by its handler (`take`); once
        each. The probes it parked while held are answered now (flush)."""
        self._intake.unopened(request_id, stream_id).opened.add(stream_id)
        stream = self._streams.responders.get(stream_id)
        if stream is None:  # pragma: no cover - kept with its request
            raise StreamBroken(f"stream {stream_id} is gone")
        if self._charges is not None:
            self._charges.reading(stream_id)
        for answer in stream.read_now():
            self._answer_stream(stream, answer, now)

    def hold_request_stream(self, request_id: int, stream_id: str) -> None:
        """Stream `stream_id` of request `request_id` will be read later: until its handler
        reads it (`receive_request_stream`), every answer on it says `backpressure`, so its
        initiator probes rather than sends, and each probe waits for the read (or
        `park_timeout`: `ResponderStream`). A request waiting for a transfer slot holds its
        stream this way; its deadlines are unchanged (the initiator's probes and keep-alives
        keep it alive)."""
        self._intake.unopened(request_id, stream_id)
        stream = self._streams.responders.get(stream_id)
        if stream is not None:
            stream.hold()

    def open_reply_stream(self, request_id: int, now: float) -> str:
        """A new stream for the response of request `request_id`, which we will answer `read`
        on; returns its id (put its marker into the response)."""
        self._check_open()
        request = self._intake.get(request_id)
        if request is None:
            raise InvalidState("open_reply_stream() for a request that is not in flight")
        stream = self._streams.open_responder(self._new_id(), Role.SEND, now)
        request.reply_streams.append(stream)
        return stream.stream_id

    # --- calls we make ---------------------------------------------------------------------------

    def call(
        self, method: str, request: Mapping[str, Any], *, now: float, timeout: float | None
    ) -> str:
        """Queue a call of `method`; returns its id (its outcome arrives as an event). `timeout`
        None: no deadline here; the caller bounds the call (`CallTable.start`).

        Streams we opened with `open_send_stream()` whose markers are in `request` start once
        the request is queued (their frames queue after it). Raises `TypeError` when `request`
        cannot be JSON.
        """
        self._check_open()
        pending = self._calls.start(method, request, now=now, timeout=timeout)
        self._outbox.append(pending.wire)
        for stream_id in find_stream_ids(request):
            stream = self._streams.initiators.get(stream_id)
            if stream is not None and stream.state is InitiatorState.PENDING:
                stream.arm(now)
                self._pump(stream, now)
        return pending.call_id

    def cancel_call(self, call_id: str) -> None:
        """Forget a call whose caller gave up; a later answer is dropped as unmatched."""
        self._calls.cancel(call_id)

    def open_send_stream(self) -> str:
        """A new stream we drive and send on; returns its id (put its marker into a `call()`
        request: its frames wait for that request)."""
        self._check_open()
        return self._streams.open_initiator(Role.SEND).stream_id

    def receive_response_stream(self, stream_id: str, now: float) -> None:
        """Read stream `stream_id` (`take`), whose marker came in the response to one of our
        calls: we drive it from now on."""
        self._check_open()
        stream = self._streams.open_initiator(Role.RECEIVE, stream_id)
        stream.arm(now)
        self._pump(stream, now)

    # --- the local side of streams ---------------------------------------------------------------

    def write(self, stream_id: str, data: bytes | bytearray | memoryview, now: float) -> int:
        """Queue `data` on a stream we send on, in chunks of at most `MAX_CHUNK`, as many as
        the window has room for; returns how many bytes it took (all of a write that fits).
        Wait for `can_write()` first: a full window raises `InvalidState`, a stream that is
        over `StreamBroken` (broken) or `InvalidState` (ended)."""
        self._check_open()
        stream = self._live(stream_id)
        size = len(data)
        if size <= MAX_CHUNK:
            self._write(stream, data, now)
            return size
        view = memoryview(data)
        taken = 0
        while taken < size:
            piece = bytes(view[taken : taken + MAX_CHUNK])
            self._write(stream, piece, now)
            taken += len(piece)
            if not stream.has_space():
                break
        return taken

    def end_stream(self, stream_id: str, now: float) -> None:
        """Queue the closing bit after the data of a stream we send on."""
        self._check_open()
        stream = self._live(stream_id)
        if isinstance(stream, ResponderStream):
            self._send_replies(stream.close())
        else:
            stream.close()
            self._pump(stream, now)
        self._touch(stream)

    def abort_stream(self, stream_id: str, reason: str, now: float) -> None:
        """Break a stream locally (no closing bit); the peer sees it stop. Nothing happens to a
        stream that is over."""
        stream = self._streams.find(stream_id)
        if stream is None:
            return
        if isinstance(stream, ResponderStream):
            self._abort_responder(stream, reason, now)
        else:
            stream.abort(reason)
            self._pump(stream, now)
            self._touch(stream)

    def take(self, stream_id: str, now: float) -> bytes | Closing | None:
        """The next item of a stream we read (None: nothing yet; `CLOSING`: its end); raises
        `StreamBroken` once it broke and what came before was taken."""
        stream = self._live(stream_id)
        if isinstance(stream, ResponderStream):
            return self._take_received(stream)
        try:
            item = stream.take()
        except StreamBroken:
            self._pump(stream, now)  # its reader knows: it may go
            raise
        if item is not None:
            self._pump(stream, now)  # room in our window: ask for more
        return item

    def stop_reading(self, stream_id: str, now: float) -> None:
        """The reader stopped before the end: what still arrives is discarded."""
        stream = self._streams.find(stream_id)
        if stream is None:
            return
        if isinstance(stream, ResponderStream):
            for answer in stream.abandon(now):
                self._answer_stream(stream, answer, now)
            if self._charges is not None:
                self._charges.took(stream_id, 0)
            self._settle_charge(stream)
        elif stream.role is Role.RECEIVE:
            stream.stop_reading()
            self._pump(stream, now)
        elif not stream.done:
            stream.abort("the reader stopped")
            self._pump(stream, now)
        self._touch(stream)

    def settle_chunk(
        self, stream_id: str, token: ChunkToken, outcome: bytes | RemoteProtocolError, now: float
    ) -> None:
        """Report how a `ChunkToDecode` token decoded: its bytes, or why it is no chunk."""
        if not isinstance(token, PendingChunk):
            raise LocalProtocolError("settle_chunk() takes the token of a ChunkToDecode event")
        stream = self._streams.responders.get(stream_id)
        if stream is None:
            token.raw = None
            return
        was_open = not stream.done
        if self._charges is not None:
            self._charges.decoded(stream_id, token.size)
        stream.settle(token, outcome, now)
        if was_open and stream.broken:
            log.warning("stream_broken", stream_id=stream_id, reason=stream.broken_reason)
        self._touch(stream)
        self._release(stream, now)

    # --- internals -------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed is not None:
            raise SessionClosed(self._closed.close_code, self._closed.reason)

    def _live(self, stream_id: str) -> _Stream:
        """The registered stream `stream_id`; one forgotten raises what it would have."""
        stream = self._streams.find(stream_id)
        if stream is not None:
            return stream
        past = self._streams.past(stream_id)
        if past is None:
            raise StreamBroken(f"stream {stream_id} broke: the stream is gone")
        if isinstance(past, StreamEnded):
            raise InvalidState(f"stream {stream_id} is over")
        raise past.error()

    def _write(self, stream: _Stream, piece: bytes | bytearray | memoryview, now: float) -> None:
        if isinstance(stream, ResponderStream):
            self._send_replies(stream.offer(piece))
        else:
            stream.write(piece)
            self._pump(stream, now)

    def _touch(self, stream: _Stream) -> None:
        """Tell the driver `stream` moved: once over, that it ended or broke (once), else that
        it changed (two in a row are one)."""
        if stream.done and not stream.end_reported:
            stream.end_reported = True
            self._events.append(outcome_of(stream))
            return
        events = self._events
        last = events[-1] if events else None
        if not (type(last) is StreamChanged and last.stream_id == stream.stream_id):
            events.append(StreamChanged(stream.stream_id))

    def _send_replies(self, answers: list[StreamAnswer]) -> None:
        """Answers that invite nothing (to `read`s, on a stream we send), in order."""
        if self._closed is None:
            self._outbox.extend(encode_envelope(answer.envelope) for answer in answers)

    def _abort_responder(self, stream: ResponderStream, reason: str, now: float) -> None:
        self._send_replies(stream.abort(reason, now))
        self._touch(stream)

    def _release(self, stream: ResponderStream, now: float) -> None:
        """Answer the frames that waited for `stream`'s chunks; announce new chunks to decode."""
        if self._closed is not None:
            return
        for answer in stream.release():
            self._answer_stream(stream, answer, now)
        if stream.done:
            self._send_answers(self._budget.forget(stream.stream_id, now))
        received = stream.take_to_decode()
        if received:
            if self._charges is not None:
                self._charges.decoding(stream.stream_id, sum(chunk.size for chunk in received))
            self._events.extend(ChunkToDecode(stream.stream_id, c) for c in received)
        self._settle_charge(stream)

    def _answer_stream(self, stream: ResponderStream, answer: StreamAnswer, now: float) -> None:
        """Send an answer on a stream we answer for; one that invites the initiator's next
        chunk waits for room in the connection's receive budget (`receive_budget`)."""
        if answer.invites:
            self._send_answers(self._budget.admit(stream.stream_id, answer.envelope, now))
        else:
            self._outbox.append(encode_envelope(answer.envelope))

    def _send_answers(self, answers: list[Envelope]) -> None:
        self._outbox.extend(encode_envelope(answer) for answer in answers)

    def _pump(self, stream: InitiatorStream, now: float) -> None:
        """Queue what `stream` wants to send now; forget it once it has nothing more to say."""
        if self._closed is not None:
            return
        was_broken = stream.broken
        frames = self._streams.poll(stream, now)
        self._outbox.extend(encode_envelope(frame) for frame in frames)
        if frames or (stream.done and not stream.end_reported):
            self._touch(stream)
        if stream.broken and not was_broken:
            log.warning("stream_broken", stream_id=stream.stream_id, reason=stream.broken_reason)
        if stream.finished:
            self._streams.forget_initiator(stream.stream_id)

    def _release_request_streams(self, request: InFlight, now: float) -> None:
        for stream_id in request.streams:
            stream = self._streams.responders.get(stream_id)
            if stream is not None and stream.keep_alive:
                for answer in stream.abandon(now):
                    self._answer_stream(stream, answer, now)
                self._touch(stream)

    def _answer_malformed(self, obj: Mapping[str, Any], exc: RemoteProtocolError) -> None:
        target = answerable(obj)
        if target is None:
            log.warning("frame_dropped", reason=str(exc))
            return
        method, corr_id = target
        log.warning("frame_malformed", method=method, correlation_id=corr_id, reason=str(exc))
        env = Envelope(method, None, None, Correlation(corr_id, "request"))
        self._refuse_now(env, InvalidRequest(f"malformed envelope: {exc}"))

    def _refuse_now(self, env: Envelope, error: AgentError) -> None:
        self._outbox.append(encode_reply(error_reply(env, str(error), wire_error_data(error))))

    def _on_request(self, env: Envelope, now: float) -> None:
        verdict = self._intake.admit(env)
        if isinstance(verdict, Refused):
            self._refuse_now(env, verdict.error)
            return
        if isinstance(verdict, UnknownMethod):
            self._outbox.append(encode_reply(error_reply(env, verdict.text, dict(verdict.data))))
            return
        if isinstance(verdict, Deferred):
            self._defer(env, verdict)
            return
        assert isinstance(env.request, dict)  # the intake let in only a JSON object
        stream_ids = tuple(find_stream_ids(env.request))
        for index, stream_id in enumerate(stream_ids):
            try:
                registered = self._streams.open_responder(stream_id, Role.RECEIVE, now)
            except RemoteProtocolError as exc:
                for opened in stream_ids[:index]:
                    self._streams.forget_responder(opened)
                self._intake.withdraw(verdict)
                self._refuse_now(env, InvalidRequest(f"request: {exc}"))
                return
            # With a byte budget, a stream is invited only once its reader reads: the reader
            # holds a buffer by then, so what the stream draws always comes back.
            if self._charges is not None:
                registered.hold()
        self._intake.enter(verdict, env, stream_ids)
        request_id = verdict.request_id
        self._events.append(RequestReceived(request_id, env.method, env.request, stream_ids))

    def _defer(self, env: Envelope, deferred: Deferred) -> None:
        """Answer `env` `retry`: its class is full (counted, by class)."""
        cls = deferred.request_class
        in_flight = self._intake.seats.in_flight(cls)
        log.warning("request_deferred", method=env.method, request_class=cls, in_flight=in_flight)
        retry = retry_reply(env, self.settings.busy_retry_ms, deferred.reason)
        self._outbox.append(encode_reply(retry))

    def _on_response(self, env: Envelope, now: float) -> None:
        assert env.correlation is not None
        round_trip = self._calls.round_trip(env.correlation.id, now)
        if round_trip is not None and env.method == self._calls.method_of(env.correlation.id):
            self._rtt.sample(round_trip, now)
            self._budget.round_trip(round_trip, now)
        outcome = self._calls.on_response(env, now=now)
        if isinstance(outcome, Unmatched):
            log.info("response_unmatched", method=env.method, correlation_id=outcome.call_id)
        elif isinstance(outcome, Completed | CallErrored):
            self._events.append(outcome)
        else:
            log.info("call_retry_advised", method=env.method)

    # --- the byte budget ---------------------------------------------------------------------

    def _settle_charge(self, stream: ResponderStream) -> None:
        """Give back what `stream` no longer holds of the byte budget."""
        if self._charges is not None:
            self._charges.settle(stream)

    def _take_received(self, stream: ResponderStream) -> bytes | Closing | None:
        """`take` on a stream we receive on: the reader asks for the next chunk, so it is done
        with the one before (even when this raises); the one it gets stays drawn until then."""
        charges = self._charges
        if charges is not None:
            charges.took(stream.stream_id, 0)
        try:
            item = stream.take()
        except StreamBroken:
            self._settle_charge(stream)
            raise
        if charges is not None and isinstance(item, bytes):
            charges.took(stream.stream_id, len(item))
        self._settle_charge(stream)
        return item

    def _on_stream_frame(self, env: Envelope, now: float, size: int) -> None:
        charges = self._charges
        keeper = None if charges is None else self._streams.chunk_keeper(env)
        if charges is not None and keeper is not None and not charges.draw(keeper.stream_id, size):
            self._abort_responder(keeper, no_room_reason(size), now)
            self._release(keeper, now)
            return
        result = self._streams.on_frame(env, now)
        if charges is not None and keeper is not None and result.waits:
            # It waits behind a chunk being decoded: its whole draw stays with it meanwhile.
            charges.wait(keeper.stream_id, size)
        if result.dropped:
            log.debug("stream_frame_unrouted", stream_id=result.stream_id, reason=result.dropped)
        responder = (
            None if result.stream_id is None else self._streams.responders.get(result.stream_id)
        )
        if responder is not None and result.used is not None:
            chunk = result.used == "chunk"
            self._budget.arrived(responder.stream_id, size=size, chunk=chunk, now=now)
        if result.reply is not None:
            if responder is not None:
                self._answer_stream(responder, result.reply, now)
            else:
                self._outbox.append(encode_envelope(result.reply.envelope))
        if result.stream_id is None:
            return
        if responder is not None:
            self._touch(responder)
            self._release(responder, now)
            return
        initiator = self._streams.initiators.get(result.stream_id)
        if initiator is not None:
            self._touch(initiator)
            self._pump(initiator, now)
