"""`StandInCloudly`: a Cloudly stand-in for tests, benchmarks and the demo.

A `websockets` server on 127.0.0.1 (port 0 by default) that drives every connection with the
same `Peer` the agent uses, in the server role. It serves what the agent calls:

- `getIdentityByToken {token}`: the configured machine token gets an identity with a fresh
  JWT-looking string and `expiresAt` (epoch ms, from the injected clock); anything else is
  refused with an error.
- `__typedsocket_setTag {name, payload}`: records the tag on the connection, answers
  `{success: true}` (or `false` when `accept_tags` is off).
- `getClusterConfig {identity: {jwt}}`: checks the JWT was issued here and has not expired,
  answers `{configData: <cluster document>, services}`.

With `credentials=CredentialAuthority(...)` (devstack/credentials.py) it also serves the
recipient enrollment and each node's sealed Corestore bearer (docs/credentials.md).

It lets a test act as Cloudly: `call_agent()` fires a request at the connected agent,
`open_send_stream()` opens a stream as the initiator (put the marker into a `call_agent`
request while writing the sink concurrently), `push_cluster_config()` pushes a new document,
`drop_connections()` / `restart()` / `stall_connections()` break the session. Everything
observable is recorded in `events` (connections with the extensions offered and the close code
they ended with, identities, tags, reads) and `wait_for()` waits on them without sleeping.
Secrets (token, JWTs) are never recorded. Pass `ssl_context` to serve wss:// (https:// URL).
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import secrets
import ssl
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

from websockets.asyncio.server import Server, ServerConnection, serve

from agent.clock import SYSTEM_CLOCK, Clock
from agent.contracts.base import PassThroughModel, WireModel
from agent.contracts.cluster import (
    METHOD_GET_CLUSTER_CONFIG,
    METHOD_GET_IDENTITY_BY_TOKEN,
    GetClusterConfigRequest,
    GetIdentityByTokenRequest,
)
from agent.errors import AuthenticationFailed, SessionClosed
from agent.protocol.connection import ConnectionSettings
from agent.protocol.routes import ByteSink, RequestContext, Route, Routes
from agent.session.client import METHOD_SET_TAG
from agent.session.peer import Peer
from agent.session.transport import WebsocketTransport, quiet_websocket_logger
from devstack.credentials import CredentialAuthority

__all__ = ["ABSENT", "AgentConnection", "CloudlyEvent", "StandInCloudly", "cluster_document"]

_DEFAULT_MAX_FRAME = 64 * 2**20

ABSENT: Any = object()
"""Marks a node without a `data.corestore` field in `cluster_document()`."""


def cluster_document(cluster_id: str, nodes: Mapping[str, Any]) -> dict[str, Any]:
    """An `ICluster` document: `nodes` maps node id -> its `data.corestore` value.

    A str becomes `{"endpoint": str}`, `ABSENT` leaves the field out, anything else is used as
    the raw `corestore` value (to build invalid documents).
    """
    node_documents: list[dict[str, Any]] = []
    for node_id, corestore in nodes.items():
        data: dict[str, Any] = {"name": node_id, "requiredDebianPackages": []}
        if isinstance(corestore, str):
            data["corestore"] = {"endpoint": corestore}
        elif corestore is not ABSENT:
            data["corestore"] = corestore
        node_documents.append({"id": node_id, "data": data})
    return {
        "id": cluster_id,
        "data": {
            "name": f"cluster {cluster_id}",
            "userId": "machine-user-1",
            "nodes": node_documents,
            "acmeInfo": {"serverAddress": "acme.invalid", "serverSecret": "not-a-real-secret"},
            "sshKeys": [],
        },
    }


@dataclass(frozen=True, slots=True)
class CloudlyEvent:
    """Something the stand-in saw. `connection` is the 1-based connection number."""

    kind: str
    connection: int
    detail: Mapping[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class AgentConnection:
    """One connected agent."""

    number: int
    peer: Peer | None
    transport: WebsocketTransport
    websocket: ServerConnection
    tags: dict[str, Any] = field(default_factory=dict)
    stream_frames_received: int = 0  # `##VirtualStream##` frames the agent sent us


class _CountingTransport(WebsocketTransport):
    """Counts the stream frames a connection receives (a loop shows up as a growing count)."""

    def __init__(self, websocket: ServerConnection, connection: AgentConnection) -> None:
        super().__init__(websocket)
        self._agent = connection

    async def recv(self) -> bytes:
        frame = await super().recv()
        if b'"##VirtualStream##"' in frame[:64]:
            self._agent.stream_frames_received += 1
        return frame


class Document(PassThroughModel):
    """Any JSON object, kept verbatim: the stand-in's answers (and what a test wants sent)."""


class SetTagRequest(WireModel):
    """`__typedsocket_setTag {name, payload}` (typedsocket 4.x)."""

    name: str
    payload: Any = None


AnswerEdit = Callable[[dict[str, Any]], dict[str, Any]]


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


class StandInCloudly:
    """A Cloudly that speaks TypedRequest over websockets, for one cluster."""

    def __init__(
        self,
        *,
        token: str,
        cluster: Mapping[str, Any],
        services: Sequence[Mapping[str, Any]] = (),
        identity_lifetime_s: float = 3600.0,
        clock: Clock = SYSTEM_CLOCK,
        peer_settings: ConnectionSettings | None = None,
        max_frame_bytes: int = _DEFAULT_MAX_FRAME,
        accept_tags: bool = True,
        ssl_context: ssl.SSLContext | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        credentials: CredentialAuthority | None = None,
    ) -> None:
        self._token = token
        self.credentials = credentials
        self.cluster: dict[str, Any] = dict(cluster)
        self.services: list[Mapping[str, Any]] = list(services)
        self.identity_lifetime_s = identity_lifetime_s
        self.accept_tags = accept_tags
        self._clock = clock
        self._peer_settings = peer_settings or ConnectionSettings()
        # method -> how to change the stand-in's answer before it is sent (a test makes Cloudly
        # answer in a shape it would not, e.g. without `services`)
        self.answer_edits: dict[str, AnswerEdit] = {}
        self._max_frame = max_frame_bytes
        self._ssl = ssl_context
        self._stalled: set[int] = set()  # connections that no longer read: stop() cuts them
        self._host = host
        self._port = port
        self._server: Server | None = None
        self._numbers = itertools.count(1)
        self._connections: dict[int, AgentConnection] = {}
        self._jwts: dict[str, int] = {}  # valid JWT -> expiresAt (ms)
        self._issued: list[str] = []
        self.events: list[CloudlyEvent] = []
        self._changed = asyncio.Event()

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Listen (on the same port again after a restart)."""
        self._server = await serve(
            self._serve,
            self._host,
            self._port,
            max_size=self._max_frame,
            compression=None,
            ssl=self._ssl,
            # The agent pings; SmartServe sends no pings of its own either.
            ping_interval=None,
            logger=quiet_websocket_logger("websockets.server"),
        )
        self._port = int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        """Stop listening and close every connection with 1001 (going away)."""
        server, self._server = self._server, None
        for number in self._stalled & set(self._connections):
            # A stalled connection would never read the close handshake's answer.
            self._connections[number].websocket.transport.abort()
        if server is not None:
            server.close()
            await server.wait_closed()

    async def restart(self) -> None:
        """Stop, then listen again on the same port (a Cloudly restart)."""
        await self.stop()
        await self.start()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    @property
    def port(self) -> int:
        """The port listened on (known after `start()`)."""
        return self._port

    @property
    def url(self) -> str:
        """The http(s):// URL an agent is configured with (it maps it to ws(s)://)."""
        scheme = "https" if self._ssl is not None else "http"
        return f"{scheme}://{self._host}:{self._port}"

    # --- what a test does as Cloudly ------------------------------------------------------

    def set_token(self, token: str) -> None:
        """Rotate the machine token: only `token` authenticates from now on."""
        self._token = token

    @property
    def issued_jwts(self) -> tuple[str, ...]:
        """Every JWT issued so far (for asserting that none leaked into a log)."""
        return tuple(self._issued)

    def expire_identities(self) -> None:
        """Forget every issued JWT (getClusterConfig with one of them is refused)."""
        self._jwts.clear()

    @property
    def connection(self) -> AgentConnection:
        """The most recent open connection; raises `SessionClosed` if none is open."""
        if not self._connections:
            raise SessionClosed(None, "no agent is connected to the stand-in Cloudly")
        return self._connections[max(self._connections)]

    @property
    def agent_peer(self) -> Peer:
        """The `Peer` of the most recent open connection."""
        peer = self.connection.peer
        assert peer is not None  # set before the connection is listed
        return peer

    async def call_agent(
        self,
        method: str,
        request: Mapping[str, Any],
        timeout: float = 30.0,  # noqa: ASYNC109  # a per-call deadline, passed on to the peer
    ) -> dict[str, Any]:
        """Fire `method` at the connected agent and return its response."""
        return await self.agent_peer.call(method, request, timeout=timeout)

    def open_send_stream(self) -> tuple[dict[str, Any], ByteSink]:
        """A stream Cloudly initiates towards the agent: (marker for a request, sink)."""
        marker, sink = self.agent_peer.open_send_stream()
        return marker.to_wire(), sink

    async def push_cluster_config(
        self,
        cluster: Mapping[str, Any] | None = None,
        timeout: float = 30.0,  # noqa: ASYNC109  # a per-call deadline
    ) -> dict[str, Any]:
        """Replace the cluster document (if given) and push it to the agent."""
        if cluster is not None:
            self.cluster = dict(cluster)
        reply = await self.call_agent(
            "pushClusterConfig",
            {"configData": self.cluster, "services": list(self.services)},
            timeout,
        )
        self._record("cluster-config-pushed", self.connection.number)
        return reply

    async def drop_connections(
        self, code: int = 1012, reason: str = "dropped", *, abort: bool = False
    ) -> None:
        """Close every open connection with `code` (or cut the TCP connection: `abort`)."""
        for connection in list(self._connections.values()):
            if abort:
                connection.websocket.transport.abort()
            else:
                await connection.transport.close(code, reason)

    def stall_connections(self) -> None:
        """Stop reading from every open connection: pings go unanswered, frames pile up."""
        for connection in self._connections.values():
            connection.websocket.transport.pause_reading()
            self._stalled.add(connection.number)

    # --- events ---------------------------------------------------------------------------

    def kinds(self) -> list[str]:
        """The kinds of all events so far, in order."""
        return [event.kind for event in self.events]

    def count(self, kind: str) -> int:
        """How many events of `kind` were recorded."""
        return sum(1 for event in self.events if event.kind == kind)

    async def wait_for(self, kind: str, count: int = 1) -> CloudlyEvent:
        """Wait until `count` events of `kind` happened; return the `count`-th."""
        while True:
            matching = [event for event in self.events if event.kind == kind]
            if len(matching) >= count:
                return matching[count - 1]
            changed = self._changed
            await changed.wait()

    def _record(self, kind: str, connection: int, **detail: Any) -> None:
        self.events.append(CloudlyEvent(kind, connection, detail))
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    # --- one connection -------------------------------------------------------------------

    async def _serve(self, websocket: ServerConnection) -> None:
        number = next(self._numbers)
        connection = AgentConnection(number, None, WebsocketTransport(websocket), websocket)
        transport = connection.transport = _CountingTransport(websocket, connection)
        peer = Peer(transport, self._routes(connection), settings=self._peer_settings)
        connection.peer = peer
        self._connections[number] = connection
        offered = (
            websocket.request.headers.get("Sec-WebSocket-Extensions") if websocket.request else None
        )
        self._record("connected", number, extensions_offered=offered)
        code: int | None = None
        reason = ""
        try:
            await peer.run()
        except SessionClosed as exc:
            code, reason = exc.close_code, exc.reason
        finally:
            del self._connections[number]
            if code is None:
                code, reason = websocket.close_code, websocket.close_reason or ""
            self._record("disconnected", number, code=code, reason=reason)

    def _routes(self, connection: AgentConnection) -> Routes:
        def answer(method: str, body: dict[str, Any]) -> Document:
            edit = self.answer_edits.get(method)
            return Document.model_validate(edit(body) if edit is not None else body)

        async def get_identity_by_token(
            request: GetIdentityByTokenRequest, ctx: RequestContext
        ) -> Document:
            if request.token.reveal() != self._token:
                self._record("identity-refused", connection.number)
                raise AuthenticationFailed("the machine token is not valid")
            expires_at = int((self._clock.time() + self.identity_lifetime_s) * 1000)
            jwt = self._issue_jwt(expires_at)
            self._record("identity-issued", connection.number, expires_at=expires_at)
            identity = {
                "name": "cluster-machine",
                "userId": "machine-user-1",
                "type": "machine",
                "role": "cluster",
                "expiresAt": expires_at,
                "jwt": jwt,
            }
            return answer(METHOD_GET_IDENTITY_BY_TOKEN, {"identity": identity})

        async def set_tag(request: SetTagRequest, ctx: RequestContext) -> Document:
            if not self.accept_tags:
                self._record("tag-refused", connection.number)
                return answer(METHOD_SET_TAG, {"success": False})
            connection.tags[request.name] = request.payload
            self._record("tag-set", connection.number, name=request.name, payload=request.payload)
            return answer(METHOD_SET_TAG, {"success": True})

        async def get_cluster_config(
            request: GetClusterConfigRequest, ctx: RequestContext
        ) -> Document:
            expires_at = self._jwts.get(request.identity.jwt.reveal())
            if expires_at is None or expires_at <= self._clock.time() * 1000:
                self._record("cluster-config-refused", connection.number)
                raise AuthenticationFailed("the identity is not valid or has expired")
            self._record("cluster-config-read", connection.number)
            body = {"configData": self.cluster, "services": list(self.services)}
            return answer(METHOD_GET_CLUSTER_CONFIG, body)

        routes = Routes(
            [
                Route(
                    METHOD_GET_IDENTITY_BY_TOKEN, GetIdentityByTokenRequest, get_identity_by_token
                ),
                Route(METHOD_SET_TAG, SetTagRequest, set_tag),
                Route(METHOD_GET_CLUSTER_CONFIG, GetClusterConfigRequest, get_cluster_config),
            ]
        )
        return routes + self._credential_routes(connection)

    def _credential_routes(self, connection: AgentConnection) -> Routes:
        """The credential methods (when an authority is configured), recording on this
        connection."""
        if self.credentials is None:
            return Routes()

        def record(kind: str, **detail: Any) -> None:
            self._record(kind, connection.number, **detail)

        return self.credentials.routes(record)

    def _issue_jwt(self, expires_at_ms: int) -> str:
        header = _b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
        claims = {"sub": "machine-user-1", "exp": expires_at_ms // 1000}
        payload = _b64url(json.dumps(claims).encode())
        jwt = f"{header}.{payload}.{_b64url(secrets.token_bytes(32))}"
        self._jwts[jwt] = expires_at_ms
        self._issued.append(jwt)
        return jwt
