"""Every internal of websockets that `agent.session.transport` relies on, named one by one.

The transport uses more than the library's public API: `_PingingConnection` fills
`pending_pings` and writes through `send_context`, `loop` and the asyncio `transport`;
`install_piece_reader` swaps the
protocol's `reader` for a `PieceReader` (the library's stream reader's methods, same
signatures) and restarts its `parser` from `parse()`. pyproject.toml bounds websockets to the
release these were checked against; a release that moves any of them fails here, naming it,
and never on a node. Each check can fail: the second test replaces each internal in turn and
expects its check to say so. What the internals do is held by the behaviour tests
(tests/session/test_transport.py: the piece reader reading a 4 MB frame;
tests/session/test_confirming_write.py: frames and a ping in one write).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import inspect
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.version import Version
from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.connection import Connection
from websockets.asyncio.server import ServerConnection, serve
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.http11 import Response
from websockets.protocol import Protocol, State
from websockets.streams import StreamReader
from websockets.uri import parse_uri
from websockets.version import version as websockets_version

from agent.session.pieces import PieceReader
from agent.session.transport import connect_transport, install_piece_reader

ROOT = Path(__file__).resolve().parents[2]
_MISSING = object()


@dataclass(frozen=True, slots=True)
class _Subjects:
    """What the internals live on: the attributes the transport uses of the agent's client
    connection, as they were while it was open with one ping of the library's pending (taken
    then, so a test can take one away without touching a live connection), and a fresh client
    protocol (before a byte is read)."""

    connection: SimpleNamespace
    ping: bytes
    protocol: ClientProtocol


@dataclass(frozen=True, slots=True)
class _Internal:
    """One internal: `owner` finds what it lives on, `check` judges what is found there
    (`_MISSING` when nothing is), raising AssertionError when it is not what the transport
    expects."""

    name: str
    owner: Callable[[_Subjects], Any]
    check: Callable[[_Subjects, Any], None]

    @property
    def attribute(self) -> str:
        return self.name.rsplit(".", 1)[1]


def _parameters(found: Any) -> list[str]:
    assert callable(found), "gone or not callable"
    return [p.name for p in inspect.signature(found).parameters.values() if p.name != "self"]


def _method(*parameters: str) -> Callable[[_Subjects, Any], None]:
    """A method called or overridden with exactly these parameters (names, in order); any
    other it has must have a default."""

    def check(_: _Subjects, found: Any) -> None:
        names = _parameters(found)
        assert names[: len(parameters)] == list(parameters), inspect.signature(found)
        rest = list(inspect.signature(found).parameters.values())[len(parameters) + 1 :]
        assert all(p.default is not p.empty for p in rest), inspect.signature(found)

    return check


def _stream_reader_method(name: str) -> Callable[[_Subjects, Any], None]:
    """A method the protocol calls on its reader: `PieceReader` has it with its signature."""

    def check(_: _Subjects, found: Any) -> None:
        assert _parameters(found) == _parameters(getattr(PieceReader, name)), found

    return check


def _of_type(kind: type | tuple[type, ...]) -> Callable[[_Subjects, Any], None]:
    def check(_: _Subjects, found: Any) -> None:
        assert isinstance(found, kind), f"{found!r} is no {kind}"

    return check


def _check_send_context(_: _Subjects, found: Any) -> None:
    # An async context manager taking no argument of ours: `async with self.send_context():`.
    assert _parameters(found) == ["expected_state"], found
    assert inspect.isasyncgenfunction(getattr(found, "__wrapped__", None)), found


def _check_pending_pings(subjects: _Subjects, found: Any) -> None:
    # Ping payload -> (pong waiter, time sent), in the order the pings went out: what
    # the library's pong handling walks, and what `send_then_ping` fills the library's way.
    assert isinstance(found, dict), found
    waiter, sent = found[subjects.ping]
    assert isinstance(waiter, asyncio.Future), waiter
    assert isinstance(sent, float), sent
    assert sent <= asyncio.get_running_loop().time(), sent


def _check_loop(_: _Subjects, found: Any) -> None:
    assert found is asyncio.get_running_loop(), found


def _check_reader(_: _Subjects, found: Any) -> None:
    # The library's own, empty: what `install_piece_reader` expects to replace.
    assert type(found) is StreamReader, found
    assert isinstance(found.buffer, bytearray), vars(found)
    assert isinstance(found.eof, bool), vars(found)


def _check_parse(_: _Subjects, found: Any) -> None:
    assert inspect.isgeneratorfunction(found), found
    assert _parameters(found) == [], found


def _check_parser(_: _Subjects, found: Any) -> None:
    assert inspect.isgenerator(found), found


def _check_connecting(_: _Subjects, found: Any) -> None:
    assert found is State.CONNECTING, found


def _check_create_connection(_: _Subjects, found: Any) -> None:
    # `connect(create_connection=...)` builds the agent's connection class from the protocol.
    assert "create_connection" in _parameters(found), found
    assert _parameters(ClientConnection.__init__)[0] == "protocol", ClientConnection.__init__


def _class(kind: type) -> Callable[[_Subjects], Any]:
    return lambda _: kind


INTERNALS = [
    _Internal("Connection.send_context", _class(Connection), _check_send_context),
    _Internal("Connection.pending_pings", lambda s: s.connection, _check_pending_pings),
    _Internal("Connection.loop", lambda s: s.connection, _check_loop),
    _Internal("Connection.transport", lambda s: s.connection, _of_type(asyncio.Transport)),
    _Internal("Connection.protocol", lambda s: s.connection, _of_type(ClientProtocol)),
    _Internal("connect.__init__", _class(connect), _check_create_connection),
    _Internal("Protocol.send_text", _class(Protocol), _method("data")),
    _Internal("Protocol.send_ping", _class(Protocol), _method("data")),
    _Internal("Protocol.data_to_send", _class(Protocol), _method()),
    _Internal("ClientProtocol.parse", _class(ClientProtocol), _check_parse),
    _Internal("ClientProtocol.reader", lambda s: s.protocol, _check_reader),
    _Internal("ClientProtocol.parser", lambda s: s.protocol, _check_parser),
    _Internal("ClientProtocol.state", lambda s: s.protocol, _check_connecting),
    *(
        _Internal(f"StreamReader.{name}", _class(StreamReader), _stream_reader_method(name))
        for name in (
            "read_line",
            "read_exact",
            "read_to_eof",
            "at_eof",
            "feed_data",
            "feed_eof",
            "discard",
        )
    ),
]


@pytest.fixture
async def subjects() -> _Subjects:
    async def handler(ws: ServerConnection) -> None:
        await ws.wait_closed()

    server = await serve(handler, "127.0.0.1", 0, compression=None)
    port = server.sockets[0].getsockname()[1]
    transport = await connect_transport(
        f"ws://127.0.0.1:{port}/",
        ssl_context=None,
        max_size=2**20,
        compression=None,
        ping_interval=None,
        ping_timeout=None,
        open_timeout=5.0,
        close_timeout=2.0,
    )
    connection = transport._connection
    try:
        # Taken before anything is awaited after the ping's write: its pong cannot have come.
        await connection.ping(b"probe")
        taken = SimpleNamespace(
            **{
                name: getattr(connection, name, _MISSING)
                for name in ("loop", "transport", "protocol")
            },
            pending_pings=dict(getattr(connection, "pending_pings", {})),
        )
    finally:
        await transport.close()
        server.close()
        await server.wait_closed()
    return _Subjects(taken, b"probe", ClientProtocol(parse_uri("ws://127.0.0.1/")))


@pytest.mark.parametrize("internal", INTERNALS, ids=lambda internal: internal.name)
async def test_the_internal_is_what_the_transport_expects(
    internal: _Internal, subjects: _Subjects
) -> None:
    """websockets still has it, with the signature, type or shape the transport relies on."""
    found = getattr(internal.owner(subjects), internal.attribute, _MISSING)
    try:
        internal.check(subjects, found)
    except (AssertionError, KeyError, TypeError, ValueError) as exc:
        pytest.fail(f"websockets {websockets_version}: {internal.name} moved: {exc!r}")


@pytest.mark.parametrize("internal", INTERNALS, ids=lambda internal: internal.name)
async def test_a_websockets_without_the_internal_fails_its_check(
    internal: _Internal, subjects: _Subjects, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each check can fail: with the internal taken away (replaced by nothing the transport
    could use), its check refuses it."""
    owner = internal.owner(subjects)
    monkeypatch.setattr(owner, internal.attribute, None)
    with pytest.raises((AssertionError, TypeError)):
        internal.check(subjects, getattr(owner, internal.attribute))


def test_the_piece_reader_has_every_method_of_the_librarys_stream_reader() -> None:
    """A method the library's reader gained is one its protocol may call on ours."""
    methods = {name for name, value in vars(StreamReader).items() if callable(value)}
    assert methods - {"__init__"} <= set(dir(PieceReader))


def _handshake_answer(protocol: ClientProtocol) -> bytes:
    request = protocol.connect()
    protocol.send_request(request)
    key = request.headers["Sec-WebSocket-Key"].encode()
    accept = base64.b64encode(
        hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest()  # noqa: S324
    )
    return (
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Accept: " + accept + b"\r\n\r\n"
    )


def test_a_protocol_reads_through_the_piece_reader_swapped_in() -> None:
    """Sans-I/O: with its reader swapped and its parser restarted, a client protocol reads the
    handshake's answer and a text frame cut across two pieces, through the `PieceReader`."""
    protocol = ClientProtocol(parse_uri("ws://127.0.0.1/"))
    install_piece_reader(protocol)
    answer = _handshake_answer(protocol) + bytes([0x81, 5]) + b"hello"
    protocol.receive_data(answer[:-3])
    protocol.receive_data(answer[-3:])
    response, frame = protocol.events_received()
    assert isinstance(response, Response)
    assert response.status_code == 101
    assert isinstance(frame, Frame)
    assert (frame.opcode, bytes(frame.data)) == (Opcode.TEXT, b"hello")
    assert isinstance(protocol.reader, PieceReader)
    assert protocol.state is State.OPEN


def _websockets_requirement() -> Requirement:
    text = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    [requirement] = [Requirement(r) for r in text if Requirement(r).name == "websockets"]
    return requirement


def _next_minor(version: Version) -> Version:
    return Version(f"{version.major}.{version.minor + 1}")


def test_websockets_is_bounded_to_the_release_these_internals_were_checked_against() -> None:
    """The installed websockets (the locks' pin) is within pyproject's bound, and the bound
    admits no later minor release: a new one is a deliberate edit, then this module."""
    specifier = _websockets_requirement().specifier
    installed = Version(websockets_version)
    assert specifier.contains(installed), f"websockets {installed} is outside {specifier}"
    assert not specifier.contains(_next_minor(installed)), f"{specifier} admits a later release"
