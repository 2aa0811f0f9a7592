"""Two agents with one machine token against one Cloudly (readme.md, "Where it runs"): each
retires the other's recipient at every enrollment; each says so (the `duplicate-agent`
condition, a readiness reason, one error line) instead of the two silently taking turns, and
says it no longer once the other stops. One agent alone never does."""

from __future__ import annotations

import asyncio
import io
import json
from dataclasses import replace
from typing import Any

from agent.watch.overview import readiness
from agent.watch.status import DUPLICATE_AGENT, AgentStatus, StatusSnapshot

FAST_CHECKS: dict[str, Any] = {"recipient_check_s": 0.05}


def _contested(snapshot: StatusSnapshot) -> bool:
    return DUPLICATE_AGENT in snapshot.conditions


async def _until_contested(status: AgentStatus) -> StatusSnapshot:
    async with asyncio.timeout(20):
        return await status.wait_until(_contested)


async def test_two_agents_with_one_token_each_say_there_is_another(
    stack: Any, captured_logs: io.StringIO
) -> None:
    second = replace(stack, state_dir=stack.tmp / "second-agent")
    async with stack.agent(cloudly=FAST_CHECKS) as one, second.agent(cloudly=FAST_CHECKS) as two:
        seen = [await _until_contested(one), await _until_contested(two)]
    for snapshot in seen:
        reasons = readiness(snapshot, store_open=True, now=snapshot.state_since, stale_after=60)
        assert "run one agent per cluster" in reasons[DUPLICATE_AGENT]
    lines = [json.loads(line) for line in captured_logs.getvalue().splitlines()]
    errors = [line for line in lines if line.get("event") == "duplicate_agent_suspected"]
    assert len(errors) == 2  # one per agent
    assert {line["level"] for line in errors} == {"error"}


async def test_the_condition_ends_once_the_other_agent_stops(stack: Any) -> None:
    second = replace(stack, state_dir=stack.tmp / "second-agent")
    async with stack.agent(cloudly=FAST_CHECKS) as one:
        async with second.agent(cloudly=FAST_CHECKS):
            await _until_contested(one)
        async with asyncio.timeout(20):
            await one.wait_until(lambda snapshot: not _contested(snapshot))


async def test_one_agent_alone_is_never_contested(stack: Any) -> None:
    """Ten checks that each asked Cloudly for material: the recipient stayed enrolled."""
    async with stack.agent(cloudly=FAST_CHECKS) as one:
        async with asyncio.timeout(20):
            await stack.cloudly.wait_for("credential-sealed", 10)
        assert not _contested(one.snapshot())
