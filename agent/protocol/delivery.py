"""The ping rule: which of our answers the peer is known to have received (sans-I/O).

An answer (a response or an error to a request the peer made) is *delivered* once a websocket
ping sent after it was answered by a pong: frames travel in order on one connection, and the
peer's websocket answers a ping only after it read every frame before it. A connection that
ends first leaves the answers it carried undelivered for good: the agent cannot know whether
they arrived, and treats them as lost.

Where things stand on the session is a `Mark`: the number of the connection a request arrived
on, or an answer was delivered on. Connections are numbered from 1.

What a pong proves is narrow: the peer's *websocket* read the answer. It says nothing about
when the peer's *code* read it (a `ws` peer may hand the answer to its code, let it send a
request, and only then read the ping: it depends on how the network splits the bytes and on
`allowSynchronousEvents`). So the relay's verdict uses only the connection a request arrived
on and whether a pong confirmed an answer (`agent.domain.answer_fate`), never when.

`Deliveries` is the ledger of one connection, driven by its peer and its keepalive:

    answered(tickets)   answers just handed to the websocket, in order, each with its ticket
    ping()              a ping goes out now: it covers every answer so far; its number
    pong(n)             the pong of ping n arrived: every answer a ping up to n covered is
                        delivered at Mark(connection)
    lost()              the connection ended: what no pong confirmed never will be

A ticket is whatever the driver wants back (a callback); the ledger only keeps them in order.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Generic, TypeVar

from agent.errors import InvalidState

__all__ = ["Deliveries", "Mark"]

T = TypeVar("T")


@dataclass(frozen=True, order=True, slots=True)
class Mark:
    """A point on the session: the connection (numbered from 1) a request arrived on, or an
    answer was delivered on."""

    connection: int


class Deliveries(Generic[T]):
    """The ping rule's ledger for one connection (module docstring)."""

    def __init__(self, connection: int) -> None:
        if connection < 1:
            raise InvalidState("connections are numbered from 1")
        self.connection = connection
        self._unpinged: list[T] = []
        self._pings: deque[tuple[int, list[T]]] = deque()
        self._next_ping = 1
        self._lost = False

    def answered(self, tickets: list[T]) -> None:
        """Answers just handed to the websocket (after every frame before them)."""
        if not self._lost:
            self._unpinged.extend(tickets)

    def ping(self) -> int:
        """A ping goes out now; its number (it covers every answer handed out so far)."""
        number = self._next_ping
        self._next_ping += 1
        covered, self._unpinged = self._unpinged, []
        self._pings.append((number, covered))
        return number

    def pong(self, number: int) -> list[tuple[T, Mark]]:
        """The pong of ping `number`: the answers its ping and every earlier one covered, each
        with where it was delivered. A pong of an unknown ping (a late one, or the peer's own)
        delivers nothing."""
        delivered: list[tuple[T, Mark]] = []
        mark = Mark(self.connection)
        while self._pings and self._pings[0][0] <= number:
            _, covered = self._pings.popleft()
            delivered.extend((ticket, mark) for ticket in covered)
        return delivered

    def lost(self) -> list[T]:
        """The connection ended: every answer no pong confirmed, in order (never delivered)."""
        self._lost = True
        pending = [ticket for _, covered in self._pings for ticket in covered]
        pending += self._unpinged
        self._pings.clear()
        self._unpinged = []
        return pending
