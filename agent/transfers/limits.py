"""Per-node transfer limits as data (pure: no asyncio, time only as `now`).

A *transfer* is every byte path between Cloudly and one node's Corestore that runs through the
agent: an isolated-restore stage, a database-closure export (backup) or import (restore).
`NodeLimits` decides, for each node on its own:

- **how many move at once** (`max_per_node`). `ask()` hands out a `Ticket`; it moves at once
  while fewer than `max_per_node` of its node move and nobody of its node waits, else it joins
  the end of its node's queue. `leave()` ends a ticket, queued or moving: a moving one's place
  goes to the first queued ticket of *its* node (FIFO; every node has its own queue, so a node's
  queue never holds up another node's transfers). What `leave()` returns are the tickets it let
  move, for the driver to wake;
- **how fast** (`bytes_per_s`, None: unbounded): one token bucket per node, shared by its moving
  transfers. `reserve(node, count, now)` books `count` bytes and says how long to wait before
  moving them. The bucket may go into debt: a reservation waits for every reservation booked
  before it, so the node's transfers take turns in the order they asked (each books its next
  chunk only after its previous wait), and none overtakes another. The bucket holds at most one
  second of the rate (`BURST_S`): a node that was quiet may take that much at once.

`entries()` is every ticket as the operator sees it (state, place in its queue, since when);
`counts()` the moving and queued tickets per node. Nothing here has a deadline: a queued ticket
waits as long as its node's earlier ones move.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Final, Literal

from agent.errors import InvalidState

__all__ = [
    "BURST_S",
    "DEFAULT_MAX_PER_NODE",
    "NodeCounts",
    "NodeLimits",
    "RateBucket",
    "Ticket",
    "TicketState",
    "TransferEntry",
    "TransferKind",
    "TransferView",
]

TransferKind = Literal["stage", "closure-export", "closure-import"]
TicketState = Literal["queued", "moving"]

DEFAULT_MAX_PER_NODE: Final = 2
"""`[corestore] max_transfers_per_node`'s default (docs/operations.md says why two)."""

BURST_S: Final = 1.0
"""How many seconds of its rate a node's bucket holds (what a quiet node may take at once)."""


@dataclass(frozen=True, slots=True)
class Ticket:
    """One transfer's claim on its node. `subject` names what moves (a restore's key, a relay
    job's key); `asked_at` is when it asked (the limiter's `now`)."""

    number: int
    node: str
    kind: TransferKind
    subject: tuple[Hashable, ...]
    asked_at: float


@dataclass(frozen=True, slots=True)
class TransferEntry:
    """A ticket as the operator sees it: `position` is its 1-based place in its node's queue
    (None once it moves), `since` when it asked (queued) or started moving."""

    ticket: Ticket
    state: TicketState
    position: int | None
    since: float


@dataclass(frozen=True, slots=True)
class NodeCounts:
    """How many transfers of one node move and wait."""

    moving: int
    queued: int


@dataclass(frozen=True, slots=True)
class TransferView:
    """What the operator sees of the transfers at one moment: every ticket (`entries`), each
    node's counts, the limits, and the limiter's time it was taken at (`now`)."""

    entries: list[TransferEntry]
    counts: dict[str, NodeCounts]
    max_per_node: int
    bytes_per_s: float | None
    now: float


@dataclass(slots=True)
class RateBucket:
    """A token bucket of `rate` bytes per second holding at most `BURST_S` seconds of it; it may
    go into debt, so reservations are served in the order they were made."""

    rate: float
    tokens: float
    updated: float

    @classmethod
    def full(cls, rate: float, now: float) -> RateBucket:
        """A bucket that may give its whole burst at once."""
        return cls(rate=rate, tokens=rate * BURST_S, updated=now)

    def reserve(self, count: int, now: float) -> float:
        """Book `count` bytes; the seconds to wait before moving them (0: at once)."""
        if now > self.updated:
            self.tokens = min(self.rate * BURST_S, self.tokens + (now - self.updated) * self.rate)
            self.updated = now
        self.tokens -= count
        return 0.0 if self.tokens >= 0 else -self.tokens / self.rate


@dataclass(slots=True)
class _Node:
    moving: dict[int, float] = field(default_factory=dict)  # ticket number -> started at
    queue: deque[Ticket] = field(default_factory=deque)
    bucket: RateBucket | None = None


class NodeLimits:
    """The transfers of every node: who moves, who waits, at what pace."""

    def __init__(
        self, max_per_node: int = DEFAULT_MAX_PER_NODE, bytes_per_s: float | None = None
    ) -> None:
        if isinstance(max_per_node, bool) or max_per_node < 1:
            raise InvalidState("max_per_node must be an integer of at least 1")
        if bytes_per_s is not None and not bytes_per_s > 0:
            raise InvalidState("bytes_per_s must be positive (None: no rate limit)")
        self.max_per_node = max_per_node
        self.bytes_per_s = bytes_per_s
        self._nodes: dict[str, _Node] = {}
        self._tickets: dict[int, Ticket] = {}
        self._numbers = 0

    # --- slots ---------------------------------------------------------------------------------

    def ask(
        self, node: str, kind: TransferKind, subject: tuple[Hashable, ...], now: float
    ) -> tuple[Ticket, bool]:
        """A new ticket for a transfer to `node`, and whether it moves now (else it is queued
        behind every earlier ticket of `node`)."""
        self._numbers += 1
        ticket = Ticket(self._numbers, node, kind, subject, now)
        self._tickets[ticket.number] = ticket
        state = self._nodes.setdefault(node, _Node())
        if not state.queue and len(state.moving) < self.max_per_node:
            state.moving[ticket.number] = now
            return ticket, True
        state.queue.append(ticket)
        return ticket, False

    def leave(self, ticket: Ticket, now: float) -> list[Ticket]:
        """End `ticket` (moving, or given up while queued); returns the queued tickets of its
        node that move from now on, oldest first. Leaving twice changes nothing."""
        if self._tickets.pop(ticket.number, None) is None:
            return []
        state = self._nodes[ticket.node]
        if state.moving.pop(ticket.number, None) is None:
            state.queue.remove(ticket)
        started: list[Ticket] = []
        while state.queue and len(state.moving) < self.max_per_node:
            head = state.queue.popleft()
            state.moving[head.number] = now
            started.append(head)
        if not state.moving and not state.queue and state.bucket is None:
            del self._nodes[ticket.node]  # a node without transfers keeps nothing
        return started

    def moving(self, ticket: Ticket) -> bool:
        """Whether `ticket` moves (False while it is queued, or once it left)."""
        state = self._nodes.get(ticket.node)
        return state is not None and ticket.number in state.moving

    def position(self, ticket: Ticket) -> int | None:
        """`ticket`'s 1-based place in its node's queue; None unless it is queued."""
        state = self._nodes.get(ticket.node)
        if state is None:
            return None
        for index, queued in enumerate(state.queue, start=1):
            if queued.number == ticket.number:
                return index
        return None

    # --- rate ----------------------------------------------------------------------------------

    def reserve(self, node: str, count: int, now: float) -> float:
        """Book `count` bytes of `node`'s rate; the seconds to wait before moving them (always 0
        without a rate)."""
        if self.bytes_per_s is None or count <= 0:
            return 0.0
        state = self._nodes.setdefault(node, _Node())
        if state.bucket is None:
            state.bucket = RateBucket.full(self.bytes_per_s, now)
        return state.bucket.reserve(count, now)

    # --- what the operator sees ----------------------------------------------------------------

    def entries(self) -> list[TransferEntry]:
        """Every ticket: per node (by name) its moving ones (oldest first), then its queue."""
        found: list[TransferEntry] = []
        for node in sorted(self._nodes):
            state = self._nodes[node]
            for number, started in state.moving.items():
                found.append(TransferEntry(self._tickets[number], "moving", None, started))
            for index, ticket in enumerate(state.queue, start=1):
                found.append(TransferEntry(ticket, "queued", index, ticket.asked_at))
        return found

    def view(self, now: float) -> TransferView:
        """Every ticket, each node's counts and the limits, at `now`."""
        return TransferView(self.entries(), self.counts(), self.max_per_node, self.bytes_per_s, now)

    def counts(self) -> dict[str, NodeCounts]:
        """Moving and queued transfers per node with any."""
        return {
            node: NodeCounts(len(state.moving), len(state.queue))
            for node, state in sorted(self._nodes.items())
            if state.moving or state.queue
        }
