"""The peer with the connection's request classes: Cloudly keeps control while every stream
seat is taken, a status answered from memory needs no seat, and the seats and deferrals are
reported to the peer's observer."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from agent.contracts.base import WireModel
from agent.errors import SessionClosed
from agent.protocol.admission import stream_class
from agent.protocol.connection import ConnectionSettings
from agent.protocol.handlers import RequestContext, Route, Routes
from agent.session.peer import Peer
from tests.memory import MemoryTransport, transport_pair
from tests.session._helpers import FAST


class _Node(WireModel):
    node: str


class _Found(WireModel):
    found: bool


class Recording:
    """A `PeerObserver` that keeps what it was told about seats and deferrals."""

    def __init__(self) -> None:
        self.seated: list[tuple[str, int]] = []
        self.deferred: list[tuple[str, int]] = []

    def request_handled(self, *, method: str, code: str, seconds: float) -> None:
        pass

    def stream_bytes(self, *, direction: str, count: int) -> None:
        pass

    def requests_seated(self, *, request_class: str, count: int) -> None:
        self.seated.append((request_class, count))

    def requests_deferred(self, *, request_class: str, count: int) -> None:
        self.deferred.append((request_class, count))


class Cluster:
    """Routes of a stage that waits until released, a control call that does too, and a
    status answered from memory (or, when `in_memory` is False, by its handler)."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.in_memory = True

    async def stage(self, request: _Node, ctx: RequestContext) -> _Found:
        await self.release.wait()
        return _Found(found=True)

    async def status(self, request: _Node, ctx: RequestContext) -> _Found:
        return _Found(found=False)

    def status_now(self, request: _Node) -> _Found | None:
        return _Found(found=True) if self.in_memory else None

    def routes(self) -> Routes:
        return Routes(
            [
                Route("stage", _Node, self.stage, admission=stream_class("node")),
                Route("prepare", _Node, self.stage),
                Route("status", _Node, self.status, answer_now=self.status_now),
            ]
        )


def frame(method: str, node: str, corr: str) -> bytes:
    return orjson.dumps(
        {
            "method": method,
            "request": {"node": node},
            "response": None,
            "correlation": {"id": corr, "phase": "request"},
        }
    )


async def serve(
    cluster: Cluster, settings: ConnectionSettings, observer: Recording | None = None
) -> tuple[MemoryTransport, asyncio.Task[None]]:
    ours, theirs = transport_pair()
    peer = Peer(ours, cluster.routes(), settings=settings, observer=observer or Recording())
    return theirs, asyncio.create_task(peer.run())


async def stop(end: MemoryTransport, run: asyncio.Task[None]) -> None:
    end.close()
    with pytest.raises(SessionClosed):
        await run


def limits(**bounds: int) -> ConnectionSettings:
    settings = {"busy_retry_ms": 100, **bounds}
    return ConnectionSettings(streams=FAST.streams, receive_budget=FAST.receive_budget, **settings)


async def test_a_status_is_answered_while_every_stream_and_control_seat_is_taken() -> None:
    """Stages fill the stream seats, slow control calls the control seats: a status read
    from memory is still answered, at once."""
    cluster = Cluster()
    raw, run = await serve(cluster, limits(max_concurrent_requests=2, max_stream_requests=4))
    for number in range(4):
        await raw.send(frame("stage", f"node-{number}", f"s{number}"))
    for number in range(2):
        await raw.send(frame("prepare", "node-0", f"p{number}"))
    await raw.send(frame("status", "node-0", "status"))
    answer = orjson.loads(await raw.recv())
    assert (answer["correlation"]["id"], answer["response"]) == ("status", {"found": True})
    cluster.release.set()
    await stop(raw, run)


async def test_one_nodes_flood_leaves_another_nodes_status_and_stage_their_answers() -> None:
    """A node floods stages past its share: its extra stages are deferred as stream
    requests, while another node's stage is let in and its status answered."""
    cluster, observer = Cluster(), Recording()
    settings = limits(max_stream_requests=16, max_stream_requests_per_node=3)
    raw, run = await serve(cluster, settings, observer)
    for number in range(10):
        await raw.send(frame("stage", "node-a", f"a{number}"))
    await raw.send(frame("stage", "node-b", "b0"))
    await raw.send(frame("status", "node-b", "status"))
    answers = [orjson.loads(await raw.recv()) for _ in range(8)]
    deferred = [a["correlation"]["id"] for a in answers if "retry" in a]
    assert deferred == [f"a{number}" for number in range(3, 10)]
    [status] = [a for a in answers if "retry" not in a]
    assert (status["correlation"]["id"], status["response"]) == ("status", {"found": True})
    assert observer.seated[-1] == ("stream", 4)
    cluster.release.set()
    await stop(raw, run)


async def test_a_status_its_handler_answers_is_deferred_when_control_is_full() -> None:
    """Not in memory, control seats all taken: the status is answered `retry`, as control."""
    cluster, observer = Cluster(), Recording()
    cluster.in_memory = False
    raw, run = await serve(cluster, limits(max_concurrent_requests=1), observer)
    await raw.send(frame("prepare", "node-0", "p0"))
    await raw.send(frame("status", "node-0", "status"))
    answer = orjson.loads(await raw.recv())
    assert answer["correlation"]["id"] == "status"
    assert "control requests" in answer["retry"]["reason"]
    assert observer.deferred == [("control", 1)]
    cluster.release.set()
    await stop(raw, run)


async def test_the_peer_reports_each_class_seats_and_deferrals() -> None:
    """The observer hears every change of a class's seats, and each deferral by class."""
    cluster, observer = Cluster(), Recording()
    raw, run = await serve(cluster, limits(max_stream_requests=1), observer)
    await raw.send(frame("stage", "node-a", "s0"))
    await raw.send(frame("stage", "node-b", "s1"))
    await raw.recv()  # s1: retry
    cluster.release.set()
    done = orjson.loads(await raw.recv())
    assert done["correlation"]["id"] == "s0"
    assert observer.seated == [("stream", 1), ("stream", 0)]
    assert observer.deferred == [("stream", 1)]
    await stop(raw, run)
