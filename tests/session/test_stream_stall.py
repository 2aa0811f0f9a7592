"""The stall deadline of a `Peer`'s streams: a stream kept alive by keep-alives while it moves
no chunk breaks after `stall_timeout`, on either side and in either direction.

Timing is scaled, not slept: the keep-alive timeout is 0.3 s (`SETTINGS`) and the stall
deadline 1 s, so a stream that outlives several keep-alive timeouts and then breaks with the
stall's reason was kept alive by keep-alives and ended by the deadline alone. Every test is
bounded by `asyncio.timeout(10)`: without the deadline it would wait forever. The deadline is
read on the peer's clock: moved by hand, it fires when the clock passes it, not in real time.
"""

from __future__ import annotations

import asyncio

import pytest

from agent.contracts.base import StreamMarker, WireModel
from agent.errors import CallFailed, StreamBroken
from agent.protocol.connection import ConnectionSettings, StreamSettings
from agent.protocol.handlers import ByteSink, ByteSource, RequestContext, Route, Routes
from tests.clock import ManualClock
from tests.session._helpers import peers

STALL = 1.0
SETTINGS = ConnectionSettings(
    streams=StreamSettings(park_timeout=0.05, idle_timeout=0.3, probe_interval=0.005)
)


class Upload(WireModel):
    data: StreamMarker


class Size(WireModel):
    size: int


class Nothing(WireModel):
    pass


class Download(WireModel):
    data: StreamMarker


async def forever() -> None:
    """Wait until cancelled (a peer that stops moving bytes but keeps its stream)."""
    await asyncio.Event().wait()


def reading_router(reads: int) -> Routes:
    """`upload {data}`: reads `reads` chunks (all of them when negative), then waits."""

    async def upload(request: Upload, ctx: RequestContext) -> Size:
        size, taken = 0, 0
        async for chunk in ctx.receive_stream(request.data):
            size, taken = size + len(chunk), taken + 1
            if taken == reads:
                await forever()
        return Size(size=size)

    return Routes([Route("upload", Upload, upload)])


async def test_a_handler_whose_sender_goes_quiet_is_refused_transfer_interrupted() -> None:
    """The caller sends one chunk and then only keep-alives: the handler's source breaks after
    the stall deadline, and the request is refused `transfer-interrupted`, retryable."""
    async with (
        asyncio.timeout(10),
        peers(Routes(), reading_router(-1), SETTINGS, stall_timeout=STALL) as (left, *_),
    ):
        marker, sink = left.open_send_stream()
        call = asyncio.create_task(left.call("upload", {"data": marker.to_wire()}, timeout=30))
        await sink.write(b"x" * 1000)
        with pytest.raises(CallFailed) as refused:
            await call
    assert refused.value.error_data == {"code": "transfer-interrupted", "retryable": True}
    assert f"no chunk from the peer within {STALL:g} s" in refused.value.text


async def test_a_reader_whose_producer_goes_quiet_breaks_after_the_deadline() -> None:
    """A download whose producer writes one chunk and then nothing: the caller's source raises
    `StreamBroken` naming the stall, after the first chunk arrived."""

    async def download(request: Nothing, ctx: RequestContext) -> Download:
        async def produce(sink: ByteSink) -> None:
            await sink.write(b"y" * 1000)
            await forever()

        marker, _ = ctx.open_send_stream(produce)
        return Download(data=marker)

    router = Routes([Route("download", Nothing, download)])
    received: list[bytes] = []

    async def read(source: ByteSource) -> None:
        async for piece in source:
            received.append(piece)

    async with (
        asyncio.timeout(10),
        peers(Routes(), router, SETTINGS, stall_timeout=STALL) as (left, *_),
    ):
        reply = await left.call("download", {}, timeout=5)
        source = left.receive_stream(StreamMarker.from_wire(reply["data"]))
        with pytest.raises(StreamBroken, match="no chunk from the peer within 1 s"):
            await read(source)
    assert received == [b"y" * 1000]


async def test_a_writer_whose_reader_stops_reading_breaks_when_the_window_stays_full() -> None:
    """The handler reads one chunk and then stops (the stream stays alive): the caller's sink
    waits for room and raises `StreamBroken` once the stall deadline passed."""
    written = 0

    async def write_forever(sink: ByteSink) -> None:
        nonlocal written
        while True:
            await sink.write(b"z" * 1000)
            written += 1

    async with (
        asyncio.timeout(10),
        peers(Routes(), reading_router(1), SETTINGS, stall_timeout=STALL) as (left, *_),
    ):
        marker, sink = left.open_send_stream()
        call = asyncio.create_task(left.call("upload", {"data": marker.to_wire()}, timeout=30))
        with pytest.raises(StreamBroken, match="no room in the stream window within 1 s"):
            await write_forever(sink)
        call.cancel()
        await asyncio.gather(call, return_exceptions=True)
    assert SETTINGS.streams.window <= written < 4 * SETTINGS.streams.window


async def test_the_stall_deadline_runs_on_the_peers_clock() -> None:
    """On a clock moved by hand, a handler waiting for its next chunk stalls the moment the
    clock passes the deadline, long before that much real time went by."""
    clock, stall = ManualClock(), 600.0
    # No keep-alive falls due before the deadline: only the deadline itself can wake the wait.
    quiet = ConnectionSettings(streams=StreamSettings(park_timeout=3000.0, idle_timeout=30000.0))
    first = asyncio.Event()

    async def upload(request: Upload, ctx: RequestContext) -> Size:
        async for _ in ctx.receive_stream(request.data):
            first.set()  # the next chunk's wait starts before this task yields again
        return Size(size=0)

    routes = Routes([Route("upload", Upload, upload)])
    async with (
        asyncio.timeout(10),
        peers(Routes(), routes, quiet, stall_timeout=stall, clock=clock) as (left, *_),
    ):
        marker, sink = left.open_send_stream()
        call = asyncio.create_task(left.call("upload", {"data": marker.to_wire()}, timeout=1e5))
        await sink.write(b"x" * 1000)
        await first.wait()
        clock.advance(stall)
        with pytest.raises(CallFailed) as refused:
            await call
    assert f"no chunk from the peer within {stall:g} s" in refused.value.text
