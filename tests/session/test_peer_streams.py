"""VirtualStreams between two `Peer`s: both directions, integrity, bounds, breakage."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
from dataclasses import replace
from typing import Any

import orjson
import pytest

from agent.contracts.base import StreamMarker, WireModel
from agent.errors import SessionClosed, StreamBroken
from agent.protocol.bytearrays import codec_backends
from agent.protocol.connection import ConnectionSettings, StreamSettings
from agent.protocol.handlers import ByteSink, RequestContext, Route, Routes
from agent.session.peer import Peer
from agent.transfers.budget import ByteBudget
from tests.clock import ManualClock
from tests.memory import MemoryTransport, transport_pair
from tests.session._helpers import FAST, body_route, peers

MIB = 1 << 20


def pattern(size: int) -> bytes:
    """Deterministic pseudo-random bytes (cheap to make, not compressible into a pattern)."""
    seed = hashlib.sha256(b"seed").digest() * 2048  # 64 KiB
    reps, rest = divmod(size, len(seed))
    return seed * reps + seed[:rest]


class Upload(WireModel):
    data: StreamMarker


class Size(WireModel):
    size: int


class Nothing(WireModel):
    pass


class Download(WireModel):
    data: StreamMarker


def upload_router(digests: list[str]) -> Routes:
    """`upload {data: marker}` -> `{size}`; records the sha256 of what arrived."""

    async def upload(request: Upload, ctx: RequestContext) -> Size:
        source = ctx.receive_stream(request.data)
        digest, size = hashlib.sha256(), 0
        async for chunk in source:
            digest.update(chunk)
            size += len(chunk)
        digests.append(digest.hexdigest())
        return Size(size=size)

    return Routes([Route("upload", Upload, upload)])


def download_router(payload: bytes, chunk: int) -> Routes:
    """`download {}` -> `{data: marker}`; a producer writes `payload` after the reply."""

    async def download(request: Nothing, ctx: RequestContext) -> Download:
        async def produce(sink: ByteSink) -> None:
            for start in range(0, len(payload), chunk):
                await sink.write(payload[start : start + chunk])

        marker, _ = ctx.open_send_stream(produce)
        return Download(data=marker)

    return Routes([Route("download", Nothing, download)])


async def upload(left: Peer, payload: bytes, chunk: int) -> dict[str, Any]:
    """Send `payload` to the right peer's `upload` in chunks; returns its reply."""
    marker, sink = left.open_send_stream()
    call = asyncio.create_task(left.call("upload", {"data": marker.to_wire()}, timeout=60))
    for start in range(0, len(payload), chunk):
        await sink.write(payload[start : start + chunk])
    await sink.close()
    return await call


async def upload_between(
    left: Peer, right: Peer, transport: MemoryTransport, payload: bytes, *, within: float
) -> dict[str, Any]:
    """`upload` of `payload` in 4 KiB pieces with both peers running (`within` seconds at most);
    then `transport` (left's) closes and both runs end SessionClosed."""
    runs = [asyncio.create_task(left.run()), asyncio.create_task(right.run())]
    try:
        async with asyncio.timeout(within):
            return await upload(left, payload, 4096)
    finally:
        transport.close()
        for run in runs:
            with pytest.raises(SessionClosed):
                await run


async def download(left: Peer) -> tuple[str, int]:
    """Call `download` and read its stream; returns (sha256, size)."""
    reply = await left.call("download", {}, timeout=5)
    source = left.receive_stream(StreamMarker.from_wire(reply["data"]))
    digest, size = hashlib.sha256(), 0
    async for piece in source:
        digest.update(piece)
        size += len(piece)
    return digest.hexdigest(), size


def stream_frame(cycle: str, purpose: str, tail: bytes) -> bytes:
    """A VirtualStream request frame of stream `s1`, as the peer's bytes: `tail` is spliced in
    after its `mainPurpose` (a `chunkData`, a `keepAlive`)."""
    return (
        b'{"method":"##VirtualStream##","request":{"streamId":"s1","cycleId":"'
        + cycle.encode()
        + b'","cycle":"request","mainPurpose":"'
        + purpose.encode()
        + b'"'
        + tail
        + b'},"response":null}'
    )


async def write_forever(sink: ByteSink) -> None:
    """Write until the sink raises."""
    while True:
        await sink.write(b"y" * 1000)


async def test_small_upload_arrives_intact() -> None:
    """Bytes the caller streams in its request arrive in order at the handler."""
    digests: list[str] = []
    payload = os.urandom(100_000)
    async with peers(Routes(), upload_router(digests)) as (left, _, _, _):
        assert await upload(left, payload, 4096) == {"size": len(payload)}
    assert digests == [hashlib.sha256(payload).hexdigest()]


async def test_small_download_arrives_intact() -> None:
    """Bytes a handler streams in its response arrive in order at the caller (read)."""
    payload = os.urandom(100_000)
    async with peers(Routes(), download_router(payload, 4096)) as (left, _, _, _):
        assert await download(left) == (hashlib.sha256(payload).hexdigest(), len(payload))


@pytest.mark.parametrize("form", ["buffer", "base64"])
async def test_64_mib_upload_keeps_its_sha256(form: str) -> None:
    """64 MiB sent initiator -> responder in 1 MiB chunks arrive with the same sha256."""
    payload = pattern(64 * MIB)
    digests: list[str] = []
    settings = ConnectionSettings(
        streams=StreamSettings(park_timeout=0.2, idle_timeout=10, chunk_form=form)
    )
    async with peers(Routes(), upload_router(digests), settings) as (left, _, _, _):
        assert await upload(left, payload, MIB) == {"size": len(payload)}
    assert digests == [hashlib.sha256(payload).hexdigest()]


@pytest.mark.parametrize("form", ["buffer", "base64"])
async def test_64_mib_download_keeps_its_sha256(form: str) -> None:
    """64 MiB sent responder -> initiator (read) arrive with the same sha256."""
    payload = pattern(64 * MIB)
    settings = ConnectionSettings(
        streams=StreamSettings(park_timeout=0.2, idle_timeout=10, chunk_form=form)
    )
    async with peers(Routes(), download_router(payload, MIB), settings) as (left, _, _, _):
        assert await download(left) == (hashlib.sha256(payload).hexdigest(), len(payload))


async def test_transport_closing_mid_upload_breaks_both_ends() -> None:
    """The connection dying mid-upload: the writer breaks and the handler is cancelled."""
    handler_saw: list[BaseException] = []
    first_chunk = asyncio.Event()

    async def upload(request: Upload, ctx: RequestContext) -> Size:
        source = ctx.receive_stream(request.data)
        try:
            async for _ in source:
                first_chunk.set()
        except (StreamBroken, asyncio.CancelledError) as exc:
            handler_saw.append(exc)
            raise
        return Size(size=0)

    router = Routes([Route("upload", Upload, upload)])
    ta, tb = transport_pair()
    left, right = Peer(ta, Routes(), settings=FAST), Peer(tb, router, settings=FAST)
    runs = [asyncio.create_task(left.run()), asyncio.create_task(right.run())]
    marker, sink = left.open_send_stream()
    call = asyncio.create_task(left.call("upload", {"data": marker.to_wire()}, timeout=5))
    await sink.write(b"x" * 1000)
    await first_chunk.wait()
    ta.close()
    with pytest.raises(SessionClosed):
        await call
    with pytest.raises((StreamBroken, SessionClosed)):
        await write_forever(sink)
    for run in runs:
        with pytest.raises(SessionClosed):
            await run
    assert len(handler_saw) == 1


async def test_transport_closing_mid_download_breaks_the_reader() -> None:
    """The connection dying mid-download: the caller's ByteSource raises StreamBroken."""
    payload = os.urandom(64 * 1024)
    ta, tb = transport_pair()
    left, right = (
        Peer(ta, Routes(), settings=FAST),
        Peer(tb, download_router(payload, 1024), settings=FAST),
    )
    runs = [asyncio.create_task(left.run()), asyncio.create_task(right.run())]
    reply = await left.call("download", {}, timeout=5)
    source = left.receive_stream(StreamMarker.from_wire(reply["data"]))
    received = bytearray()

    async def read_then_close() -> None:
        async for piece in source:
            received.extend(piece)
            if len(received) >= 4096:
                ta.close()

    with pytest.raises(StreamBroken):
        await read_then_close()
    assert 4096 <= len(received) < len(payload)
    for run in runs:
        with pytest.raises(SessionClosed):
            await run


async def test_upload_to_unknown_stream_breaks_the_writer() -> None:
    """A responder that never registered the stream echoes its frames: the sink breaks."""

    async def ignore(request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        return {}

    router = Routes([body_route("ignore", ignore)])
    async with peers(Routes(), router) as (left, _, _, _):
        marker, sink = left.open_send_stream()
        await left.call("ignore", {"note": "no stream here", "data": {"other": 1}}, timeout=2)
        # the marker was never announced: arm it by hand through a second call carrying it
        await left.call("ignore", {"data": marker.to_wire()}, timeout=2)
        with pytest.raises(StreamBroken):
            await write_forever(sink)


async def test_responder_that_stops_answering_breaks_the_writer_after_the_timeout() -> None:
    """No stream answer within idle_timeout: the initiator's sink raises StreamBroken."""
    digests: list[str] = []
    async with peers(Routes(), upload_router(digests)) as (left, _, _, tb):
        tb.on_send = lambda frame: None if b"##VirtualStream##" in frame else frame
        marker, sink = left.open_send_stream()
        call = asyncio.create_task(left.call("upload", {"data": marker.to_wire()}, timeout=5))
        with pytest.raises(StreamBroken, match="no answer"):
            await write_forever(sink)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
    assert digests == []


async def test_handler_send_stream_missing_from_the_response_is_aborted() -> None:
    """A stream the handler opened but did not announce breaks its writer."""
    sinks: list[ByteSink] = []

    async def forgetful(request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        _, sink = ctx.open_send_stream()
        sinks.append(sink)
        return {}

    router = Routes([body_route("forgetful", forgetful)])
    async with peers(Routes(), router) as (left, _, _, _):
        assert await left.call("forgetful", {}, timeout=2) == {}
        with pytest.raises(StreamBroken):
            await sinks[0].write(b"late")


async def test_a_bad_chunk_breaks_the_stream_before_the_next_frame_is_answered() -> None:
    """A chunk is answered before it is decoded, and a bad one has broken its stream by the
    time the peer's next frame is answered (one frame later at most): that keepAlive hears
    `false`, and the upload is refused `invalid-request`, not retryable (the same bytes would
    fail again; `transfer-interrupted` would make Cloudly resend them for ever), naming the
    undecodable chunk."""
    ours, theirs = transport_pair()
    settings = ConnectionSettings(
        streams=StreamSettings(inline_decode_max=0)
    )  # every chunk takes the pipelined path
    peer = Peer(ours, upload_router([]), settings=settings)
    run = asyncio.create_task(peer.run())
    marker = {"_isVirtualStream": True, "streamId": "s1"}

    async def next_frame() -> dict[str, Any]:
        frame: dict[str, Any] = orjson.loads(await theirs.recv())
        return frame

    try:
        await theirs.send(
            orjson.dumps(
                {
                    "method": "upload",
                    "request": {"data": marker},
                    "response": None,
                    "correlation": {"id": "c1", "phase": "request"},
                }
            )
        )
        good = b',"chunkData":{"type":"Buffer","data":[1,2,3]}'
        await theirs.send(stream_frame("k1", "chunk", good))
        assert (await next_frame())["response"]["mainPurpose"] == "feedback"
        bad = b',"chunkData":{"type":"Buffer","data":[1,256]}'
        # Back to back: the keepAlive is read while the bad chunk may still be decoding.
        await theirs.send(stream_frame("k2", "chunk", bad))
        await theirs.send(stream_frame("k3", "keepAlive", b',"keepAlive":true'))
        assert (await next_frame())["response"]["mainPurpose"] == "feedback"
        frames = [await next_frame(), await next_frame()]
        answer = next(f for f in frames if f["method"] == "##VirtualStream##")
        refusal = next(f for f in frames if f["method"] == "upload")
        assert answer["response"]["keepAlive"] is False
        assert refusal["error"]["data"] == {"code": "invalid-request", "retryable": False}
        assert "undecodable chunk" in refusal["error"]["text"]
    finally:
        theirs.close()
        with pytest.raises(SessionClosed):
            await run


async def test_a_handler_that_fails_mid_stream_leaves_no_wakeup_behind() -> None:
    """A handler reads part of its request's stream and fails without closing it: once the
    request is answered the stream is over, and its wake-up is no longer registered (it was
    kept for the life of the connection, one per failed request)."""
    read_some = asyncio.Event()

    async def fail_midway(request: Upload, ctx: RequestContext) -> Size:
        source = ctx.receive_stream(request.data)
        async for _ in source:
            read_some.set()
            raise StreamBroken("the handler gave up on its stream")
        raise AssertionError("the stream ended before a chunk")

    routes = Routes([Route("upload", Upload, fail_midway)])
    async with peers(Routes(), routes) as (left, right, _, _):
        for _ in range(3):
            marker, sink = left.open_send_stream()
            call = asyncio.create_task(left.call("upload", {"data": marker.to_wire()}, timeout=5))
            await sink.write(b"x" * 1000)
            await read_some.wait()
            with pytest.raises(Exception):  # noqa: B017  # the handler's failure, any code
                await call
            read_some.clear()
            with contextlib.suppress(StreamBroken):
                await sink.abort()
        assert right._signals == {}


@pytest.mark.parametrize("form", ["buffer", "base64"])
async def test_a_chunk_a_quick_decoder_takes_is_decoded_without_a_thread(
    monkeypatch: pytest.MonkeyPatch, form: str
) -> None:
    """Pipelined chunks the quick decoders take (a canonical array on the wide kernel, valid
    base64) are decoded in the peer's task: no worker thread is asked, and the bytes arrive
    intact; where the CPU has no wide kernel the Buffer form goes to a thread as before."""
    handed: list[object] = []
    to_thread = asyncio.to_thread

    async def counting(func: Any, /, *args: Any) -> Any:
        handed.append(func)
        return await to_thread(func, *args)

    monkeypatch.setattr(asyncio, "to_thread", counting)
    payload = pattern(8 * 256 * 1024)
    digests: list[str] = []
    settings = ConnectionSettings(streams=StreamSettings(chunk_form=form, inline_decode_max=0))
    async with peers(Routes(), upload_router(digests), settings) as (left, _, _, _):
        assert await upload(left, payload, 256 * 1024) == {"size": len(payload)}
    assert digests == [hashlib.sha256(payload).hexdigest()]
    decodes = [f for f in handed if getattr(f, "__name__", "") == "decode"]
    quick = form == "base64" or codec_backends()["buffer_kernel"] == "wide"
    assert len(decodes) == (0 if quick else 8)


async def test_a_chunk_the_quick_decoder_leaves_is_decoded_in_a_thread() -> None:
    """A valid array the wide kernel does not read (whitespace in it) still decodes: the
    worker thread's decoder decides."""
    ours, theirs = transport_pair()
    digests: list[str] = []
    settings = ConnectionSettings(streams=StreamSettings(inline_decode_max=0))
    peer = Peer(ours, upload_router(digests), settings=settings)
    run = asyncio.create_task(peer.run())
    chunk = b'{"type":"Buffer","data":[1, 2, 3]}'
    try:
        await theirs.send(
            b'{"method":"upload","request":{"data":{"_isVirtualStream":true,"streamId":"s1"}},'
            b'"response":null,"correlation":{"id":"c1","phase":"request"}}'
        )
        for cycle, purpose, tail in [
            ("k1", "chunk", b',"chunkData":' + chunk),
            ("k2", "chunk", b',"chunkData":"' + b"#" * 13 + b"CLOSING BIT" + b"#" * 13 + b'"'),
        ]:
            await theirs.send(stream_frame(cycle, purpose, tail))
        while True:
            frame = orjson.loads(await theirs.recv())
            if frame["method"] == "upload":
                break
        assert frame["response"] == {"size": 3}
        assert digests == [hashlib.sha256(b"\x01\x02\x03").hexdigest()]
    finally:
        theirs.close()
        with pytest.raises(SessionClosed):
            await run


class _CountingBudget(ByteBudget):
    """The real byte budget, counting the draws it refused (an answer held for room)."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit, reserve=0)
        self.refused = 0

    def try_take(self, size: int, *, keep: int = 0) -> bool:
        taken = super().try_take(size, keep=keep)
        self.refused += not taken
        return taken


async def test_an_upload_through_a_budget_of_about_one_frame_completes() -> None:
    """An upload through a byte budget that fits about one frame at a time completes: each
    answer held for room goes out when the reader gives bytes back."""
    budget = _CountingBudget(48 * 1024)
    digests: list[str] = []
    payload = os.urandom(64 * 4096)
    ta, tb = transport_pair()
    # The sender keeps one cycle in flight, as a typedrequest 3.3.0 initiator (Cloudly) does.
    one_cycle = replace(FAST, streams=replace(FAST.streams, cycles=1))
    left = Peer(ta, Routes(), settings=one_cycle)
    right = Peer(
        tb,
        upload_router(digests),
        settings=FAST,
        pool=budget,
        first_frame_bytes=24 * 1024,  # its need (7/4) within the budget, as config requires
    )
    assert await upload_between(left, right, ta, payload, within=20) == {"size": len(payload)}
    assert digests == [hashlib.sha256(payload).hexdigest()]
    assert budget.refused > 0  # answers were held for room, and room let them go
    assert budget.held == 0


async def test_the_probe_a_held_stream_parked_is_answered_as_its_handler_reads() -> None:
    """The answer the read releases goes out at once, not with the session's next frame: on a
    clock that never moves (no keep-alive falls due, no probe's park time runs out), an upload
    whose handler held its stream until the probe was parked, then read it, completes. (With a
    byte budget every request's stream is held until its handler reads it.)"""
    clock = ManualClock()
    payload = os.urandom(8 * 4096)
    parked = asyncio.Event()
    ta, tb = transport_pair()
    receive = tb.recv

    async def recv_and_see_the_probe() -> bytes:
        frame = await receive()
        if _probe(orjson.loads(frame)["request"]):
            # The reader parks it before this runs: it handles a frame without awaiting.
            asyncio.get_running_loop().call_soon(parked.set)
        return frame

    tb.recv = recv_and_see_the_probe  # type: ignore[method-assign]
    tb.record = True

    async def held_upload(request: Upload, ctx: RequestContext) -> Size:
        ctx.hold_stream(request.data)
        await parked.wait()
        assert not [frame for frame in tb.sent if _answers_a_probe(frame)]  # it waits
        size = 0
        async for chunk in ctx.receive_stream(request.data):
            size += len(chunk)
        return Size(size=size)

    left = Peer(ta, Routes(), settings=FAST, clock=clock)
    right = Peer(
        tb,
        Routes([Route("upload", Upload, held_upload)]),
        settings=FAST,
        clock=clock,
        pool=ByteBudget(4 * MIB, clock=clock),  # as in production: streams wait for a read
        first_frame_bytes=64 * 1024,
    )
    assert await upload_between(left, right, ta, payload, within=10) == {"size": len(payload)}


def _probe(package: Any) -> bool:
    """Whether a frame's `request` is a stream's `feedback` probe."""
    return isinstance(package, dict) and package.get("mainPurpose") == "feedback"


def _answers_a_probe(frame: bytes) -> bool:
    """Whether `frame` answers a `feedback` probe (it echoes the probe as its `request`)."""
    decoded = orjson.loads(frame)
    return decoded.get("response") is not None and _probe(decoded.get("request"))
