"""`DeliveryTracker`: the ping rule on one connection, between its peer and its keepalive.

The asyncio face of `agent.protocol.delivery.Deliveries`. The flush that writes answers whose
delivery a handler waits to know hands their callbacks over and writes its frames and the ping
that confirms them in ONE write to the socket (`confirm`, the transport's `send_then_ping`),
the ledger's bookkeeping in the same step (nothing awaited in between, so no keepalive ping is
numbered between the answers and their ping, and no frame of anyone comes between them). The
pong (`ponged`, also for every keepalive ping) calls the callbacks of every answer a ping up to
it covered, with the `Mark` of the connection; the session declares the connection `lost()`
when it ends, after which nothing it carried is ever delivered.

What a pong proves: Cloudly's websocket read every frame before the ping, the answer
included. Not when Cloudly's code read it: whether the websocket hands the answer to the code
before it answers the ping, and whether a request the code sends then can come before the
pong, depends on how the bytes were segmented and on the peer's websocket (ws's
`allowSynchronousEvents`, for one). One write keeps the answer and its ping in the same read
unless the network splits them, so the pong comes promptly; it is no proof of order. The agent
does not infer from a pong's timing whether Cloudly's code held an answer before it sent a
request: a confirmation matters only for an answer whose connection ended, which it tells
delivered (its pong came) from lost (none did).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import structlog

from agent.errors import InvalidState, SessionClosed
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
    """A connection that writes frames and a ping behind them in one write and lets the pong
    be awaited (`WebsocketTransport.send_then_ping`)."""

    async def send_then_ping(self, frames: Sequence[bytes]) -> PendingAnswer: ...


class DeliveryTracker:
    """The ping rule of one connection (module docstring)."""

    def __init__(self, connection: int, pings: PingWriter | None = None) -> None:
        """`pings` writes the confirming pings (None: only the keepalive's pings confirm)."""
        self._ledger: Deliveries[OnDelivered] = Deliveries(connection)
        self._pings = pings

    @property
    def connection(self) -> int:
        """The connection's number on the session (from 1)."""
        return self._ledger.connection

    @property
    def confirms(self) -> bool:
        """Whether answers go out with their confirming ping (`confirm`); else they are
        written alone and handed over after (`answered`), for the keepalive's pings."""
        return self._pings is not None

    def answered(self, callbacks: list[OnDelivered]) -> None:
        """Answers were just written to the websocket (after every frame before them), with no
        ping of their own; `callbacks` hear of their delivery."""
        self._ledger.answered(callbacks)

    async def confirm(
        self, frames: Sequence[bytes], callbacks: list[OnDelivered]
    ) -> tuple[int, PendingAnswer]:
        """Write `frames`, which carry answers whose delivery `callbacks` wait to hear of, and
        the ping that confirms them, in one write; (the ping's number, its pending pong) for
        `settle` (run it in a task of the caller's). `InvalidState` without a `PingWriter`."""
        if self._pings is None:
            raise InvalidState("this tracker writes no pings: write the answers, then answered()")
        self._ledger.answered(callbacks)
        number = self._ledger.ping()
        return number, await self._pings.send_then_ping(frames)

    async def settle(self, number: int, pending: PendingAnswer) -> None:
        """Wait for the pong of confirming ping `number` and deliver what it covered."""
        try:
            await pending.answer()
        except SessionClosed:
            return  # the connection ended: `lost()` decides what the ping covered
        self.ponged(number)

    def ping(self) -> int:
        """A keepalive ping goes out now; its number (for `ponged`)."""
        return self._ledger.ping()

    def ponged(self, number: int) -> None:
        """The pong of ping `number` came."""
        for callback, mark in self._ledger.pong(number):
            try:
                callback(mark)
            except Exception:  # noqa: BLE001  # one listener's bug must not stop the others
                _log.exception("delivery_callback_failed")

    def lost(self) -> None:
        """The connection ended: what no pong confirmed is never delivered."""
        self._ledger.lost()
