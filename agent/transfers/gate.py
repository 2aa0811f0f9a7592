"""`TransferGate`: the asyncio face of `NodeLimits` (`agent.transfers.limits`), one per agent.

    async with gate.slot(node, "stage", subject, on_queued=hold) as transfer:
        ...  # move the bytes: transfer.source(stream) / transfer.sink(stream) keep the rate

`slot()` asks the limits for a ticket; a ticket that must wait is queued (FIFO per node), logged
(`transfer_queued`: node, kind, place in the queue), reported (`transfers_changed`), and
`on_queued()` is called once so the caller can tell its peer to hold back (a stage holds its
request's stream: `RequestContext.hold_stream`). The wait has no deadline, on purpose: nothing
times out because it waited its turn; a caller that goes away (its request cancelled) leaves
the queue and the node's next ticket moves. Leaving the block ends the ticket, however it ends.

The byte budget (`agent.transfers.budget`, one per agent): a transfer that moves gets its own
`Holding` of it (`Transfer.holding`, None without a budget), given back whole when the block
ends; the transfer draws its buffers through it.

The byte rate (`max_bytes_per_s_per_node`): `Transfer.source()` / `Transfer.sink()` wrap a
stream so that every chunk books its bytes first (`NodeLimits.reserve`) and waits its turn on
the gate's clock; without a rate they return the stream itself (nothing on the hot path). A
paced wait happens between two reads (or writes) of the stream, never inside one, so the
stream's stall deadline (`agent.session.streams`) does not count it: meanwhile the stream's
window fills and the peer is told `backpressure`, as with any slow consumer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Hashable

import structlog

from agent.clock import SYSTEM_CLOCK, Clock
from agent.observe import NULL_OBSERVER, TransferObserver
from agent.protocol.handlers import ByteSink, ByteSource
from agent.transfers.budget import ByteBudget, Holding
from agent.transfers.limits import NodeCounts, NodeLimits, Ticket, TransferKind, TransferView

__all__ = ["Transfer", "TransferGate"]

_log = structlog.get_logger("agent.transfers")


class TransferGate:
    """Per-node transfer slots and byte rate, on one clock."""

    def __init__(
        self,
        limits: NodeLimits,
        *,
        clock: Clock = SYSTEM_CLOCK,
        observer: TransferObserver = NULL_OBSERVER,
        budget: ByteBudget | None = None,
    ) -> None:
        self._limits = limits
        self.budget = budget
        self._clock = clock
        self._observer = observer
        self._waiters: dict[int, asyncio.Future[None]] = {}

    @property
    def limits(self) -> NodeLimits:
        """The limits this gate applies."""
        return self._limits

    @contextlib.asynccontextmanager
    async def slot(
        self,
        node: str,
        kind: TransferKind,
        subject: tuple[Hashable, ...],
        *,
        on_queued: Callable[[], None] | None = None,
    ) -> AsyncIterator[Transfer]:
        """Hold one of `node`'s transfer places for the block, waiting for it in turn."""
        limits, clock = self._limits, self._clock
        ticket, moving = limits.ask(node, kind, subject, clock.monotonic())
        try:
            self._report(node)
            if not moving:
                await self._wait(ticket, on_queued)
            waited = clock.monotonic() - ticket.asked_at
            self._observer.transfer_waited(kind=kind, seconds=waited)
            holding = None if self.budget is None else self.budget.holding()
            try:
                yield Transfer(self, ticket, holding)
            finally:
                if holding is not None:
                    holding.close()
        finally:
            for started in limits.leave(ticket, clock.monotonic()):
                waiter = self._waiters.get(started.number)
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)
            self._report(node)

    async def _wait(self, ticket: Ticket, on_queued: Callable[[], None] | None) -> None:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[ticket.number] = waiter
        counts = self._limits.counts().get(ticket.node, NodeCounts(0, 0))
        _log.info(
            "transfer_queued",
            node=ticket.node,
            kind=ticket.kind,
            position=self._limits.position(ticket),
            moving=counts.moving,
            limit=self._limits.max_per_node,
        )
        try:
            if on_queued is not None:
                on_queued()
            await waiter
        finally:
            del self._waiters[ticket.number]
        _log.info(
            "transfer_started",
            node=ticket.node,
            kind=ticket.kind,
            waited_s=round(self._clock.monotonic() - ticket.asked_at, 3),
        )

    async def pace(self, node: str, count: int) -> None:
        """Wait until `count` more bytes of `node` fit its byte rate (at once without one)."""
        delay = self._limits.reserve(node, count, self._clock.monotonic())
        if delay > 0:
            await self._clock.sleep(delay)

    def view(self) -> TransferView:
        """Every transfer and each node's counts, now."""
        return self._limits.view(self._clock.monotonic())

    def _report(self, node: str) -> None:
        counts = self._limits.counts().get(node, NodeCounts(0, 0))
        self._observer.transfers_changed(node=node, moving=counts.moving, queued=counts.queued)


class Transfer:
    """A moving transfer: its ticket, its share of the byte budget (`holding`, None without
    one), and the node's byte rate for its streams."""

    __slots__ = ("_gate", "holding", "ticket")

    def __init__(self, gate: TransferGate, ticket: Ticket, holding: Holding | None = None) -> None:
        self._gate = gate
        self.ticket = ticket
        self.holding = holding

    @property
    def paced(self) -> bool:
        """Whether the node has a byte rate (its streams are wrapped)."""
        return self._gate.limits.bytes_per_s is not None

    async def pace(self, count: int) -> None:
        """Wait until `count` more bytes fit the node's byte rate."""
        await self._gate.pace(self.ticket.node, count)

    def source(self, source: ByteSource) -> ByteSource:
        """`source`, each chunk paced by the node's rate (`source` itself without a rate)."""
        return _PacedSource(source, self) if self.paced else source

    def sink(self, sink: ByteSink) -> ByteSink:
        """`sink`, each write paced by the node's rate (`sink` itself without a rate)."""
        return _PacedSink(sink, self) if self.paced else sink


class _PacedSource:
    """A `ByteSource` whose every chunk waits for the node's rate before it is handed on."""

    def __init__(self, source: ByteSource, transfer: Transfer) -> None:
        self._source = source
        self._chunks: AsyncIterator[bytes] | None = None
        self._transfer = transfer

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        if self._chunks is None:
            self._chunks = aiter(self._source)
        chunk = await anext(self._chunks)
        await self._transfer.pace(len(chunk))
        return chunk

    async def aclose(self) -> None:
        """Stop the stream underneath."""
        await self._source.aclose()


class _PacedSink:
    """A `ByteSink` whose every write waits for the node's rate first."""

    def __init__(self, sink: ByteSink, transfer: Transfer) -> None:
        self._sink = sink
        self._transfer = transfer

    async def write(self, data: bytes) -> None:
        await self._transfer.pace(len(data))
        await self._sink.write(data)

    async def close(self) -> None:
        await self._sink.close()

    async def abort(self) -> None:
        await self._sink.abort()
