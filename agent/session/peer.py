"""`Peer`: the asyncio driver of the TypedRequest/VirtualStream core over ONE connection.

Usage notes for the other parts (the seam fixed in /tmp/team/peer_api.md):

    router = Router()
    router.register("pushClusterConfig", handle_push)      # async (request, ctx) -> dict
    peer = Peer(transport, router, settings=PeerSettings())
    async with asyncio.TaskGroup() as tg:
        tg.create_task(peer.run())                         # raises SessionClosed at close
        reply = await peer.call("getIdentityByToken", {"token": token.reveal()}, timeout=10)

- `transport` is any `FrameTransport`: `send(bytes)` sends ONE text frame (UTF-8 JSON),
  `recv()` returns the next one and raises `SessionClosed` when the connection is gone. The
  websocket adapter lives in the session module that owns the socket, not here.
- `run()` is the only reader. It owns every handler task and stream task in its own TaskGroup;
  when it ends (transport closed, or cancelled) every pending call fails with `SessionClosed`,
  every stream with `StreamBroken`, and every handler task is cancelled and awaited.
- Handlers get `(request, ctx)`. Raise an `AgentError` to refuse (becomes `error {text, data}`
  with `data.code`); a pydantic `ValidationError` becomes `invalid-request` naming the first
  field path (camelCase, dotted); anything else becomes `internal` with a generic text.
- Receiving a stream that sits in a request: `async for chunk in ctx.receive_stream(marker)`,
  where `marker` is the `StreamMarker` field of the validated request model. Iteration ends at
  the closing bit and raises `StreamBroken` if the stream dies.
- Sending bytes as the CALLER: `marker, sink = peer.open_send_stream()`, put the marker into
  the request, run `peer.call(...)` in a task you own and meanwhile `await sink.write(chunk)`
  (waits while the window is full; stream frames start once the request is sent) and
  `await sink.close()` (returns when the responder took the closing bit).
- Sending bytes as a HANDLER: the marker travels in the response, so the caller reads only
  after the handler returned. `marker, sink = ctx.open_send_stream(producer)` and return the
  marker in the response; once the response is sent, the Peer runs `await producer(sink)` in a
  task it owns, then closes the sink (aborts it if the producer raises). Without a producer a
  handler can queue at most `stream_window` chunks (then `await sink.close()`) before returning.
  A send stream whose marker is not in the sent response is aborted.
- A stream marker in the RESPONSE of our own call: `peer.receive_stream(StreamMarker(...))`;
  stop early with `await source.aclose()`. Needs a peer that answers `read` (ours does; a
  typedrequest 3.3.0 responder does not, and the source raises `StreamBroken` at once).
- Writes above 1 MiB are split into 1 MiB chunks. docs/wire-notes.md has the wire details.
- Shutdown: `peer.stop_intake()` (new requests get `shutting-down`), `await peer.drain(t)`
  (waits for in-flight handlers up to `t` seconds, then cancels them), then close the transport.
- Nothing here logs a payload, a request body or a secret; event names are snake_case.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

import structlog

from agent.contracts.base import StreamMarker
from agent.errors import (
    AgentError,
    CallTimeout,
    InvalidRequest,
    InvalidState,
    RemoteProtocolError,
    SessionClosed,
    ShuttingDown,
    wire_error_data,
)
from agent.protocol.calls import CallTable, Completed, Failed, Outcome, Resend, Unmatched
from agent.protocol.chunks import ChunkForm
from agent.protocol.envelope import (
    Correlation,
    Envelope,
    FrameKind,
    answerable,
    classify,
    encode_envelope,
    envelope_from_json,
    error_reply,
    parse_frame,
)
from agent.protocol.ids import new_uni_id
from agent.protocol.markers import find_stream_ids, marker
from agent.protocol.stream_initiator import InitiatorState, InitiatorStream
from agent.protocol.stream_responder import ResponderStream, Role
from agent.protocol.streams import StreamRegistry, StreamSettings
from agent.session.peer_requests import RequestContext, answer
from agent.session.peer_streams import (
    PeerSink,
    PeerSource,
    Signal,
    StreamHandle,
    drive_initiator,
    keep_house,
)
from agent.session.peer_types import (
    UNKNOWN_METHOD_TEXT,
    ByteSink,
    ByteSource,
    FrameTransport,
    Handler,
    PeerSettings,
    Producer,
    Router,
)

__all__ = [
    "UNKNOWN_METHOD_TEXT",
    "ByteSink",
    "ByteSource",
    "FrameTransport",
    "Handler",
    "Peer",
    "PeerSettings",
    "Producer",
    "RequestContext",
    "Router",
]

log = structlog.get_logger(__name__)


class Peer:
    """One TypedRequest peer over one `FrameTransport`: answers requests, makes calls, streams."""

    def __init__(
        self,
        transport: FrameTransport,
        router: Router,
        *,
        settings: PeerSettings,
        clock: Callable[[], float] = time.monotonic,
        new_id: Callable[[], str] = new_uni_id,
    ) -> None:
        if settings.chunk_form not in ("buffer", "base64"):
            raise InvalidState(f"unknown chunk_form {settings.chunk_form!r}")
        self._transport = transport
        self._router = router
        self._settings = settings
        self._clock = clock
        self._calls = CallTable(new_id=new_id, max_attempts=settings.max_retry_attempts)
        self._waiters: dict[str, asyncio.Future[Outcome]] = {}
        form: ChunkForm = "base64" if settings.chunk_form == "base64" else "buffer"
        self._streams = StreamRegistry(
            StreamSettings(
                window=settings.stream_window,
                keepalive_interval=settings.keepalive_interval,
                keepalive_timeout=settings.keepalive_timeout,
                probe_interval=settings.backpressure_probe,
                chunk_form=form,
            ),
            new_id,
        )
        self._handles: dict[str, StreamHandle] = {}
        self._send_lock = asyncio.Lock()
        self._housekeeping = Signal()
        self._tg: asyncio.TaskGroup | None = None
        self._deferred: list[Coroutine[Any, Any, None]] = []
        self._children: set[asyncio.Task[None]] = set()
        self._handlers: dict[asyncio.Task[None], Envelope] = {}
        self._intake_open = True
        self._started = False
        self._closed: SessionClosed | None = None

    # --- lifecycle ---------------------------------------------------------------------------

    async def run(self) -> None:
        """Read frames until the transport closes (raises `SessionClosed`)."""
        if self._started:
            raise InvalidState("Peer.run() may be called once")
        self._started = True
        closed = SessionClosed(None, "peer stopped")
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                for coro in self._deferred:
                    self._spawn(coro)
                self._deferred.clear()
                self._spawn(self._keep_house())
                try:
                    while True:
                        await self._on_frame(await self._transport.recv())
                except SessionClosed as exc:
                    closed = exc
                finally:
                    self._shut_down(closed)
        finally:
            self._tg = None
        raise closed

    def _shut_down(self, exc: SessionClosed) -> None:
        self._closed = exc
        for waiter in self._waiters.values():
            if not waiter.done():
                waiter.set_exception(SessionClosed(exc.close_code, exc.reason))
        self._calls.clear()
        now = self._clock()
        for handle in self._handles.values():
            stream = handle.stream
            if isinstance(stream, ResponderStream):
                stream.abort("the session closed", now)
            else:
                stream.abort("the session closed")
            handle.signal.fire()
        for task in self._children:
            task.cancel()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[None] | None:
        if self._closed is not None:
            coro.close()
            raise SessionClosed(self._closed.close_code, self._closed.reason)
        if self._tg is None:
            self._deferred.append(coro)  # run() starts it
            return None
        task = self._tg.create_task(coro)
        self._children.add(task)
        task.add_done_callback(self._children.discard)
        return task

    def stop_intake(self) -> None:
        """Answer every new request with `shutting-down`."""
        self._intake_open = False

    async def drain(self, timeout: float) -> None:  # noqa: ASYNC109  # fixed by the seam
        """Wait up to `timeout` seconds for in-flight handlers, then cancel the rest.

        A cancelled handler's caller gets a `shutting-down` error (if the transport is up).
        """
        tasks = set(self._handlers)
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=timeout)
        envs = [self._handlers[task] for task in pending if task in self._handlers]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
        for env in envs:
            refusal = ShuttingDown("the agent stopped before finishing this request")
            await self._try_send(error_reply(env, str(refusal), wire_error_data(refusal)))

    @property
    def in_flight(self) -> int:
        """Number of requests being handled right now."""
        return len(self._handlers)

    # --- outgoing calls ------------------------------------------------------------------------

    async def call(
        self,
        method: str,
        request: Mapping[str, Any],
        *,
        timeout: float,  # noqa: ASYNC109  # the seam fixes a per-call timeout argument
    ) -> dict[str, Any]:
        """Call `method` on the peer; raises `CallFailed`, `CallTimeout`, `SessionClosed`.

        A `retry` answer is honoured: the identical frame goes out again after `waitForMs`,
        at most `max_retry_attempts` sends in all, all within `timeout`.
        """
        self._check_open()
        pending = self._calls.start(method, request, now=self._clock(), timeout=timeout)
        try:
            async with asyncio.timeout(timeout):
                return await self._exchange(pending.call_id, method, pending.frame, request)
        except TimeoutError as exc:
            raise CallTimeout(method, timeout) from exc
        finally:
            self._waiters.pop(pending.call_id, None)
            self._calls.cancel(pending.call_id)

    async def _exchange(
        self, call_id: str, method: str, env: Envelope, request: Mapping[str, Any]
    ) -> dict[str, Any]:
        frame = encode_envelope(env)  # encoded once: every resend is byte-identical
        loop = asyncio.get_running_loop()
        while True:
            waiter = self._waiters[call_id] = loop.create_future()
            await self._send(frame)
            self._arm(request)
            outcome = await waiter
            if isinstance(outcome, Completed):
                return outcome.response
            if isinstance(outcome, Failed):
                raise outcome.error
            assert isinstance(outcome, Resend)
            log.info("call_retry_advised", method=method)
            await asyncio.sleep(max(0.0, outcome.at - self._clock()))

    # --- streams -------------------------------------------------------------------------------

    def open_send_stream(self) -> tuple[dict[str, Any], ByteSink]:
        """A new stream we initiate and send bytes in; put the marker into a `call` request.

        Frames flow once the request carrying the marker is sent; until then `write` can
        queue `stream_window` chunks. `close()` returns when the responder took the closing bit.
        """
        self._check_open()
        stream = self._streams.open_initiator(Role.SEND)
        handle = self._register(stream)
        self._spawn(self._drive(handle, stream))
        return marker(stream.stream_id), self._sink(handle)

    def receive_stream(self, marker: StreamMarker) -> ByteSource:
        """Read the stream `marker` found in the response of one of our calls.

        Stopping early: `await source.aclose()` (e.g. `contextlib.aclosing`), or the stream
        keeps its window full until the session ends.
        """
        self._check_open()
        stream = self._streams.open_initiator(Role.RECEIVE, marker.stream_id)
        stream.arm(self._clock())
        handle = self._register(stream)
        self._spawn(self._drive(handle, stream))
        return PeerSource(handle, on_stop=lambda: stream.abort("the reader stopped"))

    def _register(self, stream: ResponderStream | InitiatorStream) -> StreamHandle:
        handle = StreamHandle(stream)
        self._handles[stream.stream_id] = handle
        return handle

    def _open_responder_send(self) -> StreamHandle:
        self._check_open()
        stream_id = new_uni_id()
        return self._register(self._streams.open_responder(stream_id, Role.SEND, self._clock()))

    def _source(self, stream_id: str) -> PeerSource:
        handle = self._handles[stream_id]
        stream = handle.stream
        assert isinstance(stream, ResponderStream)
        return PeerSource(handle, on_stop=lambda: stream.abandon(self._clock()))

    def _sink(self, handle: StreamHandle) -> PeerSink:
        return PeerSink(handle, send_answer=self._try_send, clock=self._clock)

    def _arm(self, request: Mapping[str, Any]) -> None:
        now = self._clock()
        for stream_id in find_stream_ids(request):
            stream = self._streams.initiators.get(stream_id)
            if stream is not None and stream.state is InitiatorState.PENDING:
                stream.arm(now)
                self._handles[stream_id].signal.fire()

    async def _drive(self, handle: StreamHandle, stream: InitiatorStream) -> None:
        try:
            await drive_initiator(handle, stream, self._streams, self._send, self._clock)
        finally:
            if stream.done:
                self._handles.pop(stream.stream_id, None)

    async def _keep_house(self) -> None:
        await keep_house(
            self._streams,
            self._handles,
            self._try_send,
            self._clock,
            self._housekeeping,
            self._settings.keepalive_interval,
        )

    # --- incoming frames -----------------------------------------------------------------------

    async def _on_frame(self, frame: bytes) -> None:
        try:
            obj = parse_frame(frame)
        except RemoteProtocolError as exc:
            log.warning("frame_dropped", reason=str(exc))
            return
        try:
            env = envelope_from_json(obj)
        except RemoteProtocolError as exc:
            await self._answer_malformed(obj, exc)
            return
        kind = classify(env)
        if kind is FrameKind.STREAM:
            await self._on_stream_frame(env)
        elif kind is FrameKind.REQUEST:
            await self._on_request(env)
        elif kind is FrameKind.RESPONSE:
            self._on_response(env)
        else:
            log.warning("frame_dropped", method=env.method, reason="weirdly shaped frame")

    async def _answer_malformed(self, obj: Mapping[str, Any], exc: RemoteProtocolError) -> None:
        target = answerable(obj)
        if target is None:
            log.warning("frame_dropped", reason=str(exc))
            return
        method, corr_id = target
        log.warning("frame_malformed", method=method, correlation_id=corr_id, reason=str(exc))
        refusal = InvalidRequest(f"malformed envelope: {exc}")
        env = Envelope(method, None, None, Correlation(corr_id, "request"))
        await self._try_send(error_reply(env, str(refusal), wire_error_data(refusal)))

    async def _on_stream_frame(self, env: Envelope) -> None:
        result = self._streams.on_frame(env, self._clock())
        if result.dropped:
            log.debug("stream_frame_unrouted", stream_id=result.stream_id, reason=result.dropped)
        if result.stream_id is not None and (handle := self._handles.get(result.stream_id)):
            handle.signal.fire()
        if result.reply is not None:
            await self._send(encode_envelope(result.reply))
        elif result.stream_id in self._streams.responders:
            self._housekeeping.fire()  # a parked read: its timer is new

    def _on_response(self, env: Envelope) -> None:
        outcome = self._calls.on_response(env, now=self._clock())
        if isinstance(outcome, Unmatched):
            log.info("response_unmatched", method=env.method, correlation_id=outcome.call_id)
            return
        waiter = self._waiters.get(outcome.call_id)
        if waiter is not None and not waiter.done():
            waiter.set_result(outcome)

    async def _on_request(self, env: Envelope) -> None:
        refusal: AgentError | None = None
        handler = self._router.get(env.method)
        if not self._intake_open:
            refusal = ShuttingDown("the agent is shutting down and takes no new requests")
        elif handler is None:
            data = {"code": "unknown-method", "retryable": False}
            await self._try_send(error_reply(env, UNKNOWN_METHOD_TEXT, data))
            return
        elif not isinstance(env.request, dict):
            refusal = InvalidRequest("request: the request is not a JSON object")
        if refusal is not None:
            await self._try_send(error_reply(env, str(refusal), wire_error_data(refusal)))
            return
        assert handler is not None
        stream_ids = find_stream_ids(env.request)
        try:
            now = self._clock()
            for index, stream_id in enumerate(stream_ids):
                try:
                    stream = self._streams.open_responder(stream_id, Role.RECEIVE, now)
                except RemoteProtocolError:
                    for opened in stream_ids[:index]:
                        self._streams.responders.pop(opened, None)
                        self._handles.pop(opened, None)
                    raise
                self._register(stream)
        except RemoteProtocolError as exc:
            refusal = InvalidRequest(f"request: {exc}")
            await self._try_send(error_reply(env, str(refusal), wire_error_data(refusal)))
            return
        ctx = RequestContext(
            env.method, stream_ids, self._source, self._open_responder_send, self._sink
        )
        task = self._spawn(self._handle(env, handler, ctx))
        if task is not None:
            self._handlers[task] = env
            task.add_done_callback(self._handlers.pop)

    async def _handle(self, env: Envelope, handler: Handler, ctx: RequestContext) -> None:
        """Run one handler and send its reply; every failure becomes an `error` reply."""
        try:
            frame, response = await answer(env, handler, ctx)
        except asyncio.CancelledError:
            self._start_send_streams(ctx, None)  # nobody will announce them now
            raise
        finally:
            self._release_request_streams(ctx)
        sent = await self._try_send(frame)
        self._start_send_streams(ctx, response if sent else None)

    def _release_request_streams(self, ctx: RequestContext) -> None:
        """The handler is over: nobody reads its request's streams any more."""
        now = self._clock()
        for stream_id in ctx.request_streams:
            stream = self._streams.responders.get(stream_id)
            if stream is not None and stream.keep_alive:
                stream.abandon(now)

    def _start_send_streams(self, ctx: RequestContext, response: dict[str, Any] | None) -> None:
        """The reply is out: run producers of announced streams, abort the others."""
        now = self._clock()
        announced = set(find_stream_ids(response)) if response is not None else set()
        for handle, producer in ctx.send_streams:
            stream = handle.stream
            assert isinstance(stream, ResponderStream)
            if handle.stream_id not in announced:
                stream.abort("the stream was not announced in a sent response", now)
                handle.signal.fire()
            elif producer is not None:
                self._spawn(self._produce(handle, producer))
        ctx.send_streams.clear()

    async def _produce(self, handle: StreamHandle, producer: Producer) -> None:
        sink = self._sink(handle)
        try:
            await producer(sink)
            await sink.close()
        except AgentError as exc:
            log.warning("producer_failed", stream_id=handle.stream_id, code=exc.code)
            await sink.abort()
        except Exception:
            log.exception("producer_failed", stream_id=handle.stream_id)
            await sink.abort()

    # --- sending -------------------------------------------------------------------------------

    async def _send(self, frame: bytes) -> None:
        self._check_open()
        async with self._send_lock:
            await self._transport.send(frame)

    async def _try_send(self, env_or_frame: Envelope | bytes) -> bool:
        """Send a reply; a closed session only loses it (the caller's side is gone too)."""
        frame = env_or_frame if isinstance(env_or_frame, bytes) else encode_envelope(env_or_frame)
        try:
            await self._send(frame)
        except SessionClosed:
            log.info("reply_not_sent", reason="session closed")
            return False
        return True

    def _check_open(self) -> None:
        if self._closed is not None:
            raise SessionClosed(self._closed.close_code, self._closed.reason)
