"""`Peer`: the asyncio driver of one protocol `Connection` over one `FrameTransport`.

The protocol decides (`agent.protocol.connection`); this only moves frames and runs work:

- `run()` reads frames into the connection until the transport closes (raising
  `SessionClosed`). It owns one TaskGroup holding the timer task (it sleeps until the
  connection's next deadline, then calls `advance`), every handler and every producer; when it
  ends, pending calls fail with `SessionClosed`, streams break and those tasks are cancelled.
- `flush()` hands the connection's events out, in the order they happened (handlers started,
  calls resolved, stream waiters woken on `StreamChanged`/`StreamEnded`/`StreamBroke`, received
  chunks decoded) and sends its frames, in order, under one lock: the one way anything here
  or in `agent.session.streams` sends. `flush(closed_ok=True)` where a transport already gone
  is no error of the caller's (the run loop ends the session, and what the frames belonged to
  breaks with it).
- A large received chunk is acknowledged before it is decoded (the connection queues it raw):
  a task decodes it in a worker thread (the native decoder and pybase64 let go of the GIL, so
  the event loop keeps answering, and chunks of different streams decode in parallel) and
  settles it with the connection, which holds the stream's next frame until then: decoding
  overlaps the round trip to the peer, and a chunk that does not decode breaks its stream one
  frame later at most. A chunk a quick decoder takes at once (the native wide kernel on a
  canonical array, pybase64 on valid base64: ~0.4 ms per MiB here) is decoded in the task
  itself: the hand-over to a thread and back cost more CPU than that.
- A request runs its typed `Route`: parse the body (`invalid-request` on failure), await the
  handler, serialise the response model; an `AgentError` becomes `error {text, data}`, anything
  else `internal` (traceback logged, never the request body).
- `call()` returns the response object or raises `CallFailed`, `CallTimeout` (the connection
  enforces `timeout`, resends included) or `SessionClosed`.
- Shutdown: `stop_intake()`, then `drain(timeout)`: handlers get until the deadline, the rest
  are cancelled and answered `shutting-down`.
- Serving can wait (`serving=False` until `start_serving()`): the session authenticates and
  enrolls on a connection before it serves Cloudly; a request that arrives before is answered
  at once `not-ready` (retryable), its handler never runs and its streams are released.
- `stall_timeout` bounds every wait of a stream's source or sink (`agent.session.streams`): a
  stream its peer keeps alive without moving a chunk breaks after it instead of pinning the
  work that reads or writes it.
- Deliveries (`deliveries=`, the connection's `DeliveryTracker`): each request arrives at the
  connection's `Mark` (its number on the session); the flush that writes a
  handler's answer hands its delivery callbacks (`RequestContext.on_delivered`) to the tracker
  and writes its frames and a ping right behind them in one write to the socket; the pong (or
  any later keepalive pong) delivers it (`agent.protocol.delivery`, the ping rule).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, NoReturn, Protocol

import structlog

from agent.clock import SYSTEM_CLOCK, Clock
from agent.contracts.base import StreamMarker
from agent.errors import AgentError, NotReady, RemoteProtocolError, SessionClosed, ShuttingDown
from agent.observe import NULL_OBSERVER, Direction, PeerObserver
from agent.protocol.connection import (
    CallErrored,
    ChunkToDecode,
    Completed,
    Connection,
    ConnectionSettings,
    ConnectionState,
    Event,
    RequestReceived,
    StreamBroke,
    StreamChanged,
    StreamEnded,
)
from agent.protocol.delivery import Mark
from agent.protocol.handlers import AnswerNow, ByteSink, ByteSource, Producer, Route, Routes
from agent.protocol.ids import new_uni_id
from agent.protocol.pool import WatchedPool
from agent.session.admission import AdmissionReport
from agent.session.delivery import DeliveryTracker, OnDelivered
from agent.session.streams import HandlerContext, Signal, Sink, Source, marker_of

__all__ = ["FrameTransport", "Peer"]

log = structlog.get_logger("agent.session.peer")


class FrameTransport(Protocol):
    """One connection carrying one UTF-8 JSON text frame per message."""

    async def send(self, frame: bytes) -> None:
        """Send one frame; raises `SessionClosed` once the connection is gone."""
        ...

    async def recv(self) -> bytes:
        """The next frame; raises `SessionClosed` when the connection is closed."""
        ...


class Peer:
    """One TypedRequest peer: serves `routes`, makes calls, streams bytes both ways."""

    def __init__(
        self,
        transport: FrameTransport,
        routes: Routes,
        *,
        settings: ConnectionSettings | None = None,
        clock: Clock = SYSTEM_CLOCK,
        new_id: Callable[[], str] = new_uni_id,
        observer: PeerObserver = NULL_OBSERVER,
        stall_timeout: float | None = None,
        serving: bool = True,
        pool: WatchedPool | None = None,
        first_frame_bytes: int = 16 * 1024 * 1024,
        deliveries: DeliveryTracker | None = None,
    ) -> None:
        self.connection = Connection(
            routes.methods,
            settings,
            new_id=new_id,
            pool=pool,
            first_frame_bytes=first_frame_bytes,
            admissions=routes.admissions,
        )
        self._admission = AdmissionReport(observer)
        self._pool = pool
        self._deliveries = deliveries
        self._arrival = Mark(0 if deliveries is None else deliveries.connection)
        self._answered: list[OnDelivered] = []  # callbacks of answers queued, not yet written
        self._stall_timeout = stall_timeout
        self._serving = serving
        self._observer = observer
        self._transport = transport
        self._routes = routes
        self._clock = clock
        self._send_lock = asyncio.Lock()
        self._waiters: dict[str, asyncio.Future[Completed | CallErrored]] = {}
        self._signals: dict[str, Signal] = {}
        self._handlers: dict[asyncio.Task[None], int] = {}
        self._children: set[asyncio.Task[None]] = set()
        self._timer = Signal(clock)
        self._timer_target: float | None = None
        self._room_due = False  # bytes came back while answers were held: release them
        self._group: asyncio.TaskGroup | None = None

    # --- lifecycle -------------------------------------------------------------------------------

    async def run(self) -> NoReturn:
        """Read frames until the transport closes; always ends by raising `SessionClosed`."""
        if self._group is not None:
            raise RuntimeError("Peer.run() is already running")
        closed = SessionClosed(None, "peer stopped")
        # Bytes given back to the budget may let a held invitation go: ask the connection.
        unlisten = None if self._pool is None else self._pool.on_room(self._room)
        async with asyncio.TaskGroup() as group:
            self._group = group
            self._spawn(self._run_timers())
            try:
                while True:
                    frame = await self._transport.recv()
                    self.connection.receive_frame(frame, self.now())
                    await self.flush()
            except SessionClosed as exc:
                closed = exc
            finally:
                if unlisten is not None:
                    unlisten()
                self.connection.connection_lost(closed, self.now())
                self._dispatch(self.connection.events_received())
                for task in self._children:
                    task.cancel()
        raise closed

    def _room(self) -> None:
        """Bytes came back to the budget: ask the connection again if answers wait for it."""
        if self.connection.invitations_held:
            self._room_due = True
            self._timer.fire()

    def start_serving(self) -> None:
        """Run the routes' handlers from now on (a peer made with `serving=False`)."""
        self._serving = True

    def stop_intake(self) -> None:
        """Answer every new request with `shutting-down`."""
        self.connection.stop_intake()

    async def drain(self, timeout: float) -> None:  # noqa: ASYNC109  # the drain deadline
        """Give in-flight handlers `timeout` seconds (on the peer's clock), then cancel and
        answer the rest."""
        handlers = dict(self._handlers)
        if not handlers:
            return
        with contextlib.suppress(TimeoutError):
            async with self._clock.timeout(timeout):
                await asyncio.wait(handlers)
        pending = {task for task in handlers if not task.done()}
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
        for task in pending:
            refusal = ShuttingDown("the agent stopped before finishing this request")
            self.connection.refuse(handlers[task], refusal, self.now())
        await self.flush(closed_ok=True)

    @property
    def in_flight(self) -> int:
        """Requests being handled right now."""
        return self.connection.in_flight

    # --- calls and streams we drive --------------------------------------------------------------

    async def call(
        self,
        method: str,
        request: Mapping[str, Any],
        *,
        timeout: float | None,  # noqa: ASYNC109  # a protocol deadline, enforced by the connection
    ) -> dict[str, Any]:
        """Call `method`; raises `CallFailed`, `CallTimeout` or `SessionClosed` (`timeout`
        None: no deadline of its own, the caller bounds it)."""
        call_id = self.connection.call(method, request, now=self.now(), timeout=timeout)
        waiter: asyncio.Future[Completed | CallErrored] = asyncio.get_running_loop().create_future()
        self._waiters[call_id] = waiter
        try:
            await self.flush()
            outcome = await waiter
        finally:
            del self._waiters[call_id]
            self.connection.cancel_call(call_id)
        if isinstance(outcome, CallErrored):
            raise outcome.error
        return outcome.response

    def open_send_stream(self) -> tuple[StreamMarker, ByteSink]:
        """A stream to send on: put the marker into a `call()` request, then write the sink."""
        stream_id = self.connection.open_send_stream()
        return marker_of(stream_id), Sink(self, stream_id, acknowledged=True)

    def receive_stream(self, marker: StreamMarker) -> ByteSource:
        """Read the stream whose marker came in a call's response (stop early: `aclose()`)."""
        self.connection.receive_response_stream(marker.stream_id, self.now())
        source = Source(self, marker.stream_id)
        self._spawn(self.flush(closed_ok=True))  # the first `read` is queued
        return source

    # --- what streams and sinks use (agent.session.streams.StreamOwner) ---------------------------

    def now(self) -> float:
        """The connection's time."""
        return self._clock.monotonic()

    @property
    def stall_timeout(self) -> float | None:
        """How long a source may wait for a chunk, a sink for room (None: unbounded)."""
        return self._stall_timeout

    def watch(self, stream_id: str) -> Signal:
        """The signal fired whenever stream `stream_id` changes."""
        signal = self._signals.get(stream_id)
        if signal is None:
            signal = self._signals[stream_id] = Signal(self._clock)
        return signal

    def unwatch(self, stream_id: str) -> None:
        """Nobody waits on stream `stream_id` any more."""
        self._signals.pop(stream_id, None)

    def count_stream_bytes(self, direction: Direction, count: int) -> None:
        """Report stream payload bytes taken (`in`) or queued (`out`) to the observer."""
        self._observer.stream_bytes(direction=direction, count=count)

    async def flush(self, *, closed_ok: bool = False) -> None:
        """Hand out the connection's events, then send its frames in order; answers whose
        delivery a handler waits to know go out with a ping behind them, in the same write to
        the socket (the ping rule). Raises `SessionClosed` once the transport is gone, unless
        `closed_ok`: then that is logged and the frames dropped (the run loop ends the session
        and breaks what they belonged to)."""
        if not closed_ok:
            await self._send()
            return
        try:
            await self._send()
        except SessionClosed:
            log.info("frames_not_sent", reason="session closed")

    async def _send(self) -> None:
        self._dispatch(self.connection.events_received())
        async with self._send_lock:  # frames are taken under the lock, so none overtakes another
            while True:
                # Taken together: the callbacks belong to answers among these frames.
                frames, answered = self.connection.data_to_send(), self._answered
                self._answered = []
                if not frames and not answered:
                    break
                deliveries = self._deliveries
                if answered and deliveries is not None and deliveries.confirms:
                    # The frames and the ping confirming their answers go out in one write.
                    confirming = await deliveries.confirm(frames, answered)
                    self._spawn(deliveries.settle(*confirming))
                    continue
                for frame in frames:
                    await self._transport.send(frame)
                if answered and deliveries is not None:
                    deliveries.answered(answered)  # written: the keepalive's pongs confirm
        deadline = self.connection.next_deadline()
        if deadline is not None and (self._timer_target is None or deadline < self._timer_target):
            self._timer.fire()

    # --- internals -------------------------------------------------------------------------------

    def _dispatch(self, events: list[Event]) -> None:
        for event in events:
            if isinstance(event, StreamChanged | StreamEnded | StreamBroke):
                if (signal := self._signals.get(event.stream_id)) is not None:
                    signal.fire()
            elif isinstance(event, ChunkToDecode):
                self._spawn(self._decode(event))
            elif isinstance(event, RequestReceived) and not self._serving:
                self._refuse_not_ready(event)
            elif isinstance(event, RequestReceived):
                route = self._routes.get(event.method)
                assert route is not None  # the connection refuses unrouted methods
                parsed = None  # parsed once: what answer_now leaves goes to the handler as is
                if route.answer_now is not None:
                    parsed = self._answer_now(route, route.answer_now, event)
                    # Not answered from memory: its handler needs a seat (or it is deferred).
                    if parsed is None or not self.connection.seat(event.request_id, self.now()):
                        continue
                task = self._spawn(self._serve(route, event, self._arrival, parsed))
                if task is not None:
                    self._handlers[task] = event.request_id
                    task.add_done_callback(self._handlers.pop)
            elif (waiter := self._waiters.get(event.call_id)) is not None and not waiter.done():
                waiter.set_result(event)
        self._admission.report(self.connection.seats)

    def _refuse_not_ready(self, event: RequestReceived) -> None:
        """Answer a request that came before serving started; the caller sends it again."""
        log.info("request_refused", method=event.method, code=NotReady.code)
        refusal = NotReady(
            "the agent is still setting up its session with Cloudly (authentication, cluster "
            "document, recipient enrollment) and serves requests once it is connected"
        )
        self.connection.refuse(event.request_id, refusal, self.now())
        self._observer.request_handled(method=event.method, code=NotReady.code, seconds=0.0)

    async def _run_timers(self) -> None:
        """Let time pass when a deadline comes; let held answers go when bytes came back.
        A wake-up that is neither (a flush found an earlier deadline) only sets the new target:
        under a whole cluster the budget's room and the re-arming woke this task hundreds of
        times a second, and each `advance` walks every call and stream."""
        while True:
            self._timer_target = self.connection.next_deadline()
            timed_out = False
            if not self._room_due:
                timed_out = not await self._timer.wait(self._timer_target)
            now = self.now()
            if timed_out or (self._timer_target is not None and now >= self._timer_target):
                self._room_due = False
                self.connection.advance(now)  # the held answers that fit go too
            elif self._room_due:
                self._room_due = False
                self.connection.release_held(now)
            else:
                continue  # re-armed for an earlier deadline: nothing is due yet
            await self.flush(closed_ok=True)

    async def _serve(
        self, route: Route[Any, Any], event: RequestReceived, arrival: Mark, parsed: Any = None
    ) -> None:
        """Run one route and end its request: response, or `error {text, data}`; once it is on
        the wire, the handler's delivery callbacks wait for the ping rule's verdict. `parsed`:
        the request's model when `answer_now` already parsed it."""
        request_id, method = event.request_id, event.method
        context = HandlerContext(
            self, event.method, event.request_id, arrival=arrival, deliveries=self._deliveries
        )
        began, code = self._clock.monotonic(), "internal"  # unless answered below
        try:
            request = route.parse(event.request) if parsed is None else parsed
            response = (await route.handler(request, context)).to_wire()
            started = self.connection.respond(request_id, response, self.now())
            self._track(context)
            code = "ok"
        except AgentError as exc:
            code = self._refuse(event, exc)
            self._track(context)
        except Exception as exc:  # noqa: BLE001  # logged with its traceback by _refuse
            code = self._refuse(event, exc)
        except asyncio.CancelledError:
            code = "cancelled"  # the drain deadline passed, or the connection went away
            raise
        else:
            for stream_id in started:
                producer = context.producers.get(stream_id)
                if producer is not None:
                    self._spawn(self._produce(stream_id, producer))
        finally:
            seconds = self._clock.monotonic() - began
            self._observer.request_handled(method=method, code=code, seconds=seconds)
            # The request's streams ended with it: a source its handler left open (it failed
            # mid-stream) must not keep its wake-up for the life of the connection.
            for stream_id in event.stream_ids:
                self.unwatch(stream_id)
        await self.flush(closed_ok=True)

    def _answer_now(
        self, route: Route[Any, Any], answer_now: AnswerNow[Any, Any], event: RequestReceived
    ) -> Any:
        """Answer `event` in this turn when `answer_now` (its route's) can, or refuse it (None);
        else its parsed request, for the route's handler."""
        method, began = event.method, self._clock.monotonic()
        try:
            request = route.parse(event.request)
            response = answer_now(request)
            if response is None:
                return request
            self.connection.respond(event.request_id, response.to_wire(), self.now())
            code = "ok"
        except Exception as exc:  # noqa: BLE001  # logged with its traceback by _refuse
            code = self._refuse(event, exc)
        seconds = self._clock.monotonic() - began
        self._observer.request_handled(method=method, code=code, seconds=seconds)
        return None

    def _refuse(self, event: RequestReceived, exc: Exception) -> str:
        """End `event` with `exc`'s refusal (an AgentError's own; anything else is a bug,
        logged with its traceback and answered `internal` without its details); its code."""
        if isinstance(exc, AgentError):
            log.info("request_refused", method=event.method, code=exc.code)
            refusal = exc
        else:
            log.exception("handler_failed", method=event.method)
            refusal = AgentError(f"the agent failed to handle {event.method}")
        self.connection.refuse(event.request_id, refusal, self.now())
        return refusal.code

    def _track(self, context: HandlerContext) -> None:
        """The handler's answer is in the outbox now: its delivery callbacks go with it (the
        flush that writes it hands them to the tracker and pings right behind it)."""
        if context.delivery_callbacks and self.connection.state is ConnectionState.OPEN:
            self._answered.extend(context.delivery_callbacks)

    async def _decode(self, event: ChunkToDecode) -> None:
        """Decode one received chunk and settle it with the connection: on the spot when a
        quick decoder takes it (less CPU than the hand-over to a thread and back), else in a
        worker thread."""
        outcome: bytes | RemoteProtocolError | None = event.token.decode_quick()
        try:
            if outcome is None:
                outcome = await asyncio.to_thread(event.token.decode)
        except RemoteProtocolError as exc:
            # Without its traceback: kept in this frame, it would make a cycle through the
            # decoder's frames that holds the refused frame's bytes until the cycle collector
            # runs (a 15 MiB frame refused stayed resident that long).
            outcome = exc.with_traceback(None)
        self.connection.settle_chunk(event.stream_id, event.token, outcome, self.now())
        await self.flush(closed_ok=True)

    async def _produce(self, stream_id: str, producer: Producer) -> None:
        sink = Sink(self, stream_id, acknowledged=False)
        try:
            try:
                await producer(sink)
                await sink.close()
            except SessionClosed:
                raise
            except AgentError as exc:
                log.warning("producer_failed", stream_id=stream_id, code=exc.code)
                await sink.abort()
            except Exception:
                log.exception("producer_failed", stream_id=stream_id)
                await sink.abort()
        except SessionClosed:
            log.info("producer_stopped", stream_id=stream_id, reason="session closed")

    def _spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None] | None:
        if self._group is None or self.connection.state is ConnectionState.CLOSED:
            work.close()
            return None
        task = self._group.create_task(work)
        self._children.add(task)
        task.add_done_callback(self._children.discard)
        return task
