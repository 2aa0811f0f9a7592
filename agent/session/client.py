"""`CloudlySession`: the agent's one outbound websocket session to Cloudly.

One connection at a time, each driven by a fresh `Peer` over the same `Router`:

    connecting -> authenticating (getIdentityByToken, __typedsocket_setTag, getClusterConfig)
               -> connected (handlers served, identity renewed before it expires)
    any loss   -> backing-off (full-jitter delay) -> connecting ...
    close()    -> draining (no new requests, in-flight ones finish) -> socket closed 1001 -> stopped

The machine token is revealed only into the `getIdentityByToken` body and the JWT only into the
`getClusterConfig` body; both stay `Secret` everywhere else. The cluster document is read after
every (re)connect and on `pushClusterConfig`, and published as a `ClusterView` through
`AgentStatus`; a node whose Corestore endpoint is absent or invalid is logged with the
validator's reasons, never guessed.

Time goes through an injected `Clock` (renewal and backoff waits), randomness through an
injected source, so tests drive both without sleeping.
"""

from __future__ import annotations

import asyncio
import random
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
from pydantic import ValidationError

from agent.contracts.base import first_problem
from agent.contracts.cluster import (
    METHOD_GET_CLUSTER_CONFIG,
    METHOD_GET_IDENTITY_BY_TOKEN,
    METHOD_PUSH_CLUSTER_CONFIG,
    ClusterView,
    GetClusterConfigRequest,
    GetClusterConfigResponse,
    GetIdentityByTokenRequest,
    GetIdentityByTokenResponse,
    Identity,
    PushClusterConfigRequest,
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
from agent.secret import MASK, Secret
from agent.session.backoff import Backoff, BackoffPolicy, Clock, SystemClock, renew_delay
from agent.session.peer import ByteSink, Peer, PeerSettings, RequestContext, Router
from agent.session.transport import (
    GOING_AWAY,
    WebsocketTransport,
    connect_transport,
    tls_context,
    websocket_url,
)
from agent.status import AgentStatus, SessionState

__all__ = ["METHOD_SET_TAG", "CloudlySession", "SessionSettings"]

METHOD_SET_TAG = "__typedsocket_setTag"
NORMAL_CLOSURE = 1000
INTERNAL_ERROR = 1011

# What ends one connection and is retried with backoff: the network, Cloudly's answers, a
# malformed reply. Any other exception is a bug and ends `run()`.
_SESSION_LOSSES = (SessionError, RemoteProtocolError)

log = structlog.get_logger("agent.session")


@dataclass(frozen=True, slots=True)
class SessionSettings:
    """What the session needs from the configuration (built by the composition root).

    Liveness: a websocket ping every `ping_interval` s; a ping left unanswered for
    `ping_timeout` s declares the connection dead (closed 1011, then the session reconnects).
    """

    url: str
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
    backoff: BackoffPolicy = field(default_factory=BackoffPolicy)
    peer: PeerSettings = field(default_factory=PeerSettings)


class CloudlySession:
    """The agent's session with Cloudly: connect, authenticate, serve, renew, reconnect."""

    def __init__(
        self,
        settings: SessionSettings,
        token: Secret,
        status: AgentStatus,
        *,
        clock: Clock | None = None,
        rng: Callable[[], float] = random.random,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._settings = settings
        self._token = token
        self._status = status
        self._clock: Clock = clock or SystemClock()
        self._backoff = Backoff(settings.backoff, rng=rng)
        self._url = websocket_url(settings.url)
        self._ssl = ssl_context or tls_context(self._url, settings.ca_file)
        self.router = Router()
        self.router.register(METHOD_PUSH_CLUSTER_CONFIG, self._on_push_cluster_config)
        self._peer: Peer | None = None  # set only while authenticated and connected
        self._identity: Identity | None = None
        self._view: ClusterView | None = None
        self._connected_at: float | None = None
        self._stopping = asyncio.Event()
        self._stopped = asyncio.Event()
        self._draining = False
        self._running = False

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

    def open_send_stream(self) -> tuple[dict[str, Any], ByteSink]:
        """A stream we initiate on the current connection: (marker for the request, sink)."""
        return self._live_peer().open_send_stream()

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
            self._report(error)
            self._enter(SessionState.BACKING_OFF)
            delay = self._backoff.next_delay(self._session_lasted())
            log.info("cloudly_backing_off", delay_s=round(delay, 3), attempt=self._backoff.attempt)
            await self._sleep_unless_stopping(delay)

    def _session_lasted(self) -> float:
        # 0 for an attempt that never got connected: it must grow the backoff window.
        connected_at = self._connected_at
        return 0.0 if connected_at is None else self._clock.now() - connected_at

    def _report(self, error: AgentError) -> None:
        # Cloudly's error texts are foreign and may echo what we sent (the token, a JWT): the
        # status is no log line, so it gets the log's redaction here.
        text = scrub_text(self._scrub(str(error)))
        self._status.record_error(text)
        if isinstance(error, AuthenticationFailed):
            log.error(
                "cloudly_authentication_failed",
                error=text,
                hint="check the machine token file; retrying with backoff",
            )
        else:
            log.warning("cloudly_session_lost", error=text, error_type=type(error).__name__)

    async def _sleep_unless_stopping(self, delay: float) -> None:
        async with asyncio.TaskGroup() as group:
            sleeper = group.create_task(self._clock.sleep(delay))
            stopper = group.create_task(self._stopping.wait())
            await asyncio.wait({sleeper, stopper}, return_when=asyncio.FIRST_COMPLETED)
            sleeper.cancel()
            stopper.cancel()

    async def _one_session(self) -> None:
        settings = self._settings
        transport = await connect_transport(
            self._url,
            ssl_context=self._ssl,
            max_size=settings.max_frame_bytes,
            compression="deflate" if settings.compression else None,
            ping_interval=settings.ping_interval,
            ping_timeout=settings.ping_timeout,
            open_timeout=settings.open_timeout,
            close_timeout=settings.close_timeout,
        )
        close_code, reason = INTERNAL_ERROR, "internal error"  # unless a known loss below
        try:
            peer = Peer(transport, self.router, settings=settings.peer)
            async with asyncio.TaskGroup() as group:
                group.create_task(peer.run(), name="cloudly-peer")
                group.create_task(self._close_on_stop(transport), name="cloudly-stop")
                self._enter(SessionState.AUTHENTICATING)
                identity = await self._authenticate(peer)
                await self._tag(peer)
                await self._read_cluster(peer, identity)
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

    async def _close_on_stop(self, transport: WebsocketTransport) -> None:
        await self._stopping.wait()
        # The peer's reader then sees the close and ends the session's task group.
        await transport.close(GOING_AWAY, "going away")

    def _go_live(self, peer: Peer) -> None:
        self._peer = peer
        if self._draining:  # stop_intake() came while we were authenticating
            peer.stop_intake()
        self._connected_at = self._clock.now()
        self._status.bind_in_flight(lambda: peer.in_flight)
        self._enter(SessionState.CONNECTED)
        view = self._view
        log.info(
            "cloudly_connected",
            cluster_id=view.cluster_id if view is not None else None,
            reconnects=self._status.snapshot().reconnect_count,
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

    async def _authenticate(self, peer: Peer) -> Identity:
        body = GetIdentityByTokenRequest(token=self._token).revealed_wire()
        try:
            reply = await peer.call(
                METHOD_GET_IDENTITY_BY_TOKEN, body, timeout=self._settings.call_timeout
            )
        except CallFailed as exc:
            raise AuthenticationFailed(
                f"Cloudly refused the machine token: {self._scrub(exc.text)}"
            ) from exc
        try:
            identity = GetIdentityByTokenResponse.model_validate(reply).identity
        except ValidationError as exc:
            # from None: the validation error quotes its input, which holds the JWT.
            raise RemoteProtocolError(
                f"getIdentityByToken returned no usable identity (field {first_problem(exc)[0]})"
            ) from None
        # Refuse an identity that is expired on arrival (raises) before anything relies on it.
        renew_delay(identity.expires_at, self._clock.now(), self._settings.identity_renew_margin_s)
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
        if reply.get("success") is not True:
            raise SessionError(f"Cloudly did not accept the connection tag {name}")

    async def _read_cluster(self, peer: Peer, identity: Identity) -> None:
        body = GetClusterConfigRequest(identity=identity.credential()).revealed_wire()
        reply = await peer.call(
            METHOD_GET_CLUSTER_CONFIG, body, timeout=self._settings.call_timeout
        )
        try:
            document = GetClusterConfigResponse.model_validate(reply).config_data
        except ValidationError as exc:
            # from None: the validation error quotes the document, which may hold secrets.
            raise RemoteProtocolError(
                f"getClusterConfig returned an unusable cluster document (field "
                f"{first_problem(exc)[0]})"
            ) from None
        self._publish(read_cluster_view(document), source=METHOD_GET_CLUSTER_CONFIG)

    async def _keep_identity_fresh(self, peer: Peer, identity: Identity) -> None:
        margin = self._settings.identity_renew_margin_s
        while True:
            await self._clock.sleep(renew_delay(identity.expires_at, self._clock.now(), margin))
            identity = await self._authenticate(peer)
            log.info("cloudly_identity_renewed", expires_at_ms=identity.expires_at)

    # --- cluster knowledge ------------------------------------------------------------------

    def _publish(self, view: ClusterView, *, source: str) -> None:
        previous = self._view
        if previous is not None and previous.cluster_id != view.cluster_id:
            log.warning("cluster_id_changed", previous=previous.cluster_id, current=view.cluster_id)
        self._view = view
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
        self, request: Mapping[str, Any], ctx: RequestContext
    ) -> Mapping[str, Any]:
        del ctx
        try:
            document = PushClusterConfigRequest.model_validate(request).config_data
        except ValidationError as exc:
            log.warning("push_cluster_config_refused", field=first_problem(exc)[0])
            raise  # the peer answers invalid-request naming the field
        view = read_cluster_view(document)
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
        self._publish(view, source=METHOD_PUSH_CLUSTER_CONFIG)
        return {}


def _is_session_loss(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(_SESSION_LOSSES)[1] is None
    return isinstance(exc, _SESSION_LOSSES)


def _first_leaf(group: BaseExceptionGroup[AgentError]) -> AgentError:
    first = group.exceptions[0]
    if isinstance(first, BaseExceptionGroup):
        return _first_leaf(first)
    return first
