"""`CloudlySession`: the agent's one outbound websocket session to Cloudly.

One connection at a time, each driven by a fresh `Peer` over the same `Routes` (the agent's
routes, given by the composition root, plus the session's own `pushClusterConfig`):

    connecting -> authenticating (getIdentityByToken, __typedsocket_setTag, getClusterConfig,
                                  then the connect steps: the recipient enrollment)
               -> connected (handlers served, identity renewed before it expires)
    any loss   -> backing-off (full-jitter delay) -> connecting ...
    close()    -> draining (no new requests, in-flight ones finish) -> socket closed 1001 -> stopped

The machine token is revealed only into the `getIdentityByToken` body and the JWT only into the
`getClusterConfig` body; both stay `Secret` everywhere else. The cluster document is read after
every (re)connect and on `pushClusterConfig`, and published as a `ClusterView` through
`AgentStatus`; a node whose Corestore endpoint is absent or invalid is logged with the
validator's reasons, never guessed.

Cloudly's answers are read for exactly what the agent uses (`TokenAnswer`, `TagAnswer`,
`ClusterConfigAnswer`); a deviation from the seed's exact shape in anything else is logged once
at warning (`cloudly_answer_deviates`, the field path, never the value) and tolerated. An answer
the agent cannot use at all ends the connection with an error-level line saying why
(`cloudly_answer_unusable`), recorded as the status's last error, and the session reconnects
with backoff (Cloudly may be fixed meanwhile).

Connect steps (`connect_steps=`) run after the cluster document is read and before the session
serves anything, with the connection being set up as their `Caller`: the composition root
passes the recipient enrollment (`agent.credentials.enrollment`). Until they are done the
connection's peer runs no handler: a request Cloudly sends meanwhile is answered `not-ready`
(retryable) at once; serving starts with `connected`, which `cloudly_connected` logs. A step
that raises a session error (`EnrollmentFailed` among them) ends the attempt like any other
loss. Cluster-view
watchers (`view_watchers=`) are called with every view the session publishes.

Liveness is the session's own keepalive (a websocket ping every `ping_interval` s, each pong
recorded in the status, so readiness can say when Cloudly was last heard; no pong within
`ping_timeout` s ends the connection). Every failure is classified (`agent.session.faults`):
a permanent one (TLS verification, DNS name not found, token refused, upgrade refused, an
unusable answer) is logged at error with a hint and waits from the backoff's cap; a transient
one is a warning. Within one outage an identical cause is not repeated above debug: an
error-level summary "Cloudly unreachable for N s: reason" comes at doubling intervals instead,
and the connect that ends the outage says how long it lasted. Each connect and loss goes to
the injected observer (`agent.observe`), and each connection's peer reports to it too.

Time goes through the injected `Clock` (keepalive, renewal and backoff waits), randomness
through an injected source, so tests drive both without sleeping.
"""

from __future__ import annotations

import asyncio
import random
import ssl
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import structlog
from pydantic import ValidationError

from agent.clock import SYSTEM_CLOCK, Clock
from agent.config import websocket_url
from agent.contracts.base import StreamMarker, WireModel, first_problem
from agent.contracts.cluster import (
    METHOD_GET_CLUSTER_CONFIG,
    METHOD_GET_IDENTITY_BY_TOKEN,
    METHOD_PUSH_CLUSTER_CONFIG,
    ClusterConfigAnswer,
    ClusterConfigPush,
    ClusterView,
    GetClusterConfigRequest,
    GetClusterConfigResponse,
    GetIdentityByTokenRequest,
    GetIdentityByTokenResponse,
    PushClusterConfigRequest,
    PushClusterConfigResponse,
    TagAnswer,
    TokenAnswer,
    UsedIdentity,
    contract_deviation,
    read_cluster_view,
)
from agent.errors import (
    AgentError,
    AuthenticationFailed,
    CallFailed,
    InvalidState,
    MisroutedCluster,
    RemoteProtocolError,
    SessionClosed,
    SessionError,
)
from agent.log import scrub_text
from agent.observe import NULL_OBSERVER, PeerObserver, SessionObserver
from agent.protocol.connection import ConnectionSettings
from agent.protocol.handlers import ByteSink, ByteSource, RequestContext, Route, Routes
from agent.retry import Backoff
from agent.secret import MASK, Secret
from agent.session.faults import HINTS, Fault, Outage, Report, ReportKind, classify
from agent.session.peer import Peer
from agent.session.reconnect import Reconnects, renew_delay
from agent.session.transport import GOING_AWAY, WebsocketTransport, connect_transport, tls_context
from agent.status import AgentStatus, SessionState

__all__ = ["METHOD_SET_TAG", "CloudlySession", "ConnectStep", "SessionObservers", "SessionSettings"]

_Model = TypeVar("_Model", bound=WireModel)

METHOD_SET_TAG = "__typedsocket_setTag"
NORMAL_CLOSURE = 1000
INTERNAL_ERROR = 1011

# What ends one connection and is retried with backoff: the network, Cloudly's answers, a
# malformed reply. Any other exception is a bug and ends `run()`.
_SESSION_LOSSES = (SessionError, RemoteProtocolError)

log = structlog.get_logger("agent.session")

# Run on every connect, after the cluster document is read: (the connection's caller, the view).
ConnectStep = Callable[[Peer, ClusterView], Awaitable[object]]


class SessionObservers(SessionObserver, PeerObserver, Protocol):
    """What the session reports, and what each connection's peer reports."""


@dataclass(frozen=True, slots=True)
class SessionSettings:
    """What the session needs from the configuration (built by the composition root).

    Liveness: a websocket ping every `ping_interval` s (the session's own keepalive, each
    pong recorded in the status); a ping left unanswered for `ping_timeout` s declares the
    connection dead and the session reconnects. `stream_stall_timeout` bounds each wait on a
    stream (`Peer`'s `stall_timeout`).
    """

    url: str  # ws(s), or http(s) mapped by the one mapping, `agent.config.websocket_url`
    tag_name: str
    tag_payload: Any
    max_frame_bytes: int
    ca_file: Path | None = None
    compression: bool = False
    ping_interval: float = 10.0
    ping_timeout: float = 30.0
    open_timeout: float = 10.0
    close_timeout: float = 5.0
    call_timeout: float = 30.0
    identity_renew_margin_s: float = 300.0
    backoff: Backoff = field(default_factory=Backoff)
    stable_after: float = 60.0
    connection: ConnectionSettings = field(default_factory=ConnectionSettings)
    stream_stall_timeout: float | None = None


class CloudlySession:
    """The agent's session with Cloudly: connect, authenticate, serve, renew, reconnect."""

    def __init__(
        self,
        settings: SessionSettings,
        token: Secret,
        status: AgentStatus,
        *,
        routes: Routes | None = None,
        connect_steps: Sequence[ConnectStep] = (),
        view_watchers: Sequence[Callable[[ClusterView], None]] = (),
        clock: Clock = SYSTEM_CLOCK,
        rng: Callable[[], float] = random.random,
        ssl_context: ssl.SSLContext | None = None,
        observer: SessionObservers = NULL_OBSERVER,
    ) -> None:
        self._settings = settings
        self._observer = observer
        self._outage = Outage()
        self._ever_connected = False
        self._token = token
        self._status = status
        self._clock = clock
        self._reconnects = Reconnects(settings.backoff, stable_after=settings.stable_after, rng=rng)
        self._url = websocket_url(settings.url)
        self._ssl = ssl_context or tls_context(self._url, settings.ca_file)
        own = Route(METHOD_PUSH_CLUSTER_CONFIG, ClusterConfigPush, self._on_push_cluster_config)
        self.routes = Routes([own]) + (routes or Routes())
        self._peer: Peer | None = None  # set only while authenticated and connected
        self._identity: UsedIdentity | None = None
        self._deviations: set[tuple[str, str]] = set()  # (method, field path) logged once
        self._view: ClusterView | None = None
        self._connected_at: float | None = None
        self._stopping = asyncio.Event()
        self._stopped = asyncio.Event()
        self._draining = False
        self._running = False
        self._connect_steps = tuple(connect_steps)
        self._view_watchers = tuple(view_watchers)

    # --- what the rest of the agent uses ----------------------------------------------------

    @property
    def cluster_view(self) -> ClusterView | None:
        """The cluster view read last (kept across reconnects), None before the first read."""
        return self._view

    @property
    def jwt(self) -> Secret | None:
        """The current identity's JWT, None while not authenticated."""
        return self._identity.jwt if self._identity is not None else None

    @property
    def connected(self) -> bool:
        """Whether calls can be made now."""
        return self._peer is not None

    async def call(
        self,
        method: str,
        request: Mapping[str, Any],
        timeout: float,  # noqa: ASYNC109  # a per-call deadline, passed on to the peer
    ) -> dict[str, Any]:
        """Call `method` on Cloudly; raises `CallFailed`, `CallTimeout`, `SessionClosed`."""
        return await self._live_peer().call(method, request, timeout=timeout)

    def open_send_stream(self) -> tuple[StreamMarker, ByteSink]:
        """A stream we initiate on the current connection: (marker for the request, sink)."""
        return self._live_peer().open_send_stream()

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
            identity = await self._authenticate(peer)
            await self._read_cluster(peer, identity)
        finally:
            await transport.close(NORMAL_CLOSURE, "probe done")
            reader.cancel()
            await asyncio.wait({reader})
            if not reader.cancelled():
                reader.exception()  # SessionClosed: the end of every peer run
        assert self._view is not None  # _read_cluster published it
        return self._view

    def receive_stream(self, marker: StreamMarker) -> ByteSource:
        """Read the stream whose marker came in the response to one of our calls (on the
        current connection; stop early with `aclose()`)."""
        return self._live_peer().receive_stream(marker)

    def stop(self) -> None:
        """Close the socket (1001) and end `run()`, without draining."""
        self._stopping.set()

    def stop_intake(self) -> None:
        """Answer new requests with `shutting-down` and stop reconnecting (state `draining`)."""
        if self._status.state not in (SessionState.DRAINING, SessionState.STOPPED):
            self._status.move_to(SessionState.DRAINING)
        self._draining = True
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
        self._stopping.set()
        if self._running:
            await self._stopped.wait()
        elif self._status.state is not SessionState.STOPPED:
            self._status.move_to(SessionState.STOPPED)

    async def run(self) -> None:
        """Keep a session up until `stop()`/`close()` or cancellation."""
        if self._running:
            raise InvalidState("CloudlySession.run() is already running")
        self._running = True
        self._stopped.clear()
        try:
            await self._run_until_stopped()
        finally:
            self._running = False
            if self._status.state is not SessionState.STOPPED:
                self._status.move_to(SessionState.STOPPED)
            log.info("cloudly_session_stopped")
            self._stopped.set()

    # --- the reconnect loop -----------------------------------------------------------------

    def _should_stop(self) -> bool:
        return self._stopping.is_set() or self._draining

    def _enter(self, state: SessionState) -> None:
        # Once close() began the state stays `draining` until `stopped`: that is the truth.
        if not self._draining:
            self._status.move_to(state)

    async def _run_until_stopped(self) -> None:
        while not self._should_stop():
            self._enter(SessionState.CONNECTING)
            self._connected_at = None
            try:
                await self._one_session()
                error: AgentError = SessionClosed(None, "session ended")
            except BaseExceptionGroup as group:
                losses, others = group.split(_SESSION_LOSSES)
                if others is not None:
                    raise  # a bug, not a session problem: let the daemon crash loudly
                assert losses is not None
                error = _first_leaf(losses)
            except _SESSION_LOSSES as exc:
                error = exc
            if self._should_stop():
                return
            fault = self._report(error)
            self._enter(SessionState.BACKING_OFF)
            delay = self._reconnects.next_delay(self._session_lasted(), permanent=fault.permanent)
            log.debug(
                "cloudly_backing_off", delay_s=round(delay, 3), attempt=self._reconnects.attempt
            )
            await self._sleep_unless_stopping(delay)

    def _session_lasted(self) -> float:
        # 0 for an attempt that never got connected: it must grow the backoff window.
        connected_at = self._connected_at
        return 0.0 if connected_at is None else self._clock.monotonic() - connected_at

    def _report(self, error: AgentError) -> Fault:
        """Record and log one failure by what it is worth (`agent.session.faults.Outage`)."""
        # Cloudly's error texts are foreign and may echo what we sent (the token, a JWT): the
        # status is no log line, so it gets the log's redaction here.
        text = scrub_text(self._scrub(str(error)))
        self._status.record_error(text)
        fault = classify(error, text)
        self._observer.session_lost(cause=fault.cause, permanent=fault.permanent)
        report = self._outage.failed(fault, self._clock.monotonic())
        _log_failure(report, self._reconnects.attempt + 1)
        return fault

    async def _sleep_unless_stopping(self, delay: float) -> None:
        async with asyncio.TaskGroup() as group:
            sleeper = group.create_task(self._clock.sleep(delay))
            stopper = group.create_task(self._stopping.wait())
            await asyncio.wait({sleeper, stopper}, return_when=asyncio.FIRST_COMPLETED)
            sleeper.cancel()
            stopper.cancel()

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
        close_code, reason = INTERNAL_ERROR, "internal error"  # unless a known loss below
        try:
            peer = Peer(
                transport,
                self.routes,
                settings=settings.connection,
                clock=self._clock,
                observer=self._observer,
                stall_timeout=settings.stream_stall_timeout,
                serving=False,  # until the connect steps are done: `_go_live`
            )
            async with asyncio.TaskGroup() as group:
                group.create_task(peer.run(), name="cloudly-peer")
                group.create_task(self._close_on_stop(transport), name="cloudly-stop")
                group.create_task(self._keep_alive(transport), name="cloudly-keepalive")
                self._enter(SessionState.AUTHENTICATING)
                identity = await self._authenticate(peer)
                await self._tag(peer)
                await self._read_cluster(peer, identity)
                await self._run_connect_steps(peer)
                self._go_live(peer)
                await self._keep_identity_fresh(peer, identity)
        except asyncio.CancelledError:
            close_code, reason = GOING_AWAY, "going away"
            raise
        except BaseException as exc:
            if _is_session_loss(exc):
                close_code, reason = NORMAL_CLOSURE, "reconnecting"
            raise
        finally:
            self._go_dead()
            if self._stopping.is_set():
                close_code, reason = GOING_AWAY, "going away"
            await transport.close(close_code, reason)

    async def _keep_alive(self, transport: WebsocketTransport) -> None:
        """Ping every `ping_interval` s; record each pong; a pong later than `ping_timeout` s
        ends the connection (raises `SessionClosed` 1011, the session reconnects)."""
        interval, timeout = self._settings.ping_interval, self._settings.ping_timeout
        while True:
            await self._clock.sleep(interval)
            async with asyncio.TaskGroup() as group:
                pong = group.create_task(transport.ping())
                expiry = group.create_task(self._clock.sleep(timeout))
                await asyncio.wait({pong, expiry}, return_when=asyncio.FIRST_COMPLETED)
                expiry.cancel()
                pong.cancel()  # no-op once answered
            if pong.cancelled():
                raise SessionClosed(
                    INTERNAL_ERROR, f"Cloudly answered no keepalive ping within {timeout:g} s"
                )
            self._status.record_pong(pong.result())

    async def _close_on_stop(self, transport: WebsocketTransport) -> None:
        await self._stopping.wait()
        # The peer's reader then sees the close and ends the session's task group.
        await transport.close(GOING_AWAY, "going away")

    def _go_live(self, peer: Peer) -> None:
        self._peer = peer
        if self._draining:  # stop_intake() came while we were authenticating
            peer.stop_intake()
        peer.start_serving()  # `cloudly_connected` below says so
        self._connected_at = self._clock.monotonic()
        self._status.bind_in_flight(lambda: peer.in_flight)
        self._enter(SessionState.CONNECTED)
        self._observer.session_connected(reconnect=self._ever_connected)
        self._ever_connected = True
        view = self._view
        down_s = self._outage.recovered(self._clock.monotonic())
        log.info(
            "cloudly_connected",
            cluster_id=view.cluster_id if view is not None else None,
            reconnects=self._status.snapshot().reconnect_count,
            **({} if down_s is None else {"unreachable_for_s": round(down_s, 1)}),
        )

    def _go_dead(self) -> None:
        self._peer = None
        self._identity = None
        self._status.bind_in_flight(None)

    def _live_peer(self) -> Peer:
        if self._peer is None:
            raise SessionClosed(None, "not connected to Cloudly")
        return self._peer

    # --- the authentication sequence --------------------------------------------------------

    async def _authenticate(self, peer: Peer) -> UsedIdentity:
        body = GetIdentityByTokenRequest(token=self._token).revealed_wire()
        try:
            reply = await peer.call(
                METHOD_GET_IDENTITY_BY_TOKEN, body, timeout=self._settings.call_timeout
            )
        except CallFailed as exc:
            raise AuthenticationFailed(
                f"Cloudly refused the machine token: {self._scrub(exc.text)}"
            ) from exc
        identity = self._read(
            METHOD_GET_IDENTITY_BY_TOKEN, reply, TokenAnswer, GetIdentityByTokenResponse
        ).identity
        # Refuse an identity that is expired on arrival (raises) before anything relies on it.
        margin = self._settings.identity_renew_margin_s
        renew_delay(identity.expires_at, self._clock.time(), margin)
        self._identity = identity
        self._status.set_identity_expiry(identity.expires_at)
        return identity

    def _scrub(self, text: str) -> str:
        token = self._token.reveal()
        return text.replace(token, MASK) if token else text

    async def _tag(self, peer: Peer) -> None:
        name = self._settings.tag_name
        body = {"name": name, "payload": self._settings.tag_payload}
        reply = await peer.call(METHOD_SET_TAG, body, timeout=self._settings.call_timeout)
        if not self._read(METHOD_SET_TAG, reply, TagAnswer, TagAnswer).success:
            raise SessionError(f"Cloudly did not accept the connection tag {name}")

    async def _read_cluster(self, peer: Peer, identity: UsedIdentity) -> None:
        body = GetClusterConfigRequest(identity=identity.credential()).revealed_wire()
        reply = await peer.call(
            METHOD_GET_CLUSTER_CONFIG, body, timeout=self._settings.call_timeout
        )
        answer = self._read(
            METHOD_GET_CLUSTER_CONFIG, reply, ClusterConfigAnswer, GetClusterConfigResponse
        )
        self._publish(read_cluster_view(answer.config_data), source=METHOD_GET_CLUSTER_CONFIG)

    async def _run_connect_steps(self, peer: Peer) -> None:
        view = self._view
        assert view is not None  # _read_cluster published one
        for step in self._connect_steps:
            await step(peer, view)

    async def _keep_identity_fresh(self, peer: Peer, identity: UsedIdentity) -> None:
        margin = self._settings.identity_renew_margin_s
        while True:
            await self._clock.sleep(renew_delay(identity.expires_at, self._clock.time(), margin))
            identity = await self._authenticate(peer)
            log.info("cloudly_identity_renewed", expires_at_ms=identity.expires_at)

    def _read(
        self,
        method: str,
        data: dict[str, Any],
        used: type[_Model],
        contract: type[WireModel],
    ) -> _Model:
        """What the agent uses of `data`; a deviation in anything else is logged once."""
        try:
            model = used.from_wire(data)
        except ValidationError as exc:
            # from None: the validation error quotes the answer, which may hold secrets.
            path, reason = first_problem(exc, root="answer")
            raise RemoteProtocolError(
                f"the {method} answer is unusable: {path}: {reason}", field=path
            ) from None
        self._note_deviation(method, contract_deviation(contract, data))
        return model

    def _note_deviation(self, method: str, deviation: tuple[str, str] | None) -> None:
        """Log a tolerated deviation from the contract once per method and field path."""
        if deviation is None or (method, deviation[0]) in self._deviations:
            return
        self._deviations.add((method, deviation[0]))
        log.warning(
            "cloudly_answer_deviates",
            method=method,
            field=deviation[0],
            reason=deviation[1],
            consequence="tolerated: the agent does not use this field",
        )

    # --- cluster knowledge ------------------------------------------------------------------

    def _publish(self, view: ClusterView, *, source: str) -> None:
        previous = self._view
        if previous is not None and previous.cluster_id != view.cluster_id:
            log.warning("cluster_id_changed", previous=previous.cluster_id, current=view.cluster_id)
        self._view = view
        for watcher in self._view_watchers:
            watcher(view)
        summary = self._status.publish_cluster(view)
        log.info(
            "cluster_view_published",
            source=source,
            cluster_id=view.cluster_id,
            nodes=len(summary.nodes),
            nodes_with_corestore=list(summary.nodes_with_corestore),
        )
        for node in summary.nodes:
            if not node.has_corestore:
                log.warning(
                    "cluster_node_without_corestore",
                    cluster_id=view.cluster_id,
                    node_id=node.node_id,
                    problems=list(node.corestore_problems),
                )

    async def _on_push_cluster_config(
        self, request: ClusterConfigPush, ctx: RequestContext
    ) -> PushClusterConfigResponse:
        del ctx
        deviation = contract_deviation(PushClusterConfigRequest, request.to_wire())
        view = read_cluster_view(request.config_data)
        current = self._view
        if current is not None and current.cluster_id != view.cluster_id:
            log.warning(
                "push_cluster_config_refused",
                reason="misrouted-cluster",
                pushed=view.cluster_id,
                session=current.cluster_id,
            )
            raise MisroutedCluster(
                f"pushed cluster {view.cluster_id} is not the session's cluster "
                f"{current.cluster_id}"
            )
        self._note_deviation(METHOD_PUSH_CLUSTER_CONFIG, deviation)
        self._publish(view, source=METHOD_PUSH_CLUSTER_CONFIG)
        return PushClusterConfigResponse()


def _log_failure(report: Report, attempt: int) -> None:
    fault = report.fault
    if report.kind is ReportKind.REPEAT:
        log.debug("cloudly_attempt_failed", cause=fault.cause, error=fault.reason, attempt=attempt)
        return
    if report.kind is ReportKind.SUMMARY:
        log.error(
            "cloudly_unreachable_summary",
            summary=report.summary,
            cause=fault.cause,
            permanent=fault.permanent,
            down_s=round(report.down_s),
            attempts=report.attempts,
            hint=HINTS.get(fault.cause, "retrying with backoff"),
        )
        return
    if fault.cause == "token-refused":
        event = "cloudly_authentication_failed"
    elif fault.cause == "answer-unusable":
        event = "cloudly_answer_unusable"
    elif fault.cause == "enrollment-failed":
        event = "cloudly_enrollment_failed"
    elif fault.permanent:
        event = "cloudly_unreachable"
    else:
        log.warning("cloudly_session_lost", error=fault.reason, cause=fault.cause)
        return
    log.error(
        event,
        error=fault.reason,
        cause=fault.cause,
        permanent=True,
        hint=f"{HINTS[fault.cause]}; retrying with backoff from its cap",
    )


def _is_session_loss(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(_SESSION_LOSSES)[1] is None
    return isinstance(exc, _SESSION_LOSSES)


def _first_leaf(group: BaseExceptionGroup[AgentError]) -> AgentError:
    first = group.exceptions[0]
    if isinstance(first, BaseExceptionGroup):
        return _first_leaf(first)
    return first
