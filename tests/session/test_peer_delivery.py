"""The ping rule on a `Peer`: a request arrives at its connection's mark; a
handler's answer goes out with a ping right behind it, in the same write, and that ping's pong
delivers it; what no pong confirmed before the connection ended is never delivered."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from agent.protocol.delivery import Mark
from agent.protocol.handlers import RequestContext, Routes
from agent.session.delivery import DeliveryTracker
from agent.session.peer import Peer
from agent.session.transport import Pong
from tests.memory import MemoryTransport, transport_pair
from tests.session._helpers import FAST, body_route

_PING = b"<ping>"


class _Pending:
    def __init__(self, pong: asyncio.Future[Pong]) -> None:
        self._pong = pong

    async def answer(self) -> Pong:
        return await self._pong


class _Wire:
    """The served peer's side of the connection, write by write: its transport's `send` is one
    write of one frame, `send_then_ping` one write of its frames and a ping (delivered to the
    other end as they come); each ping is answered when the test says `pong()`."""

    def __init__(self, served_end: MemoryTransport, other_end: MemoryTransport) -> None:
        self._other_end = other_end
        self.writes: list[list[bytes]] = []
        self.waiting: list[asyncio.Future[Pong]] = []
        served_end.on_send = self._sent

    def _sent(self, frame: bytes) -> bytes:
        self.writes.append([frame])
        return frame

    async def send_then_ping(self, frames: Sequence[bytes]) -> _Pending:
        self.writes.append([*frames, _PING])
        for frame in frames:
            self._other_end.inject(frame)
        pong: asyncio.Future[Pong] = asyncio.get_running_loop().create_future()
        self.waiting.append(pong)
        return _Pending(pong)

    def pong(self) -> None:
        for waiter in self.waiting:
            waiter.set_result(Pong(0.001))
        self.waiting.clear()


async def _heard(delivered: list[Mark], more: asyncio.Event, count: int) -> None:
    """Return once `delivered` holds `count` marks (`more` is set as each comes)."""
    while len(delivered) < count:
        more.clear()
        await more.wait()


async def _served(
    handler: Any, *, connection: int = 7
) -> tuple[Peer, Peer, MemoryTransport, _Wire, DeliveryTracker, list[asyncio.Task[Any]]]:
    left_end, right_end = transport_pair()
    wire = _Wire(right_end, left_end)
    tracker = DeliveryTracker(connection, wire)
    left = Peer(left_end, Routes(), settings=FAST)
    right = Peer(right_end, Routes([body_route("ask", handler)]), settings=FAST, deliveries=tracker)
    runs = [asyncio.create_task(left.run()), asyncio.create_task(right.run())]
    return left, right, right_end, wire, tracker, runs


async def _close(left_end: Any, runs: list[asyncio.Task[Any]]) -> None:
    left_end.close()
    await asyncio.wait(runs)
    for run in runs:
        run.exception()


async def test_an_answer_is_followed_by_a_ping_whose_pong_delivers_it() -> None:
    """The answer frame, then at once the ping; its pong delivers the answer on the connection
    the request arrived on."""
    delivered: list[Mark] = []
    arrivals: list[Mark] = []
    more = asyncio.Event()

    def on_delivered(mark: Mark) -> None:
        delivered.append(mark)
        more.set()

    async def ask(body: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        arrivals.append(ctx.arrival)
        ctx.on_delivered(on_delivered)
        return {"answer": body["n"]}

    left, _, right_end, wire, _, runs = await _served(ask)
    try:
        await left.call("ask", {"n": 1}, timeout=5)
        assert await left.call("ask", {"n": 2}, timeout=5) == {"answer": 2}
        *_, answer, ping = wire.writes[-1]
        assert (b'"answer":2' in answer, ping) == (True, _PING)
        assert delivered == []
        wire.pong()
        await _heard(delivered, more, 2)
    finally:
        await _close(right_end, runs)
    assert arrivals == [Mark(7), Mark(7)]
    assert delivered == [Mark(7), Mark(7)]


async def test_an_answer_not_confirmed_when_the_connection_ends_is_never_delivered() -> None:
    """The connection ends before the pong: the answer is decided lost and its
    callback never runs, not even for a late pong."""
    delivered: list[Mark] = []

    async def ask(body: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        ctx.on_delivered(delivered.append)
        return {}

    left, _, right_end, wire, tracker, runs = await _served(ask)
    try:
        await left.call("ask", {}, timeout=5)
        tracker.lost()
        wire.pong()
        await asyncio.sleep(0)
    finally:
        await _close(right_end, runs)
    assert delivered == []


async def test_a_handler_that_asks_for_no_delivery_costs_no_ping() -> None:
    """Answers nobody waits to know delivered are written alone."""

    async def ask(body: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        return {}

    left, _, right_end, wire, _, runs = await _served(ask)
    try:
        await left.call("ask", {}, timeout=5)
    finally:
        await _close(right_end, runs)
    assert wire.writes
    assert all(_PING not in write for write in wire.writes)


async def test_the_answer_and_its_ping_go_out_in_one_write() -> None:
    """The flush that writes an answer whose delivery is awaited hands its frames and the ping
    to the socket together: no write of the answer alone, no write of the ping alone."""

    async def ask(body: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        ctx.on_delivered(lambda mark: None)
        return {"answer": 1}

    left, _, right_end, wire, _, runs = await _served(ask)
    try:
        await left.call("ask", {}, timeout=5)
    finally:
        await _close(right_end, runs)
    [carrying] = [write for write in wire.writes if any(b'"answer":1' in f for f in write)]
    assert carrying[-1] == _PING
    assert [_PING] not in wire.writes


async def test_the_confirming_ping_is_numbered_after_its_answers_are_handed_out() -> None:
    """The ledger hands the answer out and numbers its ping before the write: the pong of that
    ping (number 1, the first) delivers it, and a keepalive ping numbered after it is 2."""
    delivered: list[Mark] = []

    async def ask(body: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        ctx.on_delivered(delivered.append)
        return {}

    left, _, right_end, wire, tracker, runs = await _served(ask, connection=3)
    try:
        await left.call("ask", {}, timeout=5)
        assert tracker.ping() == 2
        tracker.ponged(1)
    finally:
        await _close(right_end, runs)
    assert (delivered, len(wire.waiting)) == ([Mark(3)], 1)
