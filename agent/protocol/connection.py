"""`Connection`: one TypedRequest/VirtualStream connection, sans I/O.

Everything the protocol decides lives here; an I/O driver (`agent.session.peer`) only moves
bytes and runs handlers. In the shape of websockets' `Protocol`:

- frames go in through `receive(frame, now)`; local actions are methods (`call`, `respond`,
  `refuse`, `write`, `take`, ...), each taking `now`;
- what to send comes out of `data_to_send()` and what happened out of `events_received()`;
  both drain and clear. Frames leave in the order they were produced, so the request carrying
  a stream marker always precedes the stream's own frames;
- time passes only through `advance(now)`; `next_deadline()` says when that is next needed.
  No timer is a task.

Intake rules for a request frame, in this order:

1. intake stopped (`stop_intake()`): `shutting-down`, retryable;
2. a method nobody routes: the typedrequest text "There is no available method for this call on
   the server side", code `unknown-method`;
3. a `request` that is no JSON object: `invalid-request`;
4. `max_concurrent_requests` already being handled: a `retry` answer (no `error`), so the caller
   sends the identical request again after `busy_retry_ms` (typedrequest callers do this on
   their own; our `CallTable` does too). A flood therefore costs one small answer per frame,
   never a handler or its memory;
5. every stream marker in the request registers a stream we answer for; a duplicate stream id
   refuses the request (`invalid-request`) and unregisters the ones it had already opened;
6. otherwise a `RequestReceived` event: the driver runs the route and ends the request with
   `respond()` or `refuse()`. Ending it releases the request's streams (nobody reads them any
   more) and starts the streams the handler announced in its response (`open_reply_stream`);
   one it opened but left out of the response is aborted.

Received chunks: a large chunk of a stream we answer for is queued undecoded and announced as a
`ChunkReceived` event; the driver decodes it off the event loop (`chunk.decode()`) and reports
with `settle_chunk()`. Frames of that stream arriving meanwhile wait and are answered once it is
settled, so a chunk that does not decode has broken its stream before the peer's next frame of
it is answered (`stream_responder`); other streams' frames and requests do not wait.

A malformed envelope that still names a method and a request correlation id gets an
`invalid-request` answer that echoes nothing of it; anything else malformed is dropped with a
log line. A frame nesting deeper than `envelope.MAX_DEPTH` is malformed. No frame a peer sends
makes `receive` raise, and no reply it triggers (`respond`, `refuse` included) fails to encode
for the peer's sake: an echoed request that does not encode is sent as `request: null`.
Stream frames are routed by `StreamRegistry` (which answers a frame for an unknown stream at
most once); no answer carries a peer's payload back. Nothing here logs a payload or a secret.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import structlog

from agent.errors import (
    AgentError,
    InvalidRequest,
    InvalidState,
    LocalProtocolError,
    RemoteProtocolError,
    SessionClosed,
    ShuttingDown,
    StreamBroken,
    wire_error_data,
)
from agent.protocol.calls import CallTable, Completed, Failed, Unmatched
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
from agent.protocol.ids import new_uni_id
from agent.protocol.markers import find_stream_ids
from agent.protocol.settings import ConnectionSettings, StreamSettings
from agent.protocol.stream_initiator import InitiatorState, InitiatorStream
from agent.protocol.stream_registry import StreamRegistry
from agent.protocol.stream_responder import PendingChunk, ResponderStream, Role

__all__ = [
    "MAX_CHUNK",
    "UNKNOWN_METHOD_TEXT",
    "ChunkReceived",
    "Completed",
    "Connection",
    "ConnectionSettings",
    "ConnectionState",
    "Event",
    "Failed",
    "RequestReceived",
    "Stream",
    "StreamChanged",
    "StreamSettings",
]

UNKNOWN_METHOD_TEXT: Final = "There is no available method for this call on the server side"
# A write larger than this goes out as several chunks: one 1 MiB chunk is a ~4 MB frame in the
# Buffer form already, and the window bounds memory as window x chunk size.
MAX_CHUNK: Final = 1 << 20

Stream = InitiatorStream | ResponderStream

log = structlog.get_logger("agent.protocol")


@dataclass(frozen=True, slots=True)
class RequestReceived:
    """The peer asks us to handle `method`; end it with `respond()` or `refuse()`."""

    request_id: int
    method: str
    request: dict[str, Any]
    stream_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class StreamChanged:
    """Stream `stream_id` changed (data, room, end or breakage): its waiters re-check it."""

    stream_id: str


@dataclass(frozen=True, slots=True)
class ChunkReceived:
    """A chunk of stream `stream_id` was queued undecoded: decode it (`chunk.decode()`, pure,
    best in a worker thread) and report the bytes or the `RemoteProtocolError` with
    `settle_chunk()` before feeding the connection its next frame."""

    stream_id: str
    chunk: PendingChunk


Event = RequestReceived | Completed | Failed | StreamChanged | ChunkReceived


class ConnectionState(enum.Enum):
    """OPEN until the transport is gone; CLOSED is final."""

    OPEN = "open"
    CLOSED = "closed"


@dataclass(slots=True)
class _Request:
    """A request being handled: its envelope (echoed in the reply) and its streams."""

    env: Envelope
    streams: tuple[str, ...]
    opened: set[str] = field(default_factory=set)  # request streams a handler reads
    reply_streams: list[ResponderStream] = field(default_factory=list)


class Connection:
    """The protocol state of one connection, in either role (client or server socket)."""

    def __init__(
        self,
        methods: Collection[str],
        settings: ConnectionSettings | None = None,
        *,
        new_id: Callable[[], str] = new_uni_id,
    ) -> None:
        self.settings = settings or ConnectionSettings()
        self._methods = frozenset(methods)
        self._new_id = new_id
        self._calls = CallTable(new_id=new_id, max_attempts=self.settings.max_retry_attempts)
        self._streams = StreamRegistry(self.settings.streams, new_id)
        self._requests: dict[int, _Request] = {}
        self._request_ids = 0
        self._outbox: list[bytes] = []
        self._events: list[Event] = []
        self._changed: dict[str, None] = {}  # stream ids, in the order they changed
        self._intake_open = True
        self._closed: SessionClosed | None = None
        self._now = 0.0

    # --- what comes out ------------------------------------------------------------------------

    def data_to_send(self) -> list[bytes]:
        """Frames to send, in order; the list is handed over and cleared."""
        frames, self._outbox = self._outbox, []
        return frames

    def events_received(self) -> list[Event]:
        """What happened since the last call, in order; handed over and cleared."""
        changed = [StreamChanged(stream_id) for stream_id in self._changed]
        self._changed.clear()
        events, self._events = self._events + changed, []
        return events

    def next_deadline(self) -> float | None:
        """When `advance()` next has something to do (None: only frames and actions matter)."""
        times = [self._calls.next_deadline(), self._streams.next_wakeup()]
        times += [stream.next_wakeup() for stream in self._streams.initiators.values()]
        return min((t for t in times if t is not None), default=None)

    @property
    def state(self) -> ConnectionState:
        """OPEN or CLOSED."""
        return ConnectionState.OPEN if self._closed is None else ConnectionState.CLOSED

    @property
    def in_flight(self) -> int:
        """Requests being handled right now."""
        return len(self._requests)

    # --- what goes in: frames and time ---------------------------------------------------------

    def receive(self, frame: bytes, now: float) -> None:
        """Take one text frame (UTF-8 JSON) from the peer."""
        self._check_open()
        self._now = now
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
            self._on_stream_frame(env, now)
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
        self._now = now
        self._events.extend(self._calls.expire(now))
        for call in self._calls.due_resends(now):
            log.info("call_resent", method=call.method, attempt=call.sends)
            self._outbox.append(call.wire)
        for stream_id, answer in self._streams.expire(now):
            self._changed[stream_id] = None
            if answer is not None:
                self._outbox.append(encode_envelope(answer))
            responder = self._streams.responders.get(stream_id)
            if responder is not None and responder.broken_reason and responder.done:
                log.warning("stream_broken", stream_id=stream_id, reason=responder.broken_reason)
            if responder is not None:
                self._release(responder)
        for stream in list(self._streams.initiators.values()):
            self._pump(stream, now)

    def close(self, reason: SessionClosed) -> None:
        """The transport is gone: every call fails, every stream breaks, nothing is sent."""
        if self._closed is not None:
            return
        self._closed = reason
        self._outbox.clear()
        for call_id in self._calls.clear():
            self._events.append(Failed(call_id, SessionClosed(reason.close_code, reason.reason)))
        for stream in list(self._streams.all_streams()):
            if isinstance(stream, ResponderStream):
                stream.abort("the session closed", self._now)
            else:
                stream.abort("the session closed")
            self._changed[stream.stream_id] = None
        self._requests.clear()

    # --- requests we handle ----------------------------------------------------------------------

    def stop_intake(self) -> None:
        """Answer every new request with `shutting-down` (requests in flight go on)."""
        self._intake_open = False

    def respond(self, request_id: int, response: Mapping[str, Any]) -> list[ResponderStream]:
        """End request `request_id` with `response`; returns the reply streams it announced.

        The driver starts a producer for each announced stream; streams the handler opened but
        left out of the response are aborted. Raises `TypeError` (and ends nothing) when the
        response cannot be JSON.
        """
        request = self._requests.get(request_id)
        if request is None or self._closed is not None:
            return []  # the session closed meanwhile: nobody is waiting for the answer
        frame = encode_reply(reply(request.env, dict(response)))
        del self._requests[request_id]
        self._outbox.append(frame)
        announced = set(find_stream_ids(response))
        self._release_request_streams(request)
        started: list[ResponderStream] = []
        for stream in request.reply_streams:
            if stream.stream_id in announced:
                started.append(stream)
            else:
                self._abort_responder(stream, "the stream was not announced in the response")
        return started

    def refuse(self, request_id: int, error: AgentError) -> None:
        """End request `request_id` with `error {text, data}` (`data` from the error's class)."""
        request = self._requests.pop(request_id, None)
        if request is None or self._closed is not None:
            return
        self._outbox.append(
            encode_reply(error_reply(request.env, str(error), wire_error_data(error)))
        )
        self._release_request_streams(request)
        for stream in request.reply_streams:
            self._abort_responder(stream, "the request failed")

    def request_stream(self, request_id: int, stream_id: str) -> ResponderStream:
        """The stream `stream_id` of request `request_id`, for its handler to read; once each."""
        request = self._requests.get(request_id)
        if request is None or stream_id not in request.streams or stream_id in request.opened:
            raise LocalProtocolError(
                f"stream {stream_id} is not an unopened stream of this request"
            )
        request.opened.add(stream_id)
        stream = self._streams.responders.get(stream_id)
        if stream is None:  # pragma: no cover - registered with the request, kept until it ends
            raise StreamBroken(f"stream {stream_id} is gone")
        return stream

    def open_reply_stream(self, request_id: int) -> ResponderStream:
        """A stream for the response of request `request_id`, which we will answer `read` on."""
        self._check_open()
        request = self._requests.get(request_id)
        if request is None:
            raise InvalidState("open_reply_stream() for a request that is not in flight")
        stream = self._streams.open_responder(self._new_id(), Role.SEND, self._now)
        request.reply_streams.append(stream)
        return stream

    # --- calls we make ---------------------------------------------------------------------------

    def call(self, method: str, request: Mapping[str, Any], *, now: float, timeout: float) -> str:
        """Queue a call of `method`; returns its id (its outcome arrives as an event).

        Streams we opened with `open_send_stream()` whose markers are in `request` start once
        the request is queued (their frames queue after it). Raises `TypeError` when `request`
        cannot be JSON.
        """
        self._check_open()
        self._now = now
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

    def open_send_stream(self) -> InitiatorStream:
        """A stream we drive and send on; put its marker into a `call()` request."""
        self._check_open()
        return self._streams.open_initiator(Role.SEND)

    def receive_stream(self, stream_id: str, now: float) -> InitiatorStream:
        """Read stream `stream_id`, whose marker came in the response to one of our calls."""
        self._check_open()
        stream = self._streams.open_initiator(Role.RECEIVE, stream_id)
        stream.arm(now)
        self._pump(stream, now)
        return stream

    # --- the local side of streams ---------------------------------------------------------------

    def write(self, stream: Stream, data: bytes, now: float) -> None:
        """Queue `data` on a stream we send on (check `stream.has_space()` first)."""
        self._check_open()
        self._now = now
        if isinstance(stream, ResponderStream):
            self._send_answer(stream.offer(data))
        else:
            stream.write(data)
            self._pump(stream, now)

    def close_stream(self, stream: Stream, now: float) -> None:
        """Queue the closing bit after the data of a stream we send on."""
        self._check_open()
        self._now = now
        if isinstance(stream, ResponderStream):
            self._send_answer(stream.close())
        else:
            stream.close()
            self._pump(stream, now)
        self._changed[stream.stream_id] = None

    def abort_stream(self, stream: Stream, reason: str, now: float) -> None:
        """Break a stream locally (no closing bit); the peer sees it stop."""
        self._now = now
        if isinstance(stream, ResponderStream):
            self._abort_responder(stream, reason)
        else:
            stream.abort(reason)
            self._pump(stream, now)
            self._changed[stream.stream_id] = None

    def take(self, stream: Stream, now: float) -> bytes | Closing | None:
        """The next item of a stream we read (None: nothing yet); raises `StreamBroken`."""
        self._now = now
        item = stream.take()
        if item is not None and isinstance(stream, InitiatorStream):
            self._pump(stream, now)  # room in our window: ask for more
        return item

    def settle_chunk(
        self, stream_id: str, chunk: PendingChunk, outcome: bytes | RemoteProtocolError, now: float
    ) -> None:
        """Report how a `ChunkReceived` chunk decoded: its bytes, or why it is no chunk."""
        self._now = now
        stream = self._streams.responders.get(stream_id)
        if stream is None:
            chunk.raw = None
            return
        was_open = not stream.done
        stream.settle(chunk, outcome, now)
        self._changed[stream_id] = None
        if was_open and stream.done and stream.broken_reason:
            log.warning("stream_broken", stream_id=stream_id, reason=stream.broken_reason)
        self._release(stream)

    def _release(self, stream: ResponderStream) -> None:
        """Answer the frames that waited for `stream`'s chunks; announce new chunks to decode."""
        if self._closed is not None:
            return
        for answer in stream.release():
            self._outbox.append(encode_envelope(answer))
        if stream.received:
            self._events.extend(ChunkReceived(stream.stream_id, c) for c in stream.received)
            stream.received.clear()

    def stop_reading(self, stream: Stream, now: float) -> None:
        """The reader stopped before the end: what still arrives is discarded."""
        self._now = now
        if isinstance(stream, ResponderStream):
            stream.abandon(now)
        elif not stream.done:
            stream.abort("the reader stopped")
            self._pump(stream, now)
        self._changed[stream.stream_id] = None

    # --- internals -------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed is not None:
            raise SessionClosed(self._closed.close_code, self._closed.reason)

    def _send_answer(self, answer: Envelope | None) -> None:
        if answer is not None and self._closed is None:
            self._outbox.append(encode_envelope(answer))

    def _abort_responder(self, stream: ResponderStream, reason: str) -> None:
        self._send_answer(stream.abort(reason, self._now))
        self._changed[stream.stream_id] = None

    def _pump(self, stream: InitiatorStream, now: float) -> None:
        """Queue what `stream` wants to send now; forget it once it has nothing more to say."""
        if self._closed is not None:
            return
        was_broken = stream.state is InitiatorState.BROKEN
        frames = self._streams.poll(stream, now)
        self._outbox.extend(encode_envelope(frame) for frame in frames)
        if frames or stream.done:
            self._changed[stream.stream_id] = None
        if stream.state is InitiatorState.BROKEN and not was_broken:
            log.warning("stream_broken", stream_id=stream.stream_id, reason=stream.broken_reason)
        if stream.finished:
            self._streams.forget_initiator(stream.stream_id)

    def _release_request_streams(self, request: _Request) -> None:
        for stream_id in request.streams:
            stream = self._streams.responders.get(stream_id)
            if stream is not None and stream.keep_alive:
                stream.abandon(self._now)
                self._changed[stream_id] = None

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
        if not self._intake_open:
            self._refuse_now(
                env, ShuttingDown("the agent is shutting down and takes no new requests")
            )
            return
        if env.method not in self._methods:
            data = {"code": "unknown-method", "retryable": False}
            self._outbox.append(encode_reply(error_reply(env, UNKNOWN_METHOD_TEXT, data)))
            return
        if not isinstance(env.request, dict):
            self._refuse_now(env, InvalidRequest("request: the request is not a JSON object"))
            return
        limit = self.settings.max_concurrent_requests
        if len(self._requests) >= limit:
            log.warning("request_deferred", method=env.method, in_flight=len(self._requests))
            reason = f"the agent is busy with {limit} requests; send it again"
            self._outbox.append(encode_reply(retry_reply(env, self.settings.busy_retry_ms, reason)))
            return
        stream_ids = tuple(find_stream_ids(env.request))
        for index, stream_id in enumerate(stream_ids):
            try:
                self._streams.open_responder(stream_id, Role.RECEIVE, now)
            except RemoteProtocolError as exc:
                for opened in stream_ids[:index]:
                    self._streams.forget_responder(opened)
                self._refuse_now(env, InvalidRequest(f"request: {exc}"))
                return
        self._request_ids += 1
        self._requests[self._request_ids] = _Request(env, stream_ids)
        self._events.append(RequestReceived(self._request_ids, env.method, env.request, stream_ids))

    def _on_response(self, env: Envelope, now: float) -> None:
        outcome = self._calls.on_response(env, now=now)
        if isinstance(outcome, Unmatched):
            log.info("response_unmatched", method=env.method, correlation_id=outcome.call_id)
        elif isinstance(outcome, Completed | Failed):
            self._events.append(outcome)
        else:
            log.info("call_retry_advised", method=env.method)

    def _on_stream_frame(self, env: Envelope, now: float) -> None:
        result = self._streams.on_frame(env, now)
        if result.dropped:
            log.debug("stream_frame_unrouted", stream_id=result.stream_id, reason=result.dropped)
        if result.reply is not None:
            self._outbox.append(encode_envelope(result.reply))
        if result.stream_id is None:
            return
        self._changed[result.stream_id] = None
        responder = self._streams.responders.get(result.stream_id)
        if responder is not None:
            self._release(responder)
        initiator = self._streams.initiators.get(result.stream_id)
        if initiator is not None:
            self._pump(initiator, now)
