"""`CloudlySession`: the agent's one outbound websocket session to Cloudly.

One connection at a time, each driven by a fresh `Peer` over the same `Routes` (the agent's
routes, given by the composition root, plus the session's own `pushClusterConfig`):

    connecting -> authenticating (the handshake: getIdentityByToken, __typedsocket_setTag,
                                  getClusterConfig; then the connect step: the enrollment)
               -> connected (handlers served, identity renewed before it expires)
    any loss   -> backing-off (full-jitter delay) -> connecting ...
    close()    -> draining (no new requests, in-flight ones finish) -> stopping (socket closed
                  1001) -> stopped

The session holds one state, a `lifecycle.Lifecycle`, moved only through `LIFECYCLE_TABLE` (an
illegal move raises `InvalidState` and changes nothing: `run()` twice, `run()` once stopped);
the status shows it (`lifecycle.PUBLISHED`). This module is the reconnect loop and one
connection's lifecycle. `authentication` drives the
sans-I/O `handshake` over the connection (and renews the identity; `probe()` runs it untagged);
`cluster` holds what the session knows of its cluster; `faults` decides each loss (a loss or a
bug, its cause, the wait), `outage` how loudly it is logged; `keepalive` pings (1011 when
unanswered), also as soon as an answer waits to be known delivered (each connection has its
`DeliveryTracker`, numbered from 1: the ping rule, `agent.protocol.delivery`). Until the
connect step (`connect_step=`, the connection as its caller) is done, the peer runs no handler:
a request Cloudly sends meanwhile is answered `not-ready` (retryable); serving starts with
`connected`, which `cloudly_connected` logs. A step that raises a session error
(`EnrollmentFailed` among them) ends the attempt like any other loss. Time goes through the
injected `Clock`, randomness through an injected source, so tests drive both without sleeping.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import ssl
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

import structlog

from agent.clock import SYSTEM_CLOCK, Clock
from agent.contracts.base import StreamMarker
from agent.contracts.cluster import METHOD_SET_TAG, ClusterView
from agent.errors import AgentError, SessionClosed
from agent.log import scrub_text
from agent.observe import NULL_OBSERVER, PeerObserver, SessionObserver
from agent.protocol.handlers import ByteSink, ByteSource, Caller, Routes
from agent.protocol.pool import WatchedPool
from agent.secret import Secret
from agent.session.authentication import Authentication
from agent.session.cluster import ClusterKnowledge
from agent.session.delivery import DeliveryTracker
from agent.session.faults import Loss, Reconnects, session_loss
from agent.session.keepalive import keep_alive
from agent.session.lifecycle import (
    INTAKE_STOPPED,
    LIFECYCLE_TABLE,
    PUBLISHED,
    Lifecycle,
    LifecycleEvent,
)
from agent.session.outage import Outage, log_failure
from agent.session.peer import Peer
from agent.session.settings import SessionSettings, websocket_url
from agent.session.transport import CloseCode, WebsocketTransport, connect_transport, tls_context
from agent.watch.status import AgentStatus

# METHOD_SET_TAG and SessionSettings are importable from here too (the stand-in, the app).
__all__ = ["METHOD_SET_TAG", "CloudlySession", "ConnectStep", "SessionObservers", "SessionSettings"]

log = structlog.get_logger("agent.session")

# Run on every connect, after the cluster document is read: (the connection's caller, the view).
ConnectStep = Callable[[Caller, ClusterView], Awaitable[object]]


class SessionObservers(SessionObserver, PeerObserver, Protocol):
    """What the session reports, and what each connection's peer reports."""


class CloudlySession:
    """The agent's session with Cloudly: connect, authenticate, serve, renew, reconnect."""

    def __init__(
        self,
        settings: SessionSettings,
        token: Secret,
        status: AgentStatus,
        *,
        routes: Routes | None = None,
        connect_step: ConnectStep | None = None,
        view_watcher: Callable[[ClusterView], None] | None = None,
        clock: Clock = SYSTEM_CLOCK,
        rng: Callable[[], float] = random.random,
        ssl_context: ssl.SSLContext | None = None,
        observer: SessionObservers = NULL_OBSERVER,
        pool: WatchedPool | None = None,
    ) -> None:
        self._settings = settings
        self._pool = pool
        self._observer = observer
        self._outage = Outage()
        self._ever_connected = False
        self._status = status
        self._clock = clock
        self._reconnects = Reconnects(settings.backoff, stable_after=settings.stable_after, rng=rng)
        self._url = websocket_url(settings.url)
        self._ssl = ssl_context or tls_context(self._url, settings.ca_file)
        self._cluster = ClusterKnowledge(status, view_watcher)
        self._auth = Authentication(
            token, settings, cluster=self._cluster, status=status, clock=clock
        )
        self.routes = Routes([self._cluster.route]) + (routes or Routes())
        self._connect_step = connect_step
        self._peer: Peer | None = None  # set only while authenticated and connected
        self._connections = itertools.count(1)  # each connection's number (the ping rule's)
        self._connected_at: float | None = None
        self._state = Lifecycle.IDLE  # moved only by _move(), through LIFECYCLE_TABLE
        self._moved = asyncio.Event()  # set (and replaced) on every move: _until() waits on it

    # --- what the rest of the agent uses ----------------------------------------------------

    @property
    def cluster_view(self) -> ClusterView | None:
        """The cluster view read last (kept across reconnects), None before the first read."""
        return self._cluster.view

    def connection(self) -> Peer:
        """The current connection, to call and stream on together: a call and the stream its
        request or answer names must travel on one connection (a stream id means nothing on
        another), so whoever needs both takes the connection once. Once it is gone its calls
        and streams raise `SessionClosed` (never move to the next connection); raises
        `SessionClosed` at once when not connected."""
        return self._live_peer()

    async def call(
        self,
        method: str,
        request: Mapping[str, Any],
        *,
        timeout: float | None,  # noqa: ASYNC109  # a per-call deadline, passed on to the peer
    ) -> dict[str, Any]:
        """Call `method` on Cloudly; raises `CallFailed`, `CallTimeout`, `SessionClosed`."""
        return await self._live_peer().call(method, request, timeout=timeout)

    def open_send_stream(self) -> tuple[StreamMarker, ByteSink]:
        """A stream we initiate on the current connection: (marker for the request, sink)."""
        return self._live_peer().open_send_stream()

    def receive_stream(self, marker: StreamMarker) -> ByteSource:
        """Read the stream whose marker came in the response to one of our calls (on the
        current connection; stop early with `aclose()`)."""
        return self._live_peer().receive_stream(marker)

    async def probe(self) -> ClusterView:
        """Connect once, authenticate and read the cluster document, then close (1000): the
        check `restore-agent check-config --connect` makes. Serves nothing and sets no tag.

        Raises what a session attempt would: `SessionError` (TLS, DNS, refused, a call failed
        or timed out), `AuthenticationFailed`, `RemoteProtocolError` (classify it with
        `agent.session.faults.classify`).
        """
        transport = await self._connect()
        peer = Peer(transport, Routes(), settings=self._settings.connection, clock=self._clock)
        # Owned here: cancelled and awaited below, whatever happens.
        reader = asyncio.create_task(peer.run(), name="cloudly-probe-peer")
        try:
            view = await self._auth.probe(peer)
        finally:
            await transport.close(CloseCode.NORMAL_CLOSURE, "probe done")
            reader.cancel()
            await asyncio.wait({reader})
            if not reader.cancelled():
                reader.exception()  # SessionClosed: the end of every peer run
        return view

    def stop_intake(self) -> None:
        """Answer new requests with `shutting-down` and stop reconnecting (state `draining`)."""
        self._move(LifecycleEvent.STOP_INTAKE)
        if self._peer is not None:
            self._peer.stop_intake()

    async def drain(self, timeout: float) -> None:  # noqa: ASYNC109  # the peer's drain deadline
        """Wait up to `timeout` s for in-flight handlers, then cancel the rest."""
        peer = self._peer
        if peer is not None:
            log.info("cloudly_draining", in_flight=peer.in_flight, timeout_s=timeout)
            await peer.drain(timeout)

    async def close(self, drain_timeout: float) -> None:
        """Stop intake, drain in-flight handlers up to `drain_timeout` s, close with 1001.

        Returns once `run()` has ended (at once if it is not running). Bound it from outside:
        closing the socket waits for the peer's close frame up to the close timeout.
        """
        self.stop_intake()
        await self.drain(drain_timeout)
        # While run() runs this is `stopping` and run()'s end `stopped`; else `stopped` at once.
        self._move(LifecycleEvent.CLOSE)
        await self._until(Lifecycle.STOPPED)

    async def run(self) -> None:
        """Keep a session up until `close()` or cancellation; `InvalidState` while it runs or
        once it stopped."""
        self._move(LifecycleEvent.RUN)
        try:
            await self._run_until_stopped()
        finally:
            self._move(LifecycleEvent.END)
            log.info("cloudly_session_stopped")

    # --- the lifecycle ----------------------------------------------------------------------

    def _move(self, event: LifecycleEvent) -> None:
        """Move the lifecycle (`InvalidState`, nothing changed, if the table has no such move)
        and show it in the status."""
        to = LIFECYCLE_TABLE.next(self._state, event, subject="the Cloudly session")
        published = PUBLISHED[to]
        if self._status.state is not published:
            self._status.move_to(published)  # before the state: a refusal leaves both as they were
        self._state = to
        self._moved.set()
        self._moved = asyncio.Event()

    async def _until(self, *states: Lifecycle) -> None:
        while self._state not in states:
            await self._moved.wait()

    def _should_stop(self) -> bool:
        return self._state in INTAKE_STOPPED

    # --- the reconnect loop -----------------------------------------------------------------

    async def _run_until_stopped(self) -> None:
        while not self._should_stop():  # run() moved to `connecting` (or `draining`)
            self._connected_at = None
            try:
                await self._one_session()
                error: AgentError = SessionClosed(None, "session ended")
            except BaseException as exc:
                lost = session_loss(exc)
                if lost is None:
                    raise  # a bug, not a session problem: let the daemon crash loudly
                error = lost
            if self._should_stop():
                return
            loss = self._report(error)
            self._move(LifecycleEvent.LOSE)
            log.debug("cloudly_backing_off", delay_s=round(loss.delay, 3), attempt=loss.attempt)
            await self._sleep_unless_stopping(loss.delay)
            if not self._should_stop():
                self._move(LifecycleEvent.CONNECT)

    def _session_lasted(self) -> float:
        # 0 for an attempt that never got connected: it must grow the backoff window.
        connected_at = self._connected_at
        return 0.0 if connected_at is None else self._clock.monotonic() - connected_at

    def _report(self, error: AgentError) -> Loss:
        """Decide one failure (`agent.session.faults`), record it, log it by what it is worth."""
        # Cloudly's error texts are foreign and may echo what we sent (the token, a JWT): the
        # status is no log line, so it gets the log's redaction here.
        text = scrub_text(self._auth.mask(str(error)))
        self._status.record_error(text)
        loss = self._reconnects.lost(error, reason=text, session_lasted=self._session_lasted())
        self._observer.session_lost(cause=loss.fault.cause, permanent=loss.fault.permanent)
        log_failure(self._outage.failed(loss.fault, self._clock.monotonic()), loss.attempt)
        return loss

    async def _sleep_unless_stopping(self, delay: float) -> None:
        async with asyncio.TaskGroup() as group:
            sleeper = group.create_task(self._clock.sleep(delay))
            stopper = group.create_task(self._until(Lifecycle.STOPPING, Lifecycle.STOPPED))
            await asyncio.wait({sleeper, stopper}, return_when=asyncio.FIRST_COMPLETED)
            sleeper.cancel()
            stopper.cancel()

    # --- one connection ---------------------------------------------------------------------

    async def _connect(self) -> WebsocketTransport:
        settings = self._settings
        return await connect_transport(
            self._url,
            ssl_context=self._ssl,
            max_size=settings.max_frame_bytes,
            compression="deflate" if settings.compression else None,
            # The session's own keepalive pings (it records every pong); a probe pings not at all.
            ping_interval=None,
            ping_timeout=None,
            open_timeout=settings.open_timeout,
            close_timeout=settings.close_timeout,
        )

    async def _one_session(self) -> None:
        settings = self._settings
        transport = await self._connect()
        close_code, reason = CloseCode.INTERNAL_ERROR, "internal error"  # unless a loss below
        deliveries = DeliveryTracker(next(self._connections), transport)
        try:
            peer = Peer(
                transport,
                self.routes,
                settings=settings.connection,
                clock=self._clock,
                observer=self._observer,
                stall_timeout=settings.stream_stall_timeout,
                serving=False,  # until the connect step is done: `_go_live`
                pool=self._pool,
                first_frame_bytes=settings.max_frame_bytes,
                deliveries=deliveries,
            )
            async with asyncio.TaskGroup() as group:
                group.create_task(peer.run(), name="cloudly-peer")
                group.create_task(self._close_on_stop(transport), name="cloudly-stop")
                pings = keep_alive(
                    transport,
                    clock=self._clock,
                    interval=settings.ping_interval,
                    pong_timeout=settings.ping_timeout,
                    on_pong=self._status.record_pong,
                    deliveries=deliveries,
                )
                group.create_task(pings, name="cloudly-keepalive")
                self._move(LifecycleEvent.AUTHENTICATE)
                identity, view = await self._auth.connect(peer)
                if self._connect_step is not None:
                    await self._connect_step(peer, view)
                self._go_live(peer)
                await self._auth.keep_fresh(peer, identity)
        except asyncio.CancelledError:
            close_code, reason = CloseCode.GOING_AWAY, "going away"
            raise
        except BaseException as exc:
            if session_loss(exc) is not None:
                close_code, reason = CloseCode.NORMAL_CLOSURE, "reconnecting"
            raise
        finally:
            self._go_dead()
            deliveries.lost()  # what no pong confirmed on this connection never will be
            if self._state is Lifecycle.STOPPING:
                close_code, reason = CloseCode.GOING_AWAY, "going away"
            await transport.close(close_code, reason)

    async def _close_on_stop(self, transport: WebsocketTransport) -> None:
        await self._until(Lifecycle.STOPPING, Lifecycle.STOPPED)
        # The peer's reader then sees the close and ends the session's task group.
        await transport.close(CloseCode.GOING_AWAY, "going away")

    def _go_live(self, peer: Peer) -> None:
        self._peer = peer
        if self._should_stop():  # stop_intake() came while we were authenticating
            peer.stop_intake()
        peer.start_serving()  # `cloudly_connected` below says so
        self._connected_at = self._clock.monotonic()
        self._status.bind_in_flight(lambda: peer.in_flight)
        self._move(LifecycleEvent.GO_LIVE)
        self._observer.session_connected(reconnect=self._ever_connected)
        self._ever_connected = True
        view = self._cluster.view
        down_s = self._outage.recovered(self._clock.monotonic())
        log.info(
            "cloudly_connected",
            cluster_id=view.cluster_id if view is not None else None,
            reconnects=self._status.snapshot().reconnect_count,
            **({} if down_s is None else {"unreachable_for_s": round(down_s, 1)}),
        )

    def _go_dead(self) -> None:
        self._peer = None
        self._status.bind_in_flight(None)

    def _live_peer(self) -> Peer:
        if self._peer is None:
            raise SessionClosed(None, "not connected to Cloudly")
        return self._peer
