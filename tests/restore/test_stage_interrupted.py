"""A stage whose stream stops: Cloudly reads `transfer-interrupted` (retryable), not a bug."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from agent.contracts.isolatedrestore import METHOD_STAGE
from agent.errors import CallFailed, SessionClosed, StreamBroken
from agent.protocol.connection import ConnectionSettings, StreamSettings
from agent.protocol.envelope import STREAM_METHOD
from agent.protocol.handlers import Routes
from agent.restore.routes import isolated_restore_routes
from agent.session.peer import Peer
from tests.memory import MemoryTransport, transport_pair

DUMP = "snap-db/dump.bson"
# The agent drops a stream that stays silent this long (seconds, the peer's own clock).
SILENCE = 0.3
PEERS = ConnectionSettings(streams=StreamSettings(park_timeout=0.05, idle_timeout=SILENCE))


@asynccontextmanager
async def cloudly_and_agent(world: Any) -> AsyncIterator[tuple[Peer, MemoryTransport]]:
    """A Cloudly-side peer (and its end of the connection) talking to the engine's routes."""
    cloudly_end, agent_end = transport_pair()
    cloudly, agent = (
        Peer(cloudly_end, Routes(), settings=PEERS),
        Peer(agent_end, isolated_restore_routes(world.engine), settings=PEERS),
    )
    runs = [asyncio.create_task(cloudly.run()), asyncio.create_task(agent.run())]
    try:
        yield cloudly, cloudly_end
    finally:
        cloudly_end.close()
        for run in runs:
            with pytest.raises(SessionClosed):
                await run


def test_a_broken_stream_is_transfer_interrupted_and_retryable() -> None:
    """The error's wire code says the bytes stopped, and that resending them may succeed."""
    broken = StreamBroken("the stream went silent")
    assert (broken.code, broken.retryable) == ("transfer-interrupted", True)


async def test_a_stage_whose_stream_goes_silent_answers_transfer_interrupted(
    world: Any,
) -> None:
    """Cloudly opens the object's stream and then sends nothing on it (no chunk, no keep-alive):
    after the keep-alive timeout the stage is refused `transfer-interrupted`, retryable, and the
    restore's revision stays where it was."""
    prepared = await world.prepare()
    async with cloudly_and_agent(world) as (cloudly, cloudly_end):
        cloudly_end.on_send = _without_stream_frames
        marker, sink = cloudly.open_send_stream()
        body = {**world.stage_body(DUMP, prepared["revision"]), "archive": marker.to_wire()}
        with pytest.raises(CallFailed) as caught:
            await cloudly.call(METHOD_STAGE, body, timeout=30)
        await sink.abort()
    assert caught.value.error_data == {"code": "transfer-interrupted", "retryable": True}
    assert (await world.store.get(world.KEY)).revision == prepared["revision"]
    assert await world.store.written_objects(world.KEY) == []


def _without_stream_frames(frame: bytes) -> bytes | None:
    """Cloudly's transport hook: every VirtualStream frame is lost, the rest goes out."""
    return None if STREAM_METHOD.encode() in frame else frame


async def test_a_stage_whose_stream_carries_a_malformed_chunk_is_an_invalid_request(
    world: Any,
) -> None:
    """A chunk that is no chunk (a byte value of 256) breaks the stage's stream: the stage is
    refused `invalid-request`, not retryable (the same bytes would fail again; Cloudly resending
    them on `transfer-interrupted` would never end), and the revision stays where it was."""
    prepared = await world.prepare()
    async with cloudly_and_agent(world) as (cloudly, cloudly_end):
        cloudly_end.on_send = _second_chunk_malformed()
        marker, sink = cloudly.open_send_stream()
        body = {**world.stage_body(DUMP, prepared["revision"]), "archive": marker.to_wire()}
        call = asyncio.create_task(cloudly.call(METHOD_STAGE, body, timeout=30))
        for _ in range(2):
            await sink.write(b"x" * 1000)
        with pytest.raises(CallFailed) as caught:
            await call
        await sink.abort()
    assert caught.value.error_data == {"code": "invalid-request", "retryable": False}
    assert "undecodable chunk" in caught.value.text
    assert (await world.store.get(world.KEY)).revision == prepared["revision"]


def _second_chunk_malformed() -> Callable[[bytes], bytes | None]:
    """Cloudly's transport hook: the second chunk frame's first byte becomes 256."""
    seen = 0

    def rewrite(frame: bytes) -> bytes | None:
        nonlocal seen
        if b'"mainPurpose":"chunk"' not in frame or b'"data":[120,' not in frame:
            return frame
        seen += 1
        return frame.replace(b'"data":[120,', b'"data":[256,', 1) if seen == 2 else frame

    return rewrite
