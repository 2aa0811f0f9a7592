"""WebsocketTransport: text frames as bytes, closes as SessionClosed, opening errors, URL/TLS."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from websockets.asyncio.server import ServerConnection
from websockets.client import ClientProtocol
from websockets.exceptions import ConnectionClosed
from websockets.uri import parse_uri

from agent.errors import ConfigError, InvalidState, SessionClosed, SessionError, UpgradeRefused
from agent.session.pieces import PieceReader
from agent.session.transport import (
    install_piece_reader,
    tls_context,
)
from tests.session._sockets import open_transport


async def test_text_frame_arrives_as_bytes(server_factory: Callable[..., Awaitable[int]]) -> None:
    """A text frame from the peer is returned undecoded, as its UTF-8 bytes."""

    async def handler(ws: ServerConnection) -> None:
        await ws.send('{"method":"ä"}')
        await ws.wait_closed()

    transport = await open_transport(await server_factory(handler))
    assert await transport.recv() == '{"method":"ä"}'.encode()
    await transport.close()


async def test_send_emits_one_text_frame(server_factory: Callable[..., Awaitable[int]]) -> None:
    """`send(bytes)` arrives at the peer as a text frame (str), not a binary one."""
    received: asyncio.Queue[str | bytes] = asyncio.Queue()

    async def handler(ws: ServerConnection) -> None:
        await received.put(await ws.recv())
        await ws.wait_closed()

    transport = await open_transport(await server_factory(handler))
    await transport.send('{"x":"ü"}'.encode())
    assert await received.get() == '{"x":"ü"}'
    await transport.close()


async def test_peer_close_becomes_session_closed_with_code_and_reason(
    server_factory: Callable[..., Awaitable[int]],
) -> None:
    """The peer's close code and reason surface as SessionClosed, chained to the library error."""

    async def handler(ws: ServerConnection) -> None:
        await ws.close(4000, "bye")

    transport = await open_transport(await server_factory(handler))
    with pytest.raises(SessionClosed) as caught:
        await transport.recv()
    assert (caught.value.close_code, caught.value.reason) == (4000, "bye")
    assert isinstance(caught.value.__cause__, ConnectionClosed)


async def test_send_after_close_raises_session_closed(
    server_factory: Callable[..., Awaitable[int]],
) -> None:
    """Sending on a closed connection raises SessionClosed, not a library exception."""

    async def handler(ws: ServerConnection) -> None:
        await ws.wait_closed()

    transport = await open_transport(await server_factory(handler))
    await transport.close(1001, "going away")
    with pytest.raises(SessionClosed) as caught:
        await transport.send(b"{}")
    assert caught.value.close_code == 1001


async def test_our_close_code_reaches_the_peer(
    server_factory: Callable[..., Awaitable[int]],
) -> None:
    """`close(1001)` is what the server sees as the close code."""
    seen: asyncio.Queue[int | None] = asyncio.Queue()

    async def handler(ws: ServerConnection) -> None:
        await ws.wait_closed()
        await seen.put(ws.close_code)

    transport = await open_transport(await server_factory(handler))
    await transport.close(1001, "going away")
    assert await seen.get() == 1001


async def test_frame_above_max_size_closes_with_1009(
    server_factory: Callable[..., Awaitable[int]],
) -> None:
    """A frame larger than `max_size` ends the session with close code 1009 (message too big)."""

    async def handler(ws: ServerConnection) -> None:
        await ws.send("x" * 2048)
        await ws.wait_closed()

    transport = await open_transport(await server_factory(handler), max_size=1024)
    with pytest.raises(SessionClosed) as caught:
        await transport.recv()
    assert caught.value.close_code == 1009


async def test_refused_connection_is_a_session_error() -> None:
    """Nobody listening: SessionError naming the host, chained to the OSError."""
    listener = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    listener.close()
    await listener.wait_closed()
    with pytest.raises(SessionError, match=f"127.0.0.1:{port}") as caught:
        await open_transport(port)
    assert isinstance(caught.value.__cause__, OSError)


async def test_non_websocket_server_is_an_upgrade_refused_with_its_status() -> None:
    """An HTTP server that refuses the upgrade yields `UpgradeRefused` (a SessionError, not a
    library exception) carrying the HTTP status it answered."""

    async def answer_404(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    listener = await asyncio.start_server(answer_404, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    try:
        with pytest.raises(UpgradeRefused, match="refused the websocket") as caught:
            await open_transport(port)
    finally:
        listener.close()
        await listener.wait_closed()
    assert caught.value.http_status == 404


async def test_frames_are_never_logged_even_at_debug(
    server_factory: Callable[..., Awaitable[int]], caplog: pytest.LogCaptureFixture
) -> None:
    """With the root logger at DEBUG, frame contents (tokens) still never reach a log record."""
    caplog.set_level(logging.DEBUG)

    async def handler(ws: ServerConnection) -> None:
        await ws.send(await ws.recv())
        await ws.wait_closed()

    transport = await open_transport(await server_factory(handler))
    await transport.send(b'{"token":"tok-SECRET-123"}')
    assert await transport.recv() == b'{"token":"tok-SECRET-123"}'
    await transport.close()
    assert caplog.records  # the capture works: the library did log (at INFO)
    assert all("tok-SECRET-123" not in record.getMessage() for record in caplog.records)


def test_plain_websocket_needs_no_tls() -> None:
    """ws:// gets no TLS context."""
    assert tls_context("ws://127.0.0.1:1", None) is None


def test_secure_websocket_verifies_certificates_and_hostnames() -> None:
    """wss:// gets a context that verifies the chain and the host name."""
    context = tls_context("wss://cloudly.example", None)
    assert context is not None
    assert context.verify_mode is ssl.CERT_REQUIRED
    assert context.check_hostname is True


def test_unreadable_ca_file_is_a_config_error(tmp_path: Path) -> None:
    """A configured CA file that cannot be loaded stops start-up naming `cloudly.ca_file`."""
    with pytest.raises(ConfigError, match=r"cloudly\.ca_file"):
        tls_context("wss://cloudly.example", tmp_path / "missing.pem")


# --- message order and pongs: a raw server that writes frames exactly as the test says ----------


def _frame(opcode: int, payload: bytes) -> bytes:
    """One unmasked server frame (payloads under 126 bytes)."""
    assert len(payload) < 126
    return bytes([0x80 | opcode, len(payload)]) + payload


def _text(payload: bytes) -> bytes:
    return _frame(0x1, payload)


async def _read_client_frame(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One masked client frame: (opcode, unmasked payload)."""
    head = await reader.readexactly(2)
    length = head[1] & 0x7F
    if length == 126:
        length = int.from_bytes(await reader.readexactly(2), "big")
    mask = await reader.readexactly(4)
    data = await reader.readexactly(length)
    return head[0] & 0x0F, bytes(b ^ mask[i % 4] for i, b in enumerate(data))


@pytest.fixture
async def raw_server() -> AsyncIterator[Callable[..., Awaitable[int]]]:
    """A websocket server written by hand: after the handshake it writes `greeting` (raw frame
    bytes, in one write), then answers each ping with `answer(payload)` (raw bytes, one
    write). The test decides exactly which frames come before a pong on the wire."""
    servers: list[asyncio.Server] = []

    async def start(greeting: bytes, answer: Callable[[bytes], bytes]) -> int:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            request = await reader.readuntil(b"\r\n\r\n")
            key = next(
                line.split(b":", 1)[1].strip()
                for line in request.split(b"\r\n")
                if line.lower().startswith(b"sec-websocket-key:")
            )
            accept = base64.b64encode(
                hashlib.sha1(key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest()  # noqa: S324
            )
            writer.write(
                b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                b"Connection: Upgrade\r\nSec-WebSocket-Accept: " + accept + b"\r\n\r\n" + greeting
            )
            with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
                while True:
                    opcode, payload = await _read_client_frame(reader)
                    if opcode == 0x9:
                        writer.write(answer(payload))
                    elif opcode == 0x8:
                        break
            writer.close()

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        servers.append(server)
        return int(server.sockets[0].getsockname()[1])

    yield start
    for server in servers:
        server.close()
        await server.wait_closed()


async def test_the_agents_connection_reads_frames_through_the_piece_reader(
    server_factory: Callable[..., Awaitable[int]],
) -> None:
    """A 4 MB text frame (a Buffer-form chunk's size) arrives whole, through the reader that
    cuts it out of the socket's pieces with one copy, right after the handshake's answer."""
    payload = (b'{"chunk":[' + b"1," * 2_000_000 + b"1]}").decode()

    async def handler(ws: ServerConnection) -> None:
        await ws.send(payload)
        await ws.send("after")
        await ws.wait_closed()

    transport = await open_transport(await server_factory(handler), max_size=8 << 20)
    try:
        assert isinstance(transport._connection.protocol.reader, PieceReader)
        assert await transport.recv() == payload.encode()
        assert await transport.recv() == b"after"
    finally:
        await transport.close()


def test_the_piece_reader_goes_in_only_before_a_byte_is_read() -> None:
    """Once the protocol has read a byte, swapping its reader would lose it: refused."""
    fresh = ClientProtocol(parse_uri("ws://127.0.0.1/"))
    install_piece_reader(fresh)
    assert isinstance(fresh.reader, PieceReader)
    with pytest.raises(InvalidState):
        install_piece_reader(fresh)  # not the library's reader any more
    begun = ClientProtocol(parse_uri("ws://127.0.0.1/"))
    begun.receive_data(b"HTTP/1.1 101")
    with pytest.raises(InvalidState):
        install_piece_reader(begun)
