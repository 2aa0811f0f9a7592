"""An answer's frames and its confirming ping reach the socket in ONE write, on a real
websocket on 127.0.0.1: `WebsocketTransport.send_then_ping`, and the `Peer` flush that uses it.

Every write the agent's connection hands its asyncio transport is recorded (`_WriteLog`, put
between the library's connection and the transport after the handshake); client frames are
masked, so each write is cut back into its frames (opcode, unmasked payload)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import pytest
from websockets.asyncio.server import ServerConnection

from agent.errors import InvalidState, SessionClosed
from agent.protocol.delivery import Mark
from agent.protocol.handlers import RequestContext, Routes
from agent.session.delivery import DeliveryTracker
from agent.session.peer import Peer
from agent.session.transport import WebsocketTransport
from tests.session._helpers import FAST, body_route
from tests.session._sockets import ServerHandler, open_transport

_TEXT, _PING = 0x1, 0x9


class _WriteLog:
    """An asyncio transport that records each write handed to it (one entry per call)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))
        self._inner.write(data)

    def writelines(self, chunks: Iterable[bytes]) -> None:
        chunks = list(chunks)
        self.writes.append(b"".join(chunks))
        self._inner.writelines(chunks)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _logged(transport: WebsocketTransport) -> _WriteLog:
    connection = transport._connection
    log = _WriteLog(connection.transport)
    connection.transport = log  # type: ignore[assignment]  # the same interface, recorded
    return log


def _frames(write: bytes) -> list[tuple[int, bytes]]:
    """The client frames one write holds, each (opcode, unmasked payload)."""
    frames, at = [], 0
    while at < len(write):
        opcode, length = write[at] & 0x0F, write[at + 1] & 0x7F
        at += 2
        if length >= 126:
            size = 2 if length == 126 else 8
            length, at = int.from_bytes(write[at : at + size], "big"), at + size
        mask, at = write[at : at + 4], at + 4
        payload = bytes(b ^ mask[i % 4] for i, b in enumerate(write[at : at + length]))
        frames.append((opcode, payload))
        at += length
    return frames


async def test_frames_and_the_ping_behind_them_are_one_write(
    server_factory: Callable[[ServerHandler], Awaitable[int]],
) -> None:
    """Two frames and a ping: one write holding them in that order; the peer reads both
    frames, and the ping's pong comes."""
    received: asyncio.Queue[str | bytes] = asyncio.Queue()

    async def handler(ws: ServerConnection) -> None:
        for _ in range(2):
            await received.put(await ws.recv())
        await ws.wait_closed()

    transport = await open_transport(await server_factory(handler))
    log = _logged(transport)
    try:
        pending = await transport.send_then_ping([b'{"n":1}', b'{"n":2}'])
        assert [_frames(write) for write in log.writes] == [
            [(_TEXT, b'{"n":1}'), (_TEXT, b'{"n":2}'), (_PING, b"agent-1")]
        ]
        await pending.answer()
        assert [await received.get(), await received.get()] == ['{"n":1}', '{"n":2}']
    finally:
        await transport.close()


async def test_a_ping_sent_with_frames_is_numbered_like_a_ping_sent_alone(
    server_factory: Callable[[ServerHandler], Awaitable[int]],
) -> None:
    """The pings of both ways share one sequence of payloads and both are answered."""

    async def handler(ws: ServerConnection) -> None:
        await ws.wait_closed()

    transport = await open_transport(await server_factory(handler))
    log = _logged(transport)
    try:
        await transport.ping()
        await (await transport.send_then_ping([])).answer()
        assert [_frames(write) for write in log.writes] == [
            [(_PING, b"agent-1")],
            [(_PING, b"agent-2")],
        ]
    finally:
        await transport.close()


async def test_frames_and_a_ping_on_a_closed_connection_raise_session_closed(
    server_factory: Callable[[ServerHandler], Awaitable[int]],
) -> None:
    """Once the connection is closed: `SessionClosed` with our close code, nothing written."""

    async def handler(ws: ServerConnection) -> None:
        await ws.wait_closed()

    transport = await open_transport(await server_factory(handler))
    await transport.close(1001, "going away")
    log = _logged(transport)
    with pytest.raises(SessionClosed) as caught:
        await transport.send_then_ping([b"{}"])
    assert (caught.value.close_code, log.writes) == (1001, [])


async def test_only_the_agents_connection_sends_frames_with_a_ping(
    server_factory: Callable[[ServerHandler], Awaitable[int]],
) -> None:
    """A server's connection writes no frames with a ping: `InvalidState`."""
    refused: asyncio.Queue[BaseException | None] = asyncio.Queue()

    async def handler(ws: ServerConnection) -> None:
        try:
            await WebsocketTransport(ws).send_then_ping([b"{}"])
        except InvalidState as exc:
            await refused.put(exc)
        else:
            await refused.put(None)

    transport = await open_transport(await server_factory(handler))
    try:
        assert isinstance(await refused.get(), InvalidState)
    finally:
        await transport.close()


async def test_a_peer_writes_an_awaited_answer_and_its_ping_in_one_write(
    server_factory: Callable[[ServerHandler], Awaitable[int]],
) -> None:
    """The agent's `Peer` answers a request whose answer's delivery is awaited: the write that
    carries the answer ends with the confirming ping, no write is a ping alone, and the
    ping's pong delivers the answer on its connection."""
    answers: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    async def cloudly(ws: ServerConnection) -> None:
        peer = Peer(WebsocketTransport(ws), Routes(), settings=FAST)
        run = asyncio.create_task(peer.run())
        await answers.put(await peer.call("ask", {"n": 1}, timeout=5))
        with contextlib.suppress(SessionClosed):
            await run

    delivered: list[Mark] = []
    heard = asyncio.Event()

    def on_delivered(mark: Mark) -> None:
        delivered.append(mark)
        heard.set()

    async def ask(body: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        ctx.on_delivered(on_delivered)
        return {"answer": body["n"]}

    transport = await open_transport(await server_factory(cloudly))
    log = _logged(transport)
    tracker = DeliveryTracker(1, transport)
    agent = Peer(transport, Routes([body_route("ask", ask)]), settings=FAST, deliveries=tracker)
    run = asyncio.create_task(agent.run())
    try:
        assert await answers.get() == {"answer": 1}
        await heard.wait()  # the pong settles in a task of the peer's
    finally:
        await transport.close()
        with pytest.raises(SessionClosed):
            await run
    writes = [_frames(write) for write in log.writes]
    [carrying] = [w for w in writes if any(b'"answer":1' in payload for _, payload in w)]
    assert carrying[-1] == (_PING, b"agent-1")
    assert [(_PING, b"agent-1")] not in writes
    assert delivered == [Mark(1)]
