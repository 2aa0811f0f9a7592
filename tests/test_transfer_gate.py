"""`TransferGate`, the asyncio face of the per-node limits: waiting in turn without a deadline,
giving up a place in the queue, the byte rate on the gate's clock, what it reports."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from agent.transfers import NodeLimits, TransferGate
from tests.clock import ManualClock, advancing


class Recorder:
    """A `TransferObserver` that keeps what it is told."""

    def __init__(self) -> None:
        self.changes: list[tuple[str, int, int]] = []
        self.waits: list[tuple[str, float]] = []

    def transfers_changed(self, *, node: str, moving: int, queued: int) -> None:
        self.changes.append((node, moving, queued))

    def transfer_waited(self, *, kind: str, seconds: float) -> None:
        self.waits.append((kind, seconds))


async def settle() -> None:
    """Let every ready task run until none is (no time passes)."""
    for _ in range(20):
        await asyncio.sleep(0)


class Pieces:
    """A byte source of `count` pieces of `size` bytes."""

    def __init__(self, count: int, size: int) -> None:
        self.count, self.size = count, size
        self.closed = False

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._pieces()

    async def _pieces(self) -> AsyncIterator[bytes]:
        for _ in range(self.count):
            yield bytes(self.size)

    async def aclose(self) -> None:
        self.closed = True


async def test_a_transfer_beyond_the_limit_waits_for_an_earlier_one_of_its_node() -> None:
    """The second transfer of a one-place node is queued (told once: `on_queued`) and moves as
    soon as the first leaves; an hour of waiting times nothing out."""
    clock = ManualClock()
    gate = TransferGate(NodeLimits(1), clock=clock)
    first_done = asyncio.Event()
    order: list[str] = []
    held: list[str] = []

    async def transfer(name: str, until: asyncio.Event | None) -> None:
        async with gate.slot("n1", "stage", ("restore", name), on_queued=lambda: held.append(name)):
            order.append(name)
            if until is not None:
                await until.wait()

    first = asyncio.create_task(transfer("a", first_done))
    await settle()
    second = asyncio.create_task(transfer("b", None))
    await settle()
    assert (order, held) == (["a"], ["b"])
    clock.advance(3600.0)
    await settle()
    assert order == ["a"]
    first_done.set()
    await asyncio.gather(first, second)
    assert order == ["a", "b"]


async def test_a_queued_transfer_that_is_cancelled_gives_its_turn_to_the_next() -> None:
    """Cancelling a waiting transfer (its request went away) takes it out of the queue: the one
    behind it moves when the place frees."""
    gate = TransferGate(NodeLimits(1), clock=ManualClock())
    release = asyncio.Event()
    moved: list[str] = []

    async def transfer(name: str) -> None:
        async with gate.slot("n1", "stage", ("restore", name)):
            moved.append(name)
            await release.wait()

    tasks = {name: asyncio.create_task(transfer(name)) for name in "abc"}
    await settle()
    tasks["b"].cancel()
    await settle()
    assert [e.ticket.subject[1] for e in gate.view().entries] == ["a", "c"]
    release.set()
    await asyncio.gather(tasks["a"], tasks["c"])
    assert moved == ["a", "c"]
    assert tasks["b"].cancelled()
    assert gate.view().entries == []


async def test_a_paced_source_moves_no_faster_than_the_nodes_rate() -> None:
    """With 1 MB/s, ten 0.5 MB chunks through `Transfer.source` wait, on the gate's clock, for
    all but the one-second burst: 4 s in all."""
    clock = ManualClock()
    gate = TransferGate(NodeLimits(2, bytes_per_s=1_000_000), clock=clock)
    source = Pieces(10, 500_000)
    received = 0

    async def read() -> None:
        nonlocal received
        async with gate.slot("n1", "stage", ("restore", "a")) as transfer:
            async for chunk in transfer.source(source):
                received += len(chunk)

    async with advancing(clock):
        await read()
    assert received == 5_000_000
    assert sum(clock.slept) == pytest.approx(4.0)


async def test_without_a_rate_the_streams_are_not_wrapped() -> None:
    """No byte rate: `Transfer.source`/`sink` hand back the stream itself."""
    gate = TransferGate(NodeLimits(2), clock=ManualClock())
    source = Pieces(1, 1)
    async with gate.slot("n1", "stage", ("restore", "a")) as transfer:
        assert transfer.source(source) is source


async def test_closing_a_paced_source_closes_the_stream_underneath() -> None:
    """`aclose()` reaches the source it wraps (the closure import stops its stream so)."""
    gate = TransferGate(NodeLimits(2, bytes_per_s=1e9), clock=ManualClock())
    source = Pieces(3, 1)
    async with gate.slot("n1", "closure-import", ("job", "x")) as transfer:
        paced = transfer.source(source)
        await paced.aclose()  # type: ignore[attr-defined]
    assert source.closed


async def test_the_gate_reports_each_nodes_counts_and_each_wait() -> None:
    """The observer hears the moving and queued counts after every change, and how long each
    transfer waited (0 when it did not)."""
    clock = ManualClock()
    recorder = Recorder()
    gate = TransferGate(NodeLimits(1), clock=clock, observer=recorder)
    release = asyncio.Event()

    async def transfer(name: str) -> None:
        async with gate.slot("n1", "closure-export", ("job", name)):
            await release.wait()

    tasks = [asyncio.create_task(transfer(name)) for name in "ab"]
    await settle()
    clock.advance(5.0)
    release.set()
    await asyncio.gather(*tasks)
    assert recorder.changes == [("n1", 1, 0), ("n1", 1, 1), ("n1", 1, 0), ("n1", 0, 0)]
    assert recorder.waits == [("closure-export", 0.0), ("closure-export", 5.0)]
