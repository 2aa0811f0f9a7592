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
- `backupServiceDatabaseClosure {backupId, serviceId, nodeId, descriptor, closure}`: drains the
  stream into a file (under `closures_dir`, a temporary directory by default), checks its length
  and sha256 against the descriptor, keeps it under (backupId, serviceId) and only then answers
  `{accepted: true}`: a stream that breaks or does not match is refused and nothing is kept.
- `restoreServiceDatabaseClosure {backupId, serviceId, nodeId}`: answers the kept descriptor and
  a stream it serves (it answers `read`); `tamper_next_closure()` makes the next one shorter,
  longer or altered.
- `stall_next_closure(after)`: the next closure transfer, either way, stops moving bytes after
  `after` of them while its stream stays alive (keep-alives go on): the stand-in stops reading
  a closure it is sent, or stops writing one it serves, until the connection ends.

With `credentials=CredentialAuthority(...)` (devstack/credentials.py) it also serves the
recipient enrollment and each node's sealed Corestore bearer (docs/credentials.md).

It lets a test act as Cloudly: `call_agent()` fires a request at the connected agent
(`call_agent_served()` sends it again while the agent still answers `not-ready`),
`open_send_stream()` opens a stream as the initiator (put the marker into a `call_agent`
request while writing the sink concurrently), `push_cluster_config()` pushes a new document,
`drop_connections()` / `restart()` / `stall_connections()` break the session,
`lose_next_answer(method)` cuts it the moment Cloudly's socket reads the agent's next answer to
`method` (a Cloudly that dies holding an answer it never saw; the agent's confirming ping is
never answered). Everything
observable is recorded in `events` (connections with the extensions offered and the close code
they ended with, identities, tags, reads) and `wait_for()` waits on them without sleeping;
`wait_for_agent()` waits for an agent's session (a `check-config --connect` probe is none).
Secrets (token, JWTs) are never recorded. Pass `ssl_context` to serve wss:// (https:// URL).

A stream the stand-in drives (a stage, a closure it serves) keeps one data cycle in flight, as
typedrequest 3.3.0 does, unless `peer_settings.streams.cycles` says otherwise: the agent invites
one frame per answer within its byte budget (`[memory] budget_bytes`), and a frame past that
which finds no room breaks the stream (docs/benchmarks.md, "What Cloudly can do").
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import itertools
import json
import os
import secrets
import ssl
import tempfile
from collections.abc import AsyncIterable, AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.frames import Frame, Opcode

from agent.clock import SYSTEM_CLOCK, Clock
from agent.contracts.base import PassThroughModel
from agent.contracts.cluster import (
    METHOD_GET_CLUSTER_CONFIG,
    METHOD_GET_IDENTITY_BY_TOKEN,
    GetClusterConfigRequest,
    GetIdentityByTokenRequest,
    SetTagRequest,
)
from agent.contracts.relay import (
    METHOD_BACKUP_SERVICE_DATABASE_CLOSURE,
    METHOD_RESTORE_SERVICE_DATABASE_CLOSURE,
    BackupServiceDatabaseClosureRequest,
    DatabaseClosureDescriptor,
    RestoreServiceDatabaseClosureRequest,
)
from agent.errors import (
    AuthenticationFailed,
    CallFailed,
    IntegrityError,
    NotReady,
    Refusal,
    SessionClosed,
    StreamBroken,
)
from agent.protocol.connection import ConnectionSettings
from agent.protocol.handlers import ByteSink, RequestContext, Route, Routes
from agent.session.client import METHOD_SET_TAG
from agent.session.peer import Peer
from agent.session.transport import WebsocketTransport, quiet_websocket_logger
from devstack.credentials import CredentialAuthority

__all__ = [
    "ABSENT",
    "AgentConnection",
    "CloudlyEvent",
    "StandInCloudly",
    "StoredClosure",
    "Tamper",
    "cluster_document",
]

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
    # Called with every frame the agent sends, before the peer reads it (a benchmark's replay
    # initiator watches its stream answers here; the peer drops answers it did not ask for).
    taps: list[Callable[[bytes], None]] = field(default_factory=list)


class _StandInConnection(ServerConnection):
    """The stand-in's server connection; `arm(lose)` names an incoming frame Cloudly's process
    dies on: the socket is cut the moment the websocket reads it, before anything it read with
    it is answered (the pong of the agent's confirming ping among them) or handed on."""

    def arm(self, lose: Callable[[bytes], bool]) -> None:
        protocol = self.protocol
        events_received = protocol.events_received

        def checked() -> list[Any]:
            # Called by `data_received` before it writes the automatic answers (pongs).
            events = events_received()
            for event in events:
                if (
                    isinstance(event, Frame)
                    and event.opcode is Opcode.TEXT
                    and lose(bytes(event.data))
                ):
                    self.transport.abort()  # what is written next is dropped: a dead process
                    protocol.events_received = lambda: []  # type: ignore[method-assign]
                    return []
            return events

        protocol.events_received = checked  # type: ignore[method-assign]


class _CountingTransport(WebsocketTransport):
    """Counts the stream frames a connection receives (a loop shows up as a growing count)."""

    def __init__(self, websocket: ServerConnection, connection: AgentConnection) -> None:
        super().__init__(websocket)
        self._agent = connection

    async def recv(self) -> bytes:
        frame = await super().recv()
        if b'"##VirtualStream##"' in frame[:64]:
            self._agent.stream_frames_received += 1
        for tap in self._agent.taps:
            tap(frame)
        return frame


class Document(PassThroughModel):
    """Any JSON object, kept verbatim: the stand-in's answers (and what a test wants sent)."""


AnswerEdit = Callable[[dict[str, Any]], dict[str, Any]]
Tamper = Literal["truncate", "extend", "corrupt"]
_SERVE_PIECE = 1024 * 1024


@dataclass(frozen=True, slots=True)
class StoredClosure:
    """A database closure the stand-in holds: what it was sent, where the bytes are."""

    backup_id: str
    service_id: str
    node_id: str
    descriptor: dict[str, Any]
    path: Path
    size: int
    sha256: str


class ClosureNotFound(Refusal):
    """The stand-in holds no closure for (backupId, serviceId)."""

    code = "closure-not-found"


async def _drain_matching(
    source: AsyncIterable[bytes],
    part: Path,
    descriptor: DatabaseClosureDescriptor,
    progress: Callable[[str, int, int], None] | None,
) -> None:
    """Write the stream to `part`; `IntegrityError` unless it is exactly the descriptor's bytes."""
    digest, size = hashlib.sha256(), 0
    with part.open("wb") as handle:
        async for piece in source:
            handle.write(piece)
            digest.update(piece)
            size += len(piece)
            if size > descriptor.size:
                raise IntegrityError("the closure stream is longer than its descriptor")
            if progress is not None:
                progress("received", size, descriptor.size)
    if (size, digest.hexdigest()) != (descriptor.size, descriptor.sha256):
        raise IntegrityError("the closure stream does not match its descriptor")


async def _stalling(
    source: AsyncIterable[bytes], after: int, number: int, record: Callable[..., None]
) -> AsyncIterator[bytes]:
    """`source` until `after` bytes passed; then it is read no more (its window fills) and this
    waits until the connection ends."""
    passed = 0
    async for piece in source:
        yield piece
        passed += len(piece)
        if passed >= after:
            record("closure-stalled", number, bytes=passed)
            await asyncio.Event().wait()


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
        closures_dir: Path | None = None,
    ) -> None:
        self._token = token
        self.credentials = credentials
        self.cluster: dict[str, Any] = dict(cluster)
        self.services: list[Mapping[str, Any]] = list(services)
        self.identity_lifetime_s = identity_lifetime_s
        self.accept_tags = accept_tags
        self._clock = clock
        settings = peer_settings or ConnectionSettings()
        if settings.streams.cycles is None:  # Cloudly initiates like typedrequest 3.3.0
            settings = replace(settings, streams=replace(settings.streams, cycles=1))
        self._peer_settings = settings
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
        self._own_dir: tempfile.TemporaryDirectory[str] | None = None
        self._closures_dir = closures_dir
        self.closures: dict[tuple[str, str], StoredClosure] = {}
        self._tampers: list[Tamper] = []
        self._stalls: list[int] = []
        self._lost_answers: list[str] = []  # methods whose next answer Cloudly dies on
        # Told (direction, bytes so far, bytes in all) as closure bytes arrive ("received") or
        # go out ("served"): the demo's progress lines.
        self.closure_progress: Callable[[str, int, int], None] | None = None

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
            create_connection=_StandInConnection,
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

    def cleanup(self) -> None:
        """Remove the temporary directory of closures (if the stand-in made one)."""
        if self._own_dir is not None:
            self._own_dir.cleanup()
            self._own_dir = None

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

    async def call_agent_served(
        self,
        method: str,
        request: Mapping[str, Any],
        timeout: float = 30.0,  # noqa: ASYNC109  # a deadline for all attempts together
        *,
        retry_delay: float = 0.02,
    ) -> dict[str, Any]:
        """`call_agent`, sent again after `retry_delay` (the stand-in's clock) while the agent
        answers `not-ready`: it serves only once its session is set up (an agent that just
        connected may still be enrolling), and that refusal is retryable."""
        deadline = self._clock.monotonic() + timeout
        while True:
            try:
                left = max(deadline - self._clock.monotonic(), 0.001)
                return await self.call_agent(method, request, left)
            except CallFailed as exc:
                if exc.error_data.get("code") != NotReady.code:
                    raise
                if self._clock.monotonic() + retry_delay >= deadline:
                    raise
            await self._clock.sleep(retry_delay)

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

    def lose_next_answer(self, method: str) -> None:
        """The agent's next answer to `method` is lost: Cloudly's socket reads it and Cloudly
        dies right there (the connection is cut before anything after it is read, the agent's
        confirming ping included). The call raises `SessionClosed`; the agent reconnects."""
        self._lost_answers.append(method)

    def _loses(self, number: int, frame: bytes) -> bool:
        if not self._lost_answers or len(frame) > 65536:
            return False
        try:
            envelope = json.loads(frame)
        except ValueError:
            return False
        if not isinstance(envelope, dict) or envelope.get("method") != self._lost_answers[0]:
            return False
        correlation = envelope.get("correlation")
        if not isinstance(correlation, dict) or correlation.get("phase") != "response":
            return False
        self._lost_answers.pop(0)
        self._record("answer-lost", number, method=envelope["method"])
        return True

    def tamper_next_closure(self, kind: Tamper) -> None:
        """Serve the next restored closure one byte shorter, one byte longer, or altered."""
        self._tampers.append(kind)

    def stall_next_closure(self, after: int) -> None:
        """Stop the next closure transfer (kept or served) after `after` bytes, keeping its
        stream alive: a Cloudly that hangs mid-closure."""
        self._stalls.append(after)

    def closure_bytes(self, backup_id: str, service_id: str) -> bytes:
        """The bytes of a closure the stand-in holds (tests of small closures)."""
        return self.closures[(backup_id, service_id)].path.read_bytes()

    def _directory(self) -> Path:
        if self._closures_dir is None:
            self._own_dir = tempfile.TemporaryDirectory(prefix="standin-cloudly-")
            self._closures_dir = Path(self._own_dir.name)
        self._closures_dir.mkdir(parents=True, exist_ok=True)
        return self._closures_dir

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

    async def wait_for_agent(self) -> AgentConnection:
        """Wait until an agent's session is up: an open connection that tagged itself and read
        its cluster document. A `check-config --connect` probe sets no tag and does not stay,
        so the restore a caller drives next goes to the agent, not to the probe."""
        while True:
            for number in sorted(self._connections, reverse=True):
                seen = {event.kind for event in self.events if event.connection == number}
                if "tag-set" in seen and "cluster-config-read" in seen:
                    return self._connections[number]
            changed = self._changed
            await changed.wait()

    def _record(self, kind: str, connection: int, **detail: Any) -> None:
        self.events.append(CloudlyEvent(kind, connection, detail))
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    # --- one connection -------------------------------------------------------------------

    async def _serve(self, websocket: ServerConnection) -> None:
        number = next(self._numbers)
        if isinstance(websocket, _StandInConnection):
            websocket.arm(lambda frame: self._loses(number, frame))
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

        async def backup_closure(
            request: BackupServiceDatabaseClosureRequest, ctx: RequestContext
        ) -> Document:
            return answer(
                METHOD_BACKUP_SERVICE_DATABASE_CLOSURE,
                await self._keep_closure(request, ctx, connection.number),
            )

        async def restore_closure(
            request: RestoreServiceDatabaseClosureRequest, ctx: RequestContext
        ) -> Document:
            return answer(
                METHOD_RESTORE_SERVICE_DATABASE_CLOSURE,
                self._serve_closure(request, ctx, connection.number),
            )

        routes = Routes(
            [
                Route(
                    METHOD_GET_IDENTITY_BY_TOKEN, GetIdentityByTokenRequest, get_identity_by_token
                ),
                Route(METHOD_SET_TAG, SetTagRequest, set_tag),
                Route(METHOD_GET_CLUSTER_CONFIG, GetClusterConfigRequest, get_cluster_config),
                Route(
                    METHOD_BACKUP_SERVICE_DATABASE_CLOSURE,
                    BackupServiceDatabaseClosureRequest,
                    backup_closure,
                ),
                Route(
                    METHOD_RESTORE_SERVICE_DATABASE_CLOSURE,
                    RestoreServiceDatabaseClosureRequest,
                    restore_closure,
                ),
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

    async def _keep_closure(
        self, request: BackupServiceDatabaseClosureRequest, ctx: RequestContext, number: int
    ) -> dict[str, Any]:
        """Drain the closure stream to a file; keep it only if it matches its descriptor."""
        descriptor = request.descriptor
        key = (request.backup_id, request.service_id)
        part = self._directory() / f".{secrets.token_hex(8)}.part"
        source: AsyncIterable[bytes] = ctx.receive_stream(request.closure)
        if self._stalls:
            source = _stalling(source, self._stalls.pop(0), number, self._record)
        try:
            await _drain_matching(source, part, descriptor, self.closure_progress)
        except (StreamBroken, IntegrityError) as exc:
            part.unlink(missing_ok=True)
            self._record("closure-refused", number, backup_id=key[0], reason=str(exc))
            raise
        except BaseException:
            part.unlink(missing_ok=True)  # the connection went away: nothing is kept
            raise
        final = self._directory() / f"{request.backup_id}--{request.service_id}.closure"
        os.replace(part, final)
        self.closures[key] = StoredClosure(
            request.backup_id,
            request.service_id,
            request.node_id,
            descriptor.to_wire(),
            final,
            descriptor.size,
            descriptor.sha256,
        )
        self._record(
            "closure-stored", number, backup_id=key[0], service_id=key[1], size=descriptor.size
        )
        return {"accepted": True}

    def _serve_closure(
        self, request: RestoreServiceDatabaseClosureRequest, ctx: RequestContext, number: int
    ) -> dict[str, Any]:
        stored = self.closures.get((request.backup_id, request.service_id))
        if stored is None:
            raise ClosureNotFound(
                f"no closure of service {request.service_id} for backup {request.backup_id}"
            )
        tamper = self._tampers.pop(0) if self._tampers else None
        stall_after = self._stalls.pop(0) if self._stalls else None

        async def produce(sink: ByteSink) -> None:
            with stored.path.open("rb") as handle:
                sent = 0
                while block := handle.read(_SERVE_PIECE):
                    if stall_after is not None and sent >= stall_after:
                        self._record("closure-stalled", number, bytes=sent)
                        await asyncio.Event().wait()  # until the connection ends
                    sent += len(block)
                    if tamper == "corrupt" and sent == len(block):
                        block = bytes([block[0] ^ 0xFF]) + block[1:]
                    if tamper == "truncate" and sent == stored.size:
                        block = block[:-1]
                    await sink.write(block)
                    if self.closure_progress is not None:
                        self.closure_progress("served", sent, stored.size)
            if tamper == "extend":
                await sink.write(b"\x00")

        marker, _ = ctx.open_send_stream(produce)
        self._record("closure-served", number, backup_id=request.backup_id, tamper=tamper)
        return {"descriptor": stored.descriptor, "closure": marker.to_wire()}

    def _issue_jwt(self, expires_at_ms: int) -> str:
        header = _b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
        claims = {"sub": "machine-user-1", "exp": expires_at_ms // 1000}
        payload = _b64url(json.dumps(claims).encode())
        jwt = f"{header}.{payload}.{_b64url(secrets.token_bytes(32))}"
        self._jwts[jwt] = expires_at_ms
        self._issued.append(jwt)
        return jwt
