"""The ping rule on a `Peer`: a request arrives at the count of the peer's messages read; a
handler's answer is written with a ping right behind it, and that ping's pong delivers it;
what no pong confirmed before the connection ended is never delivered."""

from __future__ import annotations

import asyncio
from typing import Any

from agent.protocol.delivery import Mark
from agent.protocol.handlers import RequestContext, Routes
from agent.session.delivery import DeliveryTracker
from agent.session.peer import Peer
from agent.session.transport import Pong
from tests.memory import MemoryTransport, transport_pair
from tests.session._helpers import FAST, body_route


class _Pending:
    def __init__(self, pong: asyncio.Future[Pong]) -> None:
        self._pong = pong

    async def answer(self) -> Pong:
        return await self._pong


class _Pings:
    """Writes a ping into the transport's record (after the frames before it) and answers it
    when the test says `pong(after)`."""

    def __init__(self, transport: MemoryTransport) -> None:
        self._transport = transport
        self.waiting: list[asyncio.Future[Pong]] = []

    async def start_ping(self) -> _Pending:
        self._transport.sent.append(b"<ping>")
        pong: asyncio.Future[Pong] = asyncio.get_running_loop().create_future()
        self.waiting.append(pong)
        return _Pending(pong)

    def pong(self, after: int) -> None:
        for waiter in self.waiting:
            waiter.set_result(Pong(0.001, after))
        self.waiting.clear()


async def _served(
    handler: Any, *, connection: int = 7
) -> tuple[Peer, Peer, MemoryTransport, _Pings, DeliveryTracker, list[asyncio.Task[Any]]]:
    left_end, right_end = transport_pair()
    right_end.record = True
    pings = _Pings(right_end)
    tracker = DeliveryTracker(connection, pings)
    left = Peer(left_end, Routes(), settings=FAST)
    right = Peer(right_end, Routes([body_route("ask", handler)]), settings=FAST, deliveries=tracker)
    runs = [asyncio.create_task(left.run()), asyncio.create_task(right.run())]
    return left, right, right_end, pings, tracker, runs


async def _close(left_end: Any, runs: list[asyncio.Task[Any]]) -> None:
    left_end.close()
    await asyncio.wait(runs)
    for run in runs:
        run.exception()


async def test_an_answer_is_followed_by_a_ping_whose_pong_delivers_it() -> None:
    """The answer frame, then at once the ping; its pong, read after the peer's 3rd message,
    delivers the answer there; the request arrived as the peer's 2nd message."""
    delivered: list[Mark] = []
    arrivals: list[Mark] = []

    async def ask(body: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        arrivals.append(ctx.arrival)
        ctx.on_delivered(delivered.append)
        return {"answer": body["n"]}

    left, _, right_end, pings, tracker, runs = await _served(ask)
    try:
        await left.call("ask", {"n": 1}, timeout=5)
        assert await left.call("ask", {"n": 2}, timeout=5) == {"answer": 2}
        assert right_end.sent[-1] == b"<ping>"
        assert b'"answer":2' in right_end.sent[-2]
        assert delivered == []
        pings.pong(after=3)
        await tracker.settled()
    finally:
        await _close(right_end, runs)
    assert arrivals == [Mark(7, 1), Mark(7, 2)]
    assert delivered == [Mark(7, 3), Mark(7, 3)]


async def test_an_answer_not_confirmed_when_the_connection_ends_is_never_delivered() -> None:
    """The connection ends before the pong: the answer is decided lost (a waiter on the
    tracker is released) and its callback never runs, not even for a late pong."""
    delivered: list[Mark] = []

    async def ask(body: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        ctx.on_delivered(delivered.append)
        return {}

    left, _, right_end, pings, tracker, runs = await _served(ask)
    try:
        await left.call("ask", {}, timeout=5)
        tracker.lost()
        await tracker.settled()
        pings.pong(after=1)
        await asyncio.sleep(0)
    finally:
        await _close(right_end, runs)
    assert delivered == []


async def test_a_handler_that_asks_for_no_delivery_costs_no_ping() -> None:
    """Answers nobody waits to know delivered are written alone."""

    async def ask(body: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        return {}

    left, _, right_end, _, _, runs = await _served(ask)
    try:
        await left.call("ask", {}, timeout=5)
    finally:
        await _close(right_end, runs)
    assert b"<ping>" not in right_end.sent
