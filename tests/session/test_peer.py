"""Two `Peer`s over an in-memory transport pair: calls both ways, errors, retry, shutdown."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from agent.contracts.base import WireModel
from agent.errors import CallFailed, CallTimeout, RestoreNotFound, SessionClosed
from agent.session.peer import Peer, PeerSettings, RequestContext, Router
from agent.session.peer_memory import MemoryTransport, transport_pair

FAST = PeerSettings(keepalive_interval=0.05, keepalive_timeout=0.5, backpressure_probe=0.005)


@asynccontextmanager
async def peers(
    left_router: Router, right_router: Router, settings: PeerSettings = FAST
) -> AsyncIterator[tuple[Peer, Peer, MemoryTransport, MemoryTransport]]:
    """Two running peers; the connection closes on exit."""
    ta, tb = transport_pair()
    left, right = Peer(ta, left_router, settings=settings), Peer(tb, right_router, settings=settings)
    runs = [asyncio.create_task(left.run()), asyncio.create_task(right.run())]
    try:
        yield left, right, ta, tb
    finally:
        ta.close()
        for run in runs:
            with pytest.raises(SessionClosed):
                await run


async def echo(request: Mapping[str, Any], ctx: RequestContext) -> Mapping[str, Any]:
    return {"echoed": request.get("value"), "method": ctx.method}


def router_with(**handlers: Any) -> Router:
    router = Router()
    for name, handler in handlers.items():
        router.register(name, handler)
    return router


async def test_call_returns_the_response() -> None:
    """A call gets the handler's response object."""
    async with peers(Router(), router_with(echo=echo)) as (left, _, _, _):
        assert await left.call("echo", {"value": "hi"}, timeout=2) == {
            "echoed": "hi",
            "method": "echo",
        }


async def test_calls_work_in_both_directions() -> None:
    """Either peer may call the other on the same connection."""
    async with peers(router_with(echo=echo), router_with(echo=echo)) as (left, right, _, _):
        a, b = await asyncio.gather(
            left.call("echo", {"value": 1}, timeout=2), right.call("echo", {"value": 2}, timeout=2)
        )
    assert (a["echoed"], b["echoed"]) == (1, 2)


async def test_unknown_method_answers_unknown_method_error() -> None:
    """A method nobody registered fails with the TS text and code unknown-method."""
    async with peers(Router(), Router()) as (left, _, _, _):
        with pytest.raises(CallFailed) as caught:
            await left.call("nope", {}, timeout=2)
    assert caught.value.text == "There is no available method for this call on the server side"
    assert caught.value.error_data == {"code": "unknown-method", "retryable": False}


async def test_agent_error_becomes_error_with_its_code() -> None:
    """A handler's AgentError travels as error {text, data.code}."""

    async def refuse(request: Mapping[str, Any], ctx: RequestContext) -> Mapping[str, Any]:
        raise RestoreNotFound("no restore r1 on node n1")

    async with peers(Router(), router_with(get=refuse)) as (left, _, _, _):
        with pytest.raises(CallFailed) as caught:
            await left.call("get", {}, timeout=2)
    assert caught.value.text == "no restore r1 on node n1"
    assert caught.value.error_data == {"code": "restore-not-found", "retryable": False}


class _Body(WireModel):
    sha256: str


class _Outer(WireModel):
    object_ref: _Body


async def test_validation_error_names_the_first_camel_case_path() -> None:
    """A pydantic ValidationError becomes invalid-request naming objectRef.sha256."""

    async def strict(request: Mapping[str, Any], ctx: RequestContext) -> Mapping[str, Any]:
        _Outer.model_validate(request)
        return {}

    async with peers(Router(), router_with(stage=strict)) as (left, _, _, _):
        with pytest.raises(CallFailed) as caught:
            await left.call("stage", {"objectRef": {"sha256": 5}}, timeout=2)
    assert caught.value.error_data["code"] == "invalid-request"
    assert caught.value.error_data["field"] == "objectRef.sha256"
    assert caught.value.text.startswith("objectRef.sha256: ")


async def test_unexpected_exception_becomes_internal_without_details() -> None:
    """Any other exception answers code internal with a generic text."""

    async def crash(request: Mapping[str, Any], ctx: RequestContext) -> Mapping[str, Any]:
        raise RuntimeError("secret-ish detail")

    async with peers(Router(), router_with(boom=crash)) as (left, _, _, _):
        with pytest.raises(CallFailed) as caught:
            await left.call("boom", {}, timeout=2)
    assert caught.value.error_data == {"code": "internal", "retryable": True}
    assert "secret-ish" not in caught.value.text


async def test_call_without_reply_times_out() -> None:
    """A call whose reply never comes raises CallTimeout."""
    never = asyncio.Event()

    async def hang(request: Mapping[str, Any], ctx: RequestContext) -> Mapping[str, Any]:
        await never.wait()
        return {}

    async with peers(Router(), router_with(hang=hang)) as (left, _, _, _):
        with pytest.raises(CallTimeout):
            await left.call("hang", {}, timeout=0.05)


async def test_retry_resends_the_identical_frame_then_succeeds() -> None:
    """A retry reply makes the caller resend byte-identical frames until answered."""
    ta, tb = transport_pair()
    left = Peer(ta, Router(), settings=FAST)
    ta.record = True
    run = asyncio.create_task(left.run())
    call = asyncio.create_task(left.call("slow", {"n": 1}, timeout=2))
    if True:
        first = await tb.recv()
        sent = orjson.loads(first)
        for _ in range(2):
            answer = {**sent, "correlation": {**sent["correlation"], "phase": "response"}}
            await tb.send(orjson.dumps({**answer, "retry": {"waitForMs": 1, "reason": "busy"}}))
            assert await tb.recv() == first
        done = {**sent, "response": {"ok": True}, "correlation": {**sent["correlation"], "phase": "response"}}
        await tb.send(orjson.dumps(done))
        assert await call == {"ok": True}
        tb.close()
        with pytest.raises(SessionClosed):
            await run
    assert ta.sent == [first, first, first]
    assert sent["correlation"]["id"].startswith("uni_") and len(sent["correlation"]["id"]) == 28


async def test_transport_close_fails_pending_calls_with_session_closed() -> None:
    """Closing the transport fails every pending call with SessionClosed."""
    ta, tb = transport_pair()
    left = Peer(ta, Router(), settings=FAST)
    run = asyncio.create_task(left.run())
    call = asyncio.create_task(left.call("x", {}, timeout=5))
    if True:
        await tb.recv()
        tb.close()
        with pytest.raises(SessionClosed):
            await call
        with pytest.raises(SessionClosed):
            await run
