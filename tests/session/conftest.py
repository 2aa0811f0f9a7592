"""Fixtures of the session's tests: a real websocket server on 127.0.0.1 port 0."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from websockets.asyncio.server import Server, serve

from agent.session.transport import quiet_websocket_logger
from tests.session._sockets import ServerHandler


@pytest.fixture
async def server_factory() -> AsyncIterator[Callable[[ServerHandler], Awaitable[int]]]:
    """`await server_factory(handler)`: a websocket server on 127.0.0.1 port 0; its port."""
    servers: list[Server] = []

    async def start(handler: ServerHandler) -> int:
        server = await serve(
            handler,
            "127.0.0.1",
            0,
            compression=None,
            logger=quiet_websocket_logger("tests.websocket.server"),
        )
        servers.append(server)
        return int(server.sockets[0].getsockname()[1])

    yield start
    for server in servers:
        server.close()
        await server.wait_closed()
