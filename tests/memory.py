"""In-memory `FrameTransport` pairs (asyncio queues, no sockets): for tests and demos."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from agent.errors import SessionClosed

__all__ = ["MemoryTransport", "transport_pair"]

_CLOSE = b""


class MemoryTransport:
    """One end of an in-memory connection; `close()` ends both directions."""

    def __init__(self, inbox: asyncio.Queue[bytes], outbox: asyncio.Queue[bytes]) -> None:
        self._inbox = inbox
        self._outbox = outbox
        self.closed = False
        self.sent: list[bytes] = []
        self.record = False
        self.on_send: Callable[[bytes], bytes | None] | None = None

    async def send(self, frame: bytes) -> None:
        """Deliver one frame to the other end (or raise `SessionClosed`)."""
        if self.closed:
            raise SessionClosed(1006, "memory transport closed")
        if self.record:
            self.sent.append(frame)
        if self.on_send is not None:
            replaced = self.on_send(frame)
            if replaced is None:
                return
            frame = replaced
        await self._outbox.put(frame)

    async def recv(self) -> bytes:
        """The next frame from the other end; raises `SessionClosed` after `close()`."""
        if self.closed:
            raise SessionClosed(1006, "memory transport closed")
        frame = await self._inbox.get()
        if frame == _CLOSE:
            self.closed = True
            self._outbox.put_nowait(_CLOSE)
            raise SessionClosed(1000, "closed by peer")
        return frame

    def close(self) -> None:
        """Close the connection: both ends' `recv` raise `SessionClosed`."""
        if not self.closed:
            self.closed = True
            self._inbox.put_nowait(_CLOSE)
            self._outbox.put_nowait(_CLOSE)

    def inject(self, frame: bytes) -> None:
        """Make `frame` arrive at this end as if the other end sent it."""
        self._inbox.put_nowait(frame)


def transport_pair() -> tuple[MemoryTransport, MemoryTransport]:
    """Two connected ends."""
    a_to_b: asyncio.Queue[bytes] = asyncio.Queue()
    b_to_a: asyncio.Queue[bytes] = asyncio.Queue()
    return MemoryTransport(b_to_a, a_to_b), MemoryTransport(a_to_b, b_to_a)
