"""Through the asyncio driver: a hostile frame ends neither the session task nor its service,
and every frame the peer sends back is UTF-8 JSON."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from agent.errors import CallFailed
from agent.protocol.handlers import RequestContext, Routes
from tests.session._helpers import body_route, peers


async def echo(request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
    return {"echoed": request}


def deep(depth: int, inner: bytes = b"1") -> bytes:
    return b"[" * depth + inner + b"]" * depth


MARKER = b'{"_isVirtualStream":true,"streamId":"s1"}'
HOSTILE = {
    "deep request to a routed method": (
        b'{"method":"echo","request":{"x":' + deep(253) + b'},"response":null,'
        b'"correlation":{"id":"h1","phase":"request"}}'
    ),
    "deep request to an unknown method": (
        b'{"method":"pushClusterConfig","request":{"x":' + deep(300) + b'},"response":null,'
        b'"correlation":{"id":"h2","phase":"request"}}'
    ),
    "marker nested 1,000 deep": (
        b'{"method":"echo","request":{"x":' + deep(1000, MARKER) + b'},"response":null,'
        b'"correlation":{"id":"h3","phase":"request"}}'
    ),
    "deep frame for an unknown stream": (
        b'{"method":"##VirtualStream##","request":{"streamId":"nobody","cycleId":"k1",'
        b'"cycle":"request","mainPurpose":"keepAlive","x":' + deep(300) + b"},"
        b'"response":null}'
    ),
    "undecodable payload for an unknown stream": (
        b'{"method":"##VirtualStream##","request":{"streamId":"nobody","cycleId":"k2",'
        b'"cycle":"request","mainPurpose":"keepAlive",'
        b'"chunkData":{"type":"Buffer","data":[1,\xff\xfe,2]}},"response":null}'
    ),
}


@pytest.mark.parametrize("frame", HOSTILE.values(), ids=HOSTILE.keys())
async def test_a_hostile_frame_leaves_the_session_serving(frame: bytes) -> None:
    """The frame is answered (or dropped), the session task goes on, the next call is served,
    and what the agent sent is JSON; leaving `peers` checks both runs end `SessionClosed`."""
    async with peers(Routes(), Routes([body_route("echo", echo)])) as (left, _, _, tb):
        tb.record = True
        tb.inject(frame)
        assert await left.call("echo", {"value": 1}, timeout=2) == {"echoed": {"value": 1}}
        for sent in tb.sent:
            assert isinstance(orjson.loads(sent), dict)


async def test_a_deep_request_is_refused_invalid_request() -> None:
    """A call whose body nests past the bound fails `invalid-request` at the caller."""
    body: Any = 1
    for _ in range(200):
        body = [body]
    async with peers(Routes(), Routes([body_route("echo", echo)])) as (left, _, _, _):
        with pytest.raises(CallFailed) as caught:
            await left.call("echo", {"x": body}, timeout=2)
    assert caught.value.error_data == {"code": "invalid-request", "retryable": False}


async def test_a_request_at_the_depth_bound_is_served() -> None:
    """128 levels in all (the envelope, `request`, `x` and 125 arrays): validated, handled and
    answered, the echo and the response whole."""
    body: Any = 1
    for _ in range(125):
        body = [body]
    async with peers(Routes(), Routes([body_route("echo", echo)])) as (left, _, _, _):
        assert await left.call("echo", {"x": body}, timeout=2) == {"echoed": {"x": body}}
