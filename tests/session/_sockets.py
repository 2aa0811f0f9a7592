"""Real websockets on 127.0.0.1 for the transport's tests: the agent's transport connected to a
server of the test's (tests/session/conftest.py's `server_factory`), without keepalive or
compression."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from websockets.asyncio.server import ServerConnection

from agent.session.transport import WebsocketTransport, connect_transport

__all__ = ["ServerHandler", "open_transport"]

ServerHandler = Callable[[ServerConnection], Awaitable[None]]


async def open_transport(port: int, *, max_size: int = 2**20) -> WebsocketTransport:
    """The agent's transport connected to ws://127.0.0.1:`port`/."""
    return await connect_transport(
        f"ws://127.0.0.1:{port}/",
        ssl_context=None,
        max_size=max_size,
        compression=None,
        ping_interval=None,
        ping_timeout=None,
        open_timeout=5.0,
        close_timeout=2.0,
    )
