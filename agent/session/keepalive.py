"""The session's keepalive: a websocket ping every `interval` s, on the session's clock.

Each pong's round trip goes to `on_pong` (the status records it, so readiness can say when
Cloudly was last heard) and, with a `DeliveryTracker`, delivers every answer sent before its
ping; a ping left unanswered for `pong_timeout` s declares the connection dead:
`SessionClosed` 1011 (internal error), and the session reconnects (the answers that ping
covered stay undelivered). The library's own keepalive is off (`agent.session.transport`), so
every wait runs on the injected `Clock`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import NoReturn, Protocol

from agent.clock import Clock
from agent.errors import SessionClosed
from agent.session.delivery import DeliveryTracker
from agent.session.transport import CloseCode, Pong

__all__ = ["Pinger", "keep_alive"]


class Pinger(Protocol):
    """A connection that can be pinged (`WebsocketTransport`)."""

    async def ping(self) -> Pong:
        """Send a ping; its pong (the round trip)."""
        ...


async def keep_alive(
    connection: Pinger,
    *,
    clock: Clock,
    interval: float,
    pong_timeout: float,
    on_pong: Callable[[float], None],
    deliveries: DeliveryTracker | None = None,
) -> NoReturn:
    """Ping every `interval` s and report each pong (to `deliveries` too: it delivers every
    answer sent before its ping); raise `SessionClosed` 1011 when a pong is later than
    `pong_timeout` s."""
    while True:
        await clock.sleep(interval)
        number = deliveries.ping() if deliveries is not None else 0
        async with asyncio.TaskGroup() as group:
            pong = group.create_task(connection.ping())
            expiry = group.create_task(clock.sleep(pong_timeout))
            await asyncio.wait({pong, expiry}, return_when=asyncio.FIRST_COMPLETED)
            expiry.cancel()
            pong.cancel()  # no-op once answered
        if pong.cancelled():
            raise SessionClosed(
                CloseCode.INTERNAL_ERROR,
                f"Cloudly answered no keepalive ping within {pong_timeout:g} s",
            )
        on_pong(pong.result().seconds)
        if deliveries is not None:
            deliveries.ponged(number)
