"""The asyncio driver: two `Peer`s over an in-memory transport, calls both ways, typed routes,
errors, retry, concurrency bound, shutdown."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from agent.clock import SYSTEM_CLOCK, Clock
from agent.contracts.base import WireModel
from agent.errors import CallFailed, CallTimeout, InvalidState, RestoreNotFound, SessionClosed
from agent.protocol.connection import ConnectionSettings
from agent.protocol.handlers import RequestContext, Route, Routes
from agent.session.peer import Peer
from tests.clock import ManualClock
from tests.memory import MemoryTransport, transport_pair
from tests.session._helpers import FAST, body_route, peers


async def echo(request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
    return {"echoed": request.get("value"), "method": ctx.method}


def routes_with(**handlers: Any) -> Routes:
    return Routes([body_route(name, handler) for name, handler in handlers.items()])


async def test_call_returns_the_response() -> None:
    """A call gets the handler's response object."""
    async with peers(Routes(), routes_with(echo=echo)) as (left, _, _, _):
        assert await left.call("echo", {"value": "hi"}, timeout=2) == {
            "echoed": "hi",
            "method": "echo",
        }


async def test_calls_work_in_both_directions() -> None:
    """Either peer may call the other on the same connection."""
    async with peers(routes_with(echo=echo), routes_with(echo=echo)) as (left, right, _, _):
        a, b = await asyncio.gather(
            left.call("echo", {"value": 1}, timeout=2), right.call("echo", {"value": 2}, timeout=2)
        )
    assert (a["echoed"], b["echoed"]) == (1, 2)


async def test_unknown_method_answers_unknown_method_error() -> None:
    """A method nobody registered fails with the TS text and code unknown-method."""
    async with peers(Routes(), Routes()) as (left, _, _, _):
        with pytest.raises(CallFailed) as caught:
            await left.call("nope", {}, timeout=2)
    assert caught.value.text == "There is no available method for this call on the server side"
    assert caught.value.error_data == {"code": "unknown-method", "retryable": False}


async def test_agent_error_becomes_error_with_its_code() -> None:
    """A handler's AgentError travels as error {text, data.code}."""

    async def refuse(request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        raise RestoreNotFound("no restore r1 on node n1")

    async with peers(Routes(), routes_with(get=refuse)) as (left, _, _, _):
        with pytest.raises(CallFailed) as caught:
            await left.call("get", {}, timeout=2)
    assert caught.value.text == "no restore r1 on node n1"
    assert caught.value.error_data == {"code": "restore-not-found", "retryable": False}


class _Body(WireModel):
    sha256: str


class _Outer(WireModel):
    object_ref: _Body


class _Empty(WireModel):
    pass


async def test_a_body_failing_the_route_model_is_invalid_request_naming_the_path() -> None:
    """The route's model refuses the body: invalid-request naming objectRef.sha256."""
    called = False

    async def strict(request: _Outer, ctx: RequestContext) -> _Empty:
        nonlocal called
        called = True
        return _Empty()

    async with peers(Routes(), Routes([Route("stage", _Outer, strict)])) as (left, _, _, _):
        with pytest.raises(CallFailed) as caught:
            await left.call("stage", {"objectRef": {"sha256": 5}}, timeout=2)
    assert caught.value.error_data["code"] == "invalid-request"
    assert caught.value.error_data["field"] == "objectRef.sha256"
    assert caught.value.text.startswith("objectRef.sha256: ")
    assert not called


async def test_the_handler_gets_the_parsed_model_and_its_answer_is_serialised() -> None:
    """Validation and wire serialisation happen once, at the route: models in, camelCase out."""
    seen: list[_Outer] = []

    async def typed(request: _Outer, ctx: RequestContext) -> _Outer:
        seen.append(request)
        return _Outer(object_ref=_Body(sha256=request.object_ref.sha256 + "!"))

    async with peers(Routes(), Routes([Route("stage", _Outer, typed)])) as (left, _, _, _):
        reply = await left.call("stage", {"objectRef": {"sha256": "ab"}}, timeout=2)
    assert seen == [_Outer(object_ref=_Body(sha256="ab"))]
    assert reply == {"objectRef": {"sha256": "ab!"}}


async def test_a_validation_error_inside_the_handler_is_internal_not_the_callers_fault() -> None:
    """Only the request body's validation is invalid-request; the handler's own is a bug
    (`internal`, not retryable: the same request meets the same bug)."""

    async def buggy(request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        _Outer.model_validate({"objectRef": {"sha256": 5}})
        return {}

    async with peers(Routes(), routes_with(stage=buggy)) as (left, _, _, _):
        with pytest.raises(CallFailed) as caught:
            await left.call("stage", {}, timeout=2)
    assert caught.value.error_data == {"code": "internal", "retryable": False}


async def test_unexpected_exception_becomes_internal_without_details() -> None:
    """Any other exception answers code internal, not retryable, with a generic text."""

    async def crash(request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        raise RuntimeError("secret-ish detail")

    async with peers(Routes(), routes_with(boom=crash)) as (left, _, _, _):
        with pytest.raises(CallFailed) as caught:
            await left.call("boom", {}, timeout=2)
    assert caught.value.error_data == {"code": "internal", "retryable": False}
    assert "secret-ish" not in caught.value.text


async def test_call_without_reply_times_out() -> None:
    """A call whose reply never comes raises CallTimeout."""
    never = asyncio.Event()

    async def hang(request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        await never.wait()
        return {}

    async with peers(Routes(), routes_with(hang=hang)) as (left, _, _, _):
        with pytest.raises(CallTimeout):
            await left.call("hang", {}, timeout=0.05)


async def test_retry_resends_the_identical_frame_then_succeeds() -> None:
    """A retry reply makes the caller resend byte-identical frames until answered."""
    ta, tb = transport_pair()
    left = Peer(ta, Routes(), settings=FAST)
    ta.record = True
    run = asyncio.create_task(left.run())
    call = asyncio.create_task(left.call("slow", {"n": 1}, timeout=2))
    first = await tb.recv()
    sent = orjson.loads(first)
    answer = {**sent, "correlation": {**sent["correlation"], "phase": "response"}}
    for _ in range(2):
        await tb.send(orjson.dumps({**answer, "retry": {"waitForMs": 1, "reason": "busy"}}))
        assert await tb.recv() == first
    await tb.send(orjson.dumps({**answer, "response": {"ok": True}}))
    assert await call == {"ok": True}
    tb.close()
    with pytest.raises(SessionClosed):
        await run
    assert ta.sent == [first, first, first]
    assert sent["correlation"]["id"].startswith("uni_")
    assert len(sent["correlation"]["id"]) == 28


async def test_transport_close_fails_pending_calls_with_session_closed() -> None:
    """Closing the transport fails every pending call with SessionClosed."""
    ta, tb = transport_pair()
    left = Peer(ta, Routes(), settings=FAST)
    run = asyncio.create_task(left.run())
    call = asyncio.create_task(left.call("x", {}, timeout=5))
    await tb.recv()
    tb.close()
    with pytest.raises(SessionClosed):
        await call
    with pytest.raises(SessionClosed):
        await run


async def test_retry_limit_fails_the_call() -> None:
    """A peer that keeps answering retry makes the call fail after max_retry_attempts sends."""
    ta, tb = transport_pair()
    left = Peer(ta, Routes(), settings=ConnectionSettings(max_retry_attempts=2))
    run = asyncio.create_task(left.run())
    call = asyncio.create_task(left.call("slow", {}, timeout=2))
    for _ in range(2):
        sent = orjson.loads(await tb.recv())
        answer = {**sent, "correlation": {**sent["correlation"], "phase": "response"}}
        await tb.send(orjson.dumps({**answer, "retry": {"waitForMs": 0, "reason": "busy"}}))
    with pytest.raises(CallFailed) as caught:
        await call
    assert caught.value.error_data["code"] == "retry-exhausted"
    tb.close()
    with pytest.raises(SessionClosed):
        await run


async def serve_raw(
    routes: Routes, settings: ConnectionSettings = FAST, clock: Clock = SYSTEM_CLOCK
) -> tuple[Peer, MemoryTransport, asyncio.Task[None]]:
    """A running peer (on `clock`) and the raw other end of its transport."""
    ta, tb = transport_pair()
    peer = Peer(ta, routes, settings=settings, clock=clock)
    return peer, tb, asyncio.create_task(peer.run())


async def stop(end: MemoryTransport, run: asyncio.Task[None]) -> None:
    end.close()
    with pytest.raises(SessionClosed):
        await run


async def test_malformed_request_with_method_and_id_is_answered() -> None:
    """A request frame with a bad envelope field gets an invalid-request error reply."""
    _, raw, run = await serve_raw(routes_with(echo=echo))
    raw_request = {"method": "echo", "request": {}, "retry": 5}
    await raw.send(orjson.dumps(raw_request | {"correlation": {"id": "c1", "phase": "request"}}))
    out = orjson.loads(await raw.recv())
    assert out["correlation"] == {"id": "c1", "phase": "response"}
    assert out["error"]["data"]["code"] == "invalid-request"
    await stop(raw, run)


async def test_garbage_and_weird_frames_are_dropped_and_the_session_goes_on() -> None:
    """Non-JSON and phase-less frames get no answer and do not end the session."""
    _, raw, run = await serve_raw(routes_with(echo=echo))
    await raw.send(b"\x00 not json")
    await raw.send(b'{"method": "echo", "request": {}}')
    request = {"method": "echo", "request": {"value": 3}, "response": None}
    await raw.send(orjson.dumps(request | {"correlation": {"id": "c2", "phase": "request"}}))
    out = orjson.loads(await raw.recv())
    assert (out["correlation"]["id"], out["response"]["echoed"]) == ("c2", 3)
    await stop(raw, run)


async def test_request_that_is_no_object_is_refused() -> None:
    """request must be a JSON object: anything else answers invalid-request."""
    _, raw, run = await serve_raw(routes_with(echo=echo))
    frame = {"method": "echo", "request": [1], "correlation": {"id": "c3", "phase": "request"}}
    await raw.send(orjson.dumps(frame))
    assert orjson.loads(await raw.recv())["error"]["data"]["code"] == "invalid-request"
    await stop(raw, run)


async def test_stopped_intake_answers_shutting_down() -> None:
    """After stop_intake() every new request is refused with shutting-down, retryable."""
    peer, raw, run = await serve_raw(routes_with(echo=echo))
    peer.stop_intake()
    frame = {"method": "echo", "request": {}, "correlation": {"id": "c4", "phase": "request"}}
    await raw.send(orjson.dumps(frame))
    data = orjson.loads(await raw.recv())["error"]["data"]
    assert data == {"code": "shutting-down", "retryable": True}
    await stop(raw, run)


async def test_drain_waits_for_handlers_then_cancels_and_answers_the_rest() -> None:
    """drain() lets quick handlers finish, cancels slow ones and answers them shutting-down."""
    started, never = asyncio.Event(), asyncio.Event()

    async def slow(request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        started.set()
        await never.wait()
        return {}

    peer, raw, run = await serve_raw(routes_with(slow=slow))
    frame = {"method": "slow", "request": {}, "correlation": {"id": "c5", "phase": "request"}}
    await raw.send(orjson.dumps(frame))
    await started.wait()
    assert peer.in_flight == 1
    await peer.drain(0.01)
    assert peer.in_flight == 0
    out = orjson.loads(await raw.recv())
    assert (out["correlation"]["id"], out["error"]["data"]["code"]) == ("c5", "shutting-down")
    await stop(raw, run)


async def test_the_drain_deadline_runs_on_the_peers_clock() -> None:
    """On a clock moved by hand, the drain ends when the clock passes its deadline, however
    little real time went by: the slow handler is answered shutting-down."""
    clock, started = ManualClock(), asyncio.Event()

    async def slow(request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        started.set()
        await asyncio.Event().wait()
        return {}

    peer, raw, run = await serve_raw(routes_with(slow=slow), clock=clock)
    frame = {"method": "slow", "request": {}, "correlation": {"id": "c7", "phase": "request"}}
    await raw.send(orjson.dumps(frame))
    await started.wait()
    async with asyncio.timeout(10):
        drain = asyncio.create_task(peer.drain(600.0))
        await asyncio.sleep(0)  # the drain's first step: it waits on its deadline
        assert clock.timeouts == [600.0]
        clock.advance(600.0)
        await drain
        out = orjson.loads(await raw.recv())
    assert (out["correlation"]["id"], out["error"]["data"]["code"]) == ("c7", "shutting-down")
    await stop(raw, run)


async def test_closing_the_transport_cancels_running_handlers() -> None:
    """Handler tasks belong to run(): they are cancelled when the session ends."""
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def slow(request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return {}

    _, raw, run = await serve_raw(routes_with(slow=slow))
    frame = {"method": "slow", "request": {}, "correlation": {"id": "c6", "phase": "request"}}
    await raw.send(orjson.dumps(frame))
    await started.wait()
    await stop(raw, run)
    assert cancelled.is_set()


async def test_cancelling_run_fails_pending_calls_with_session_closed() -> None:
    """run() cancelled from outside still fails pending calls instead of leaving them hanging."""
    ta, tb = transport_pair()
    peer = Peer(ta, Routes(), settings=FAST)
    run = asyncio.create_task(peer.run())
    call = asyncio.create_task(peer.call("x", {}, timeout=5))
    await tb.recv()
    run.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run
    with pytest.raises(SessionClosed):
        await call


def test_a_method_is_routed_once() -> None:
    """A route table naming one method twice is refused."""
    with pytest.raises(InvalidState, match="routed twice"):
        Routes([body_route("echo", echo), body_route("echo", echo)])


async def test_a_request_flood_runs_no_more_handlers_than_the_bound() -> None:
    """Beyond `max_concurrent_requests` running handlers, requests are answered `retry`."""
    release, running = asyncio.Event(), 0
    most = 0

    async def slow(request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        nonlocal running, most
        running += 1
        most = max(most, running)
        await release.wait()
        running -= 1
        return {}

    settings = ConnectionSettings(max_concurrent_requests=4, busy_retry_ms=100)
    peer, raw, run = await serve_raw(routes_with(slow=slow), settings)
    for number in range(50):
        frame = {"method": "slow", "request": {}, "response": None}
        frame["correlation"] = {"id": f"f{number}", "phase": "request"}
        await raw.send(orjson.dumps(frame))
    answers = [orjson.loads(await raw.recv()) for _ in range(46)]
    assert {answer["retry"]["waitForMs"] for answer in answers} == {100}
    assert peer.in_flight == 4
    release.set()
    done = [orjson.loads(await raw.recv()) for _ in range(4)]
    assert all(answer["response"] == {} for answer in done)
    assert most == 4
    await stop(raw, run)


async def _as_it_came(request: _Outer, ctx: RequestContext) -> _Outer:
    return request


async def test_a_route_that_can_answer_now_answers_without_its_handler() -> None:
    """`answer_now` answers in the turn that read the request; the handler is not run."""
    handled: list[_Outer] = []

    async def handler(request: _Outer, ctx: RequestContext) -> _Outer:
        handled.append(request)
        return request

    def now(request: _Outer) -> _Outer:
        return _Outer(object_ref=_Body(sha256=request.object_ref.sha256 + " now"))

    route = Route("status", _Outer, handler, answer_now=now)
    async with peers(Routes(), Routes([route])) as (left, _, _, _):
        reply = await left.call("status", {"objectRef": {"sha256": "ab"}}, timeout=2)
    assert (reply, handled) == ({"objectRef": {"sha256": "ab now"}}, [])


async def test_an_answer_now_of_none_leaves_the_request_to_its_handler() -> None:
    """None from `answer_now` (not in memory): the handler answers the usual way, given the
    very model `answer_now` saw (the body is parsed once)."""
    seen: list[_Outer] = []

    async def handler(request: _Outer, ctx: RequestContext) -> _Outer:
        seen.append(request)
        return _Outer(object_ref=_Body(sha256="read"))

    def not_in_memory(request: _Outer) -> None:
        seen.append(request)

    route = Route("status", _Outer, handler, answer_now=not_in_memory)
    async with peers(Routes(), Routes([route])) as (left, _, _, _):
        reply = await left.call("status", {"objectRef": {"sha256": "ab"}}, timeout=2)
    assert reply == {"objectRef": {"sha256": "read"}}
    assert len(seen) == 2
    assert seen[0] is seen[1]


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (RestoreNotFound("no restore r1"), {"code": "restore-not-found", "retryable": False}),
        (KeyError("secret detail"), {"code": "internal", "retryable": False}),
    ],
)
async def test_what_answer_now_raises_is_answered_as_from_a_handler(
    error: Exception, expected: dict[str, Any]
) -> None:
    """An AgentError from `answer_now` travels with its code; anything else is internal with
    the generic text, as from a handler."""

    def raising(request: _Outer) -> _Outer:
        raise error

    route = Route("status", _Outer, _as_it_came, answer_now=raising)
    async with peers(Routes(), Routes([route])) as (left, _, _, _):
        with pytest.raises(CallFailed) as caught:
            await left.call("status", {"objectRef": {"sha256": "ab"}}, timeout=2)
    assert caught.value.error_data == expected
    assert "secret detail" not in caught.value.text


async def test_a_body_the_model_refuses_never_reaches_answer_now() -> None:
    """invalid-request, as for a handler: `answer_now` gets only a parsed model."""
    seen: list[_Outer] = []

    def now(request: _Outer) -> _Outer:
        seen.append(request)
        return request

    route = Route("status", _Outer, _as_it_came, answer_now=now)
    async with peers(Routes(), Routes([route])) as (left, _, _, _):
        with pytest.raises(CallFailed) as caught:
            await left.call("status", {"objectRef": {}}, timeout=2)
    assert (caught.value.error_data["code"], seen) == ("invalid-request", [])
