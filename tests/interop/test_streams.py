"""VirtualStreams between the agent and the real typedrequest 3.3.0, both directions, 64 MiB.

Cloudly -> agent: the harness's `stream` command fires a method with a real `VirtualStream`
(Node is the initiator), the agent's handler reads it with `ctx.receive_stream`. Agent ->
Cloudly: the agent opens a send stream, puts its marker into an `uploadStream` call and writes;
the library's responder side drains it and Node reports the sha256.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import TYPE_CHECKING, Any

import pytest

from agent.contracts.base import StreamMarker, WireModel
from agent.protocol.handlers import RequestContext, Route
from tests.interop.conftest import AgentUnderTest, deterministic_bytes

if TYPE_CHECKING:
    from pathlib import Path

    from tests.interop.conftest import NodeCloudly, Spawn

pytestmark = pytest.mark.interop

MiB = 2**20
BIG = 64 * MiB


class ArchiveUpload(WireModel):
    """A request carrying one stream, as the relay methods do."""

    archive: StreamMarker
    label: str


class ArchiveReceived(WireModel):
    label: str
    bytes: int
    chunks: int
    sha256: str


async def receive_archive(request: ArchiveUpload, ctx: RequestContext) -> ArchiveReceived:
    """Reads the whole stream and answers with what arrived."""
    digest = hashlib.sha256()
    size = chunks = 0
    async for chunk in ctx.receive_stream(request.archive):
        digest.update(chunk)
        size += len(chunk)
        chunks += 1
    return ArchiveReceived(
        label=request.label, bytes=size, chunks=chunks, sha256=digest.hexdigest()
    )


RECEIVE_ARCHIVE = Route("receiveArchive", ArchiveUpload, receive_archive)


def sha256_of(seed: str, size: int) -> str:
    """The sha256 of the harness's deterministic bytes."""
    return hashlib.sha256(deterministic_bytes(seed, size)).hexdigest()


async def send_from_cloudly(
    cloudly: NodeCloudly, *, seed: str, size: int, chunk_size: int, encoding: str
) -> dict[str, Any]:
    """Node streams `size` bytes into the agent's `receiveArchive`; the harness's reply."""
    return await cloudly.command(
        "stream",
        timeout=150,
        method="receiveArchive",
        bytes=size,
        seed=seed,
        chunkSize=chunk_size,
        encoding=encoding,
        field="archive",
        request={"label": f"{encoding}-{size}"},
        timeoutMs=140_000,
    )


@pytest.mark.slow
async def test_cloudly_streams_64_mib_buffer_form_into_the_agent(
    cloudly: NodeCloudly, agent: AgentUnderTest
) -> None:
    """64 MiB of Node Buffers ({"type":"Buffer"} form) arrive intact: same sha256 on both sides."""
    agent.serve(RECEIVE_ARCHIVE)
    async with agent.running():
        reply = await send_from_cloudly(
            cloudly, seed="c2a-buffer", size=BIG, chunk_size=MiB, encoding="buffer"
        )
    assert reply["ok"] is True, reply
    expected = sha256_of("c2a-buffer", BIG)
    assert reply["sha256"] == expected
    assert reply["response"] == {
        "label": f"buffer-{BIG}",
        "bytes": BIG,
        "chunks": 64,
        "sha256": expected,
    }
    assert reply["chunksAcked"] == 64
    assert reply["closingBitAcked"] is True


async def test_cloudly_streams_indexed_object_form_into_the_agent(
    cloudly: NodeCloudly, agent: AgentUnderTest
) -> None:
    """Uint8Arrays ({"0":..,"1":..} form, ~10x slower in Node) arrive intact too."""
    size = 2 * MiB + 12_345  # a short last chunk
    agent.serve(RECEIVE_ARCHIVE)
    async with agent.running():
        reply = await send_from_cloudly(
            cloudly, seed="c2a-indexed", size=size, chunk_size=256 * 1024, encoding="uint8array"
        )
    assert reply["ok"] is True, reply
    assert reply["response"]["bytes"] == size
    assert reply["response"]["chunks"] == 9
    assert reply["response"]["sha256"] == reply["sha256"] == sha256_of("c2a-indexed", size)


HOLD = 2.5
"""Seconds a handler holds its stream back before it reads (a stage waiting its turn)."""


async def receive_after_its_turn(request: ArchiveUpload, ctx: RequestContext) -> ArchiveReceived:
    """Holds the stream back for `HOLD` s, as a stage waiting for a transfer slot, then reads."""
    ctx.hold_stream(request.archive)
    await asyncio.sleep(HOLD)  # real time: the library's probe timer runs meanwhile
    return await receive_archive(request, ctx)


async def test_a_held_stream_costs_the_library_a_probe_a_second_not_twenty(
    cloudly: NodeCloudly, agent: AgentUnderTest
) -> None:
    """typedrequest 3.3.0 probes 50 ms after each backpressured answer; the agent answers a
    held stream's probe when the stream is read, or after `park_timeout` (1 s), so a stream
    held 2.5 s costs a few probes (about 50 if each were answered at once) and still arrives
    intact."""
    agent.serve(Route("receiveAfterItsTurn", ArchiveUpload, receive_after_its_turn))
    async with agent.running():
        reply = await cloudly.command(
            "stream",
            timeout=60,
            method="receiveAfterItsTurn",
            bytes=MiB,
            seed="held",
            chunkSize=256 * 1024,
            encoding="buffer",
            field="archive",
            request={"label": "held"},
            timeoutMs=50_000,
        )
    assert reply["ok"] is True, reply
    assert reply["response"]["sha256"] == sha256_of("held", MiB)
    assert 1 <= reply["probes"] <= HOLD / 1.0 + 3


async def test_agent_reply_to_a_streamed_call_does_not_echo_the_marker(
    cloudly: NodeCloudly, agent: AgentUnderTest
) -> None:
    """The reply omits the request's stream marker, so the library starts no phantom stream."""
    agent.serve(RECEIVE_ARCHIVE)
    async with agent.running():
        reply = await send_from_cloudly(
            cloudly, seed="c2a-echo", size=300_000, chunk_size=100_000, encoding="buffer"
        )
        assert reply["ok"] is True, reply
        frames = (await cloudly.command("frames", since=0))["frames"]
    answers = [
        f["frame"]
        for f in frames
        if f["dir"] == "in"
        and f["frame"]["method"] == "receiveArchive"
        and f["frame"]["correlation"]["phase"] == "response"
    ]
    assert len(answers) == 1
    echoed = answers[0]["request"]
    # what the library itself writes in this place (README: "Do what the library does")
    assert echoed["archive"]["_OBMITTED_VIRTUAL_STREAM"] is True
    assert "_isVirtualStream" not in echoed["archive"]
    assert echoed["label"] == "buffer-300000"


async def stream_to_cloudly(
    agent: AgentUnderTest, data: bytes, piece: int, **request: Any
) -> dict[str, Any]:
    """The agent uploads `data` through `uploadStream` (more request fields: `request`);
    Cloudly's response."""
    marker, sink = agent.session.open_send_stream()

    async def write_all() -> None:
        view = memoryview(data)
        for start in range(0, len(view), piece):
            await sink.write(bytes(view[start : start + piece]))
        await sink.close()

    async with asyncio.TaskGroup() as group:
        call = group.create_task(
            agent.session.call(
                "uploadStream", {"archive": marker.to_wire(), **request}, timeout=150
            )
        )
        group.create_task(write_all())
    return call.result()


@pytest.mark.slow
async def test_agent_streams_64_mib_to_cloudly_as_initiator(
    cloudly: NodeCloudly, agent: AgentUnderTest
) -> None:
    """64 MiB written by the agent reach the library's responder with the same sha256."""
    data = deterministic_bytes("a2c-buffer", BIG)
    async with agent.running():
        response = await stream_to_cloudly(agent, data, MiB)
        events = await cloudly.wait_for("streams", 1)
    expected = hashlib.sha256(data).hexdigest()
    assert response == {
        "field": "archive",
        "status": "complete",
        "bytes": BIG,
        "chunks": 64,
        "sha256": expected,
    }
    [stream] = events["streams"]
    assert stream["frames"]["forms"] == {"buffer": 64, "closing-bit": 1}


async def test_a_stalling_library_reader_holds_at_most_the_window_plus_its_16_chunks(
    spawn_cloudly: Spawn, tmp_path: Path
) -> None:
    """Cloudly 100 ms away (its frames leave 100 ms late) reads 16 chunks and then stops for
    3 s: the agent, which keeps several chunks in flight, stops at the library's first
    `backpressure: true`. The library's queue then holds more than its own 16 (chunks were in
    flight when it filled: a sender with one in flight leaves it at 16) and at most window (16)
    + 16, and every byte arrives."""
    cloudly = await spawn_cloudly(args=["--send-delay-ms", "100"])
    agent = AgentUnderTest(tmp_path, cloudly.url)
    data = deterministic_bytes("a2c-far", 96 * 64 * 1024)
    async with agent.running():
        response = await stream_to_cloudly(
            agent, data, 64 * 1024, readPauseMs=3000, readPauseAfter=16
        )
    assert (response["status"], response["bytes"]) == ("complete", len(data))
    assert response["sha256"] == hashlib.sha256(data).hexdigest()
    assert 16 < response["maxQueued"] <= 16 + 16


async def test_library_does_not_revive_the_base64_chunk_form(
    cloudly: NodeCloudly, tmp_path: Path
) -> None:
    """EncodedBuffer chunks reach the library's responder as non-bytes: why "buffer" is default."""
    agent = AgentUnderTest(tmp_path, cloudly.url, chunk_form="base64")
    async with agent.running():
        response = await stream_to_cloudly(agent, deterministic_bytes("a2c-b64", 1000), 1000)
        events = await cloudly.wait_for("streams", 1)
    assert response["status"] == "bad-chunk"
    assert events["streams"][0]["frames"]["forms"]["encoded-buffer"] == 1
