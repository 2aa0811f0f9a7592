"""The real typedrequest 3.3.0 as a careless peer: stray stream frames, a flood, odd answers.

typedrequest echoes every `##VirtualStream##` frame for a stream it does not know. An agent that
did the same would bounce one stray frame with the library for the life of the session; these
tests pin that the agent answers such a frame once and never answers its echo, that a request
flood is answered `retry` beyond the agent's bound (and the library resends), and that a
`getClusterConfig` answer without `services` still connects.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from agent.contracts.base import WireModel
from agent.protocol.handlers import RequestContext, Route
from tests.interop.conftest import CLUSTER_ID, AgentUnderTest, connected

if TYPE_CHECKING:
    from tests.interop.conftest import NodeCloudly

pytestmark = pytest.mark.interop

STRAY_CYCLE = "stray-cycle-1"


class Nothing(WireModel):
    pass


async def nothing(request: Nothing, ctx: RequestContext) -> Nothing:
    return Nothing()


def _stray_frames(frames: list[dict[str, Any]]) -> list[str]:
    """The direction of every frame of the stray cycle, in order."""
    return [
        f["dir"]
        for f in frames
        if f["frame"].get("method") == "##VirtualStream##"
        and (f["frame"].get("request") or {}).get("cycleId") == STRAY_CYCLE
    ]


async def test_a_stray_stream_frame_gets_one_answer_and_its_echo_none(
    cloudly: NodeCloudly, agent: AgentUnderTest
) -> None:
    """keepAlive for an unknown stream: the agent echoes once, the library echoes that back,
    and there it ends (it used to go on at ~2,000 frames a second)."""
    agent.serve(Route("nothing", Nothing, nothing))
    stray = {
        "method": "##VirtualStream##",
        "request": {
            "streamId": "nobody-knows-this-stream",
            "cycleId": STRAY_CYCLE,
            "cycle": "request",
            "mainPurpose": "keepAlive",
            "keepAlive": True,
        },
        "response": None,
    }
    async with agent.running():
        await cloudly.command("raw-send", frame=stray)
        for _ in range(3):  # round trips on the same socket: a loop would show up in between
            reply = await cloudly.command("fire", method="nothing", request={})
            assert reply["response"] == {}
        frames = (await cloudly.command("frames", since=0))["frames"]
    # Cloudly's stray frame, the agent's one echo, the library's echo of that: nothing more.
    assert _stray_frames(frames) == ["out", "in", "out"]


async def test_a_request_beyond_the_bound_is_answered_retry_and_the_library_resends(
    cloudly: NodeCloudly, tmp_path: Path
) -> None:
    """With one request in flight and a bound of one, the next is answered `retry` (no
    `error`); the library waits `waitForMs`, resends the identical frame, and gets its answer."""
    release = asyncio.Event()

    async def hold(request: Nothing, ctx: RequestContext) -> Nothing:
        await release.wait()
        return Nothing()

    agent = AgentUnderTest(tmp_path, cloudly.url, max_concurrent_requests=1)
    agent.serve(Route("hold", Nothing, hold))
    async with agent.running():
        first = asyncio.create_task(cloudly.command("fire", method="hold", request={}))
        second = asyncio.create_task(cloudly.command("fire", method="hold", request={}))
        deferred: list[dict[str, Any]] = []
        async with asyncio.timeout(10):
            while not deferred:  # each round trip asks Node what it has received so far
                frames = (await cloudly.command("frames", since=0))["frames"]
                deferred = [
                    f["frame"] for f in frames if f["dir"] == "in" and "retry" in f["frame"]
                ]
        release.set()
        replies = [await first, await second]
    [busy] = deferred
    assert (busy["response"], "error" in busy) == (None, False)
    assert busy["retry"]["waitForMs"] == 1000
    assert all(reply["response"] == {} for reply in replies)
    assert sorted(reply["sends"] for reply in replies) == [1, 2]


async def test_a_cluster_config_answer_without_services_still_connects(
    cloudly: NodeCloudly, agent: AgentUnderTest
) -> None:
    """`services`, which the agent does not use, missing from Cloudly's answer: it connects."""
    document = (await cloudly.command("cluster-config"))["clusterConfig"]["configData"]
    await cloudly.command("handle", method="getClusterConfig", response={"configData": document})
    async with agent.running() as snapshot:
        assert connected(snapshot)
    assert snapshot.cluster_id == CLUSTER_ID
