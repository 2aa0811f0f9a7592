"""`DeliveryTracker`: the ping rule on one connection, between its peer and its keepalive.

The asyncio face of `agent.protocol.delivery.Deliveries`. The peer writes each answer to the
websocket and, in the same step (nothing awaited in between, so no frame of anyone can come
between them), hands its callbacks over and writes the ping that confirms it (`answered`,
`confirm`): Cloudly's websocket reads the answer and the ping together and answers the ping
before Cloudly's code can send a repeat. The pong (`ponged`, also for every keepalive ping)
calls the callbacks of every answer a ping up to it covered, with the `Mark` it was read at;
the session declares the connection `lost()` when it ends, after which nothing it carried is
ever delivered. A handler that must know what the peer holds before it decides waits for
`settled()`: every answer handed out before it asked is then delivered or lost (bounded by
the keepalive's pong timeout, which ends the connection, and `lost()` decides the rest).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

import structlog

from agent.errors import SessionClosed
from agent.protocol.delivery import Deliveries, Mark
from agent.session.transport import Pong

__all__ = ["DeliveryTracker", "OnDelivered", "PingWriter"]

_log = structlog.get_logger("agent.session.delivery")

OnDelivered = Callable[[Mark], None]
"""Called once an answer is known delivered, with where (never if it cannot be known)."""


class PendingAnswer(Protocol):
    """A ping written (`agent.session.transport.PendingPong`)."""

    async def answer(self) -> Pong:
        """Its pong."""
        ...


class PingWriter(Protocol):
    """A connection that writes a ping at once and lets its pong be awaited
    (`WebsocketTransport.start_ping`)."""

    async def start_ping(self) -> PendingAnswer: ...


class DeliveryTracker:
    """The ping rule of one connection (module docstring)."""

    def __init__(self, connection: int, pings: PingWriter | None = None) -> None:
        """`pings` writes the confirming pings (None: only the keepalive's pings confirm)."""
        self._ledger: Deliveries[OnDelivered] = Deliveries(connection)
        self._pings = pings
        self._changed = asyncio.Event()

    @property
    def connection(self) -> int:
        """The connection's number on the session (from 1)."""
        return self._ledger.connection

    def answered(self, callbacks: list[OnDelivered]) -> None:
        """Answers were just written to the websocket (after every frame before them);
        `callbacks` hear of their delivery."""
        self._ledger.answered(callbacks)

    async def confirm(self) -> tuple[int, PendingAnswer] | None:
        """Write a ping now if an answer waits for one; (its number, its pending pong) for
        `settle` (run it in a task of the caller's), or None when no ping was needed."""
        if self._pings is None or not self._ledger.wanted:
            return None
        number = self._ledger.ping()
        return number, await self._pings.start_ping()

    async def settle(self, number: int, pending: PendingAnswer) -> None:
        """Wait for the pong of confirming ping `number` and deliver what it covered."""
        try:
            answer = await pending.answer()
        except SessionClosed:
            return  # the connection ended: `lost()` decides what the ping covered
        self.ponged(number, after=answer.after)

    def ping(self) -> int:
        """A keepalive ping goes out now; its number (for `ponged`)."""
        return self._ledger.ping()

    def ponged(self, number: int, *, after: int) -> None:
        """The pong of ping `number` was read after `after` of the peer's messages."""
        for callback, mark in self._ledger.pong(number, after=after):
            try:
                callback(mark)
            except Exception:  # noqa: BLE001  # one listener's bug must not stop the others
                _log.exception("delivery_callback_failed")
        self._wake()

    def lost(self) -> None:
        """The connection ended: what no pong confirmed is never delivered."""
        self._ledger.lost()
        self._wake()

    async def settled(self) -> None:
        """Wait until every answer handed out so far is delivered or lost."""
        horizon = self._ledger.horizon()
        while not self._ledger.settled(horizon):
            await self._changed.wait()

    def _wake(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
