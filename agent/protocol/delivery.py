"""The ping rule: which of our answers the peer is known to have received (sans-I/O).

An answer (a response or an error to a request the peer made) is *delivered* once a websocket
ping sent after it was answered by a pong: frames travel in order on one connection, and the
peer's websocket answers a ping only after it read every frame before it. A connection that
ends first leaves the answers it carried undelivered for good: the agent cannot know whether
they arrived, and treats them as lost.

Where things stand on the session is a `Mark` (connection number, message count): a request
arrives as the `message`-th message the peer sent on that connection (counted in the order the
websocket read them); a delivery is known from a pong read after `message` of the peer's
messages. Connections are numbered from 1.

What a pong proves is narrow: the peer's *websocket* read the answer. It says nothing about
when the peer's *code* read it (a `ws` peer may hand the answer to its code, let it send a
request, and only then read the ping: it depends on how the network splits the bytes and on
`allowSynchronousEvents`). So the relay's verdict never compares a pong's mark with a
request's arrival; it uses a confirmation only for an answer whose connection ended
(`agent.domain.answer_fate`).

`Deliveries` is the ledger of one connection, driven by its peer and its keepalive:

    answered(tickets)   answers just handed to the websocket, in order, each with its ticket
    wanted              some answer waits for a ping
    ping()              a ping goes out now: it covers every answer so far; its number
    pong(n, after)      the pong of ping n arrived after `after` of the peer's messages: every
                        answer a ping up to n covered is delivered at Mark(connection, after)
    lost()              the connection ended: what no pong confirmed never will be
    horizon()/settled(h) whether every answer handed out before `horizon()` was decided
                        (delivered or lost)

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
    """A point on the session: the `message`-th message the peer sent on connection
    `connection` (a request's arrival), or a pong read after `message` of them (a delivery)."""

    connection: int
    message: int


class Deliveries(Generic[T]):
    """The ping rule's ledger for one connection (module docstring)."""

    def __init__(self, connection: int) -> None:
        if connection < 1:
            raise InvalidState("connections are numbered from 1")
        self.connection = connection
        self._unpinged: list[T] = []
        self._pings: deque[tuple[int, list[T]]] = deque()
        self._next_ping = 1
        self._handed = 0  # answers handed out so far
        self._decided = 0  # of those, how many were delivered or lost (a prefix)
        self._in_pings = 0  # answers waiting in `_pings`
        self._lost = False

    @property
    def wanted(self) -> bool:
        """Some answer waits for a ping."""
        return bool(self._unpinged) and not self._lost

    def answered(self, tickets: list[T]) -> None:
        """Answers just handed to the websocket (after every frame before them)."""
        self._handed += len(tickets)
        if self._lost:
            self._decided += len(tickets)
            return
        self._unpinged.extend(tickets)

    def ping(self) -> int:
        """A ping goes out now; its number (it covers every answer handed out so far)."""
        number = self._next_ping
        self._next_ping += 1
        covered, self._unpinged = self._unpinged, []
        self._in_pings += len(covered)
        self._pings.append((number, covered))
        return number

    def pong(self, number: int, *, after: int) -> list[tuple[T, Mark]]:
        """The pong of ping `number`, read after `after` of the peer's messages: the answers
        its ping and every earlier one covered, each with where it was delivered. A pong of an
        unknown ping (a late one, or the peer's own) delivers nothing."""
        delivered: list[tuple[T, Mark]] = []
        mark = Mark(self.connection, after)
        while self._pings and self._pings[0][0] <= number:
            _, covered = self._pings.popleft()
            self._in_pings -= len(covered)
            self._decided += len(covered)
            delivered.extend((ticket, mark) for ticket in covered)
        return delivered

    def lost(self) -> list[T]:
        """The connection ended: every answer no pong confirmed, in order (never delivered)."""
        self._lost = True
        pending = [ticket for _, covered in self._pings for ticket in covered]
        pending += self._unpinged
        self._pings.clear()
        self._unpinged = []
        self._in_pings = 0
        self._decided = self._handed
        return pending

    def horizon(self) -> int:
        """How many answers were handed out so far (pass it to `settled`)."""
        return self._handed

    def settled(self, horizon: int) -> bool:
        """Whether the first `horizon` answers were decided: delivered or lost."""
        return self._decided >= horizon
