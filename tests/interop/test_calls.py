"""Calls both ways between the agent's session and the real typedrequest 3.3.0, errors and retry.

The stand-in Cloudly (tests/interop/cloudly.mjs) fires through the library's `TypedRequest.fire`
and serves with its `TypedRouter`, so every reply shape asserted here is what the published
library produces or accepts.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest

from agent.contracts.base import NonNegativeSafeInt, WireModel
from agent.errors import CallFailed, RevisionConflict
from agent.protocol.delivery import Mark
from agent.protocol.handlers import RequestContext, Route
from agent.protocol.intake import UNKNOWN_METHOD_TEXT

if TYPE_CHECKING:
    from tests.interop.conftest import AgentUnderTest, NodeCloudly

pytestmark = pytest.mark.interop

LIBRARY_UNKNOWN_METHOD = "There is no available method for this call on the server side"


class DescribeNode(WireModel):
    """A small typed request the agent serves in these tests."""

    node_id: str
    since_revision: NonNegativeSafeInt


class NodeDescription(WireModel):
    node_id: str
    next_revision: NonNegativeSafeInt
    method: str


class Nothing(WireModel):
    pass


async def describe_node(request: DescribeNode, ctx: RequestContext) -> NodeDescription:
    """Answers with facts derived from the validated request."""
    return NodeDescription(
        node_id=request.node_id, next_revision=request.since_revision + 1, method=ctx.method
    )


async def refuse_with_conflict(request: Nothing, ctx: RequestContext) -> Nothing:
    """Always refuses the way the restore engine does on a stale expectedRevision."""
    del request, ctx
    raise RevisionConflict(expected=3, current=5, status="staged")


DESCRIBE_NODE = Route("describeNode", DescribeNode, describe_node)


async def test_cloudly_call_reaches_agent_handler_and_gets_typed_reply(
    cloudly: NodeCloudly, agent: AgentUnderTest
) -> None:
    """TypedRequest.fire from Node is routed to the agent's handler; the reply comes back typed."""
    agent.serve(DESCRIBE_NODE)
    async with agent.running():
        reply = await cloudly.command(
            "fire", method="describeNode", request={"nodeId": "node-1", "sinceRevision": 41}
        )
    assert reply["ok"] is True, reply
    assert reply["response"] == {"nodeId": "node-1", "nextRevision": 42, "method": "describeNode"}
    assert reply["sends"] == 1


async def test_agent_call_reaches_cloudly_and_gets_the_reply(
    cloudly: NodeCloudly, agent: AgentUnderTest
) -> None:
    """The agent's call to Cloudly's `echo` returns exactly what the library handler answered."""
    body = {"text": "grüße", "n": 2**53 - 1, "nested": {"list": [1, None, True]}}
    async with agent.running():
        response = await agent.session.call("echo", body, timeout=10)
    assert response == body
    events = await cloudly.events()
    assert [c["request"] for c in events["calls"] if c["method"] == "echo"] == [body]


async def test_agent_refusal_reaches_cloudly_as_typed_response_error(
    cloudly: NodeCloudly, agent: AgentUnderTest
) -> None:
    """An AgentError in a handler is a TypedResponseError in Node: errorText and errorData.code."""
    agent.serve(Route("mutateRestore", Nothing, refuse_with_conflict))
    async with agent.running():
        reply = await cloudly.command("fire", method="mutateRestore", request={})
    assert reply["ok"] is False
    assert reply["errorText"] == "expectedRevision 3 is not the current revision 5"
    assert reply["errorData"] == {
        "code": "revision-conflict",
        "retryable": False,
        "currentRevision": 5,
        "status": "staged",
    }


async def test_invalid_request_reaches_cloudly_naming_the_field(
    cloudly: NodeCloudly, agent: AgentUnderTest
) -> None:
    """A request failing the contract is refused as invalid-request naming the camelCase field."""
    agent.serve(DESCRIBE_NODE)
    async with agent.running():
        reply = await cloudly.command(
            "fire", method="describeNode", request={"nodeId": "node-1", "sinceRevision": "41"}
        )
    assert reply["ok"] is False
    assert reply["errorData"]["code"] == "invalid-request"
    assert reply["errorText"].startswith("sinceRevision")


async def test_unknown_method_at_the_agent_gets_the_library_text(
    cloudly: NodeCloudly, agent: AgentUnderTest
) -> None:
    """Node calling a method the agent does not serve gets the library's own text plus a code."""
    async with agent.running():
        reply = await cloudly.command("fire", method="noSuchMethod", request={})
    assert reply["ok"] is False
    assert reply["errorText"] == LIBRARY_UNKNOWN_METHOD == UNKNOWN_METHOD_TEXT
    assert reply["errorData"] == {"code": "unknown-method", "retryable": False}


async def test_unknown_method_at_cloudly_is_call_failed_with_the_library_text(
    agent: AgentUnderTest,
) -> None:
    """The agent calling a method the library does not serve gets CallFailed with its text."""
    async with agent.running():
        with pytest.raises(CallFailed) as failed:
            await agent.session.call("noSuchMethod", {}, timeout=10)
    assert failed.value.text == LIBRARY_UNKNOWN_METHOD
    assert failed.value.error_data == {}


async def test_cloudly_typed_error_reaches_agent_as_call_failed(agent: AgentUnderTest) -> None:
    """A TypedResponseError thrown by a library handler is CallFailed with its text and data."""
    data = {"code": "grant-invalid", "retryable": False, "detail": [1, 2]}
    async with agent.running():
        with pytest.raises(CallFailed) as failed:
            await agent.session.call(
                "failWithError", {"text": "the grant expired", "data": data}, timeout=10
            )
    assert failed.value.method == "failWithError"
    assert failed.value.text == "the grant expired"
    assert failed.value.error_data == data


async def test_cloudly_handler_crash_is_call_failed_not_an_empty_success(
    agent: AgentUnderTest,
) -> None:
    """A plain Error in a library handler (response null, no error) is not mistaken for {}."""
    async with agent.running():
        with pytest.raises(CallFailed) as failed:
            await agent.session.call("throwPlainError", {}, timeout=10)
    assert failed.value.error_data["code"] == "no-response"


async def test_retry_answer_makes_the_agent_resend_the_identical_frame(
    cloudly: NodeCloudly, agent: AgentUnderTest
) -> None:
    """Cloudly's `retry` is honoured: the same frame again, same correlation id, then success."""
    async with agent.running():
        response = await agent.session.call(
            "retryOnce", {"key": "retry-key-1", "waitForMs": 20}, timeout=10
        )
    assert response == {"attempts": 2, "key": "retry-key-1", "sameCorrelationId": True}
    frames = (await cloudly.command("frames", since=0))["frames"]
    sent = [f["frame"] for f in frames if f["dir"] == "in" and f["frame"]["method"] == "retryOnce"]
    assert len(sent) == 2
    assert sent[0] == sent[1]


async def test_an_answer_to_the_library_is_confirmed_by_its_websockets_pong(
    cloudly: NodeCloudly, agent: AgentUnderTest
) -> None:
    """The ping rule against Node's `ws`: the agent writes a ping right behind its answer, the
    library's websocket answers it (it pongs on its own), and the handler hears the answer was
    delivered, on the connection the request arrived on."""
    delivered: list[Mark] = []
    arrivals: list[Mark] = []
    heard = asyncio.Event()

    def on_delivered(mark: Mark) -> None:
        delivered.append(mark)
        heard.set()

    async def describe_and_watch(request: DescribeNode, ctx: RequestContext) -> NodeDescription:
        arrivals.append(ctx.arrival)
        ctx.on_delivered(on_delivered)
        return await describe_node(request, ctx)

    agent.serve(Route("describeNode", DescribeNode, describe_and_watch))
    async with agent.running():
        reply = await cloudly.command(
            "fire", method="describeNode", request={"nodeId": "node-1", "sinceRevision": 1}
        )
        async with asyncio.timeout(10):  # a guard: the pong follows the reply at once
            await heard.wait()
    assert reply["ok"] is True, reply
    [arrival] = arrivals
    [mark] = delivered
    assert mark.connection == arrival.connection
