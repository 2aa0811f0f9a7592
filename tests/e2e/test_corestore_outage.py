"""A Corestore that answers 503 to everything for a while, through the real agent.

The storm is the reference Corestore's (`Faults.fail_for`, on the real clock); the agent's
patience is its configured `outage_tolerance_s`. The full-size run (a 60 s storm, default
settings) is recorded with docs/benchmarks.md's far-link figures; this one is scaled down.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from agent.corestore.routes import RouteName
from devstack.driver import RestorePlan


async def _readyz(stack: Any) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.get(f"http://{stack.health}/readyz") as got:
        body: dict[str, Any] = await got.json()
        return body


async def test_a_503_storm_during_execute_is_ridden_out_and_readiness_names_it(
    stack: Any, plan: RestorePlan
) -> None:
    """Every resource-status poll answers 503 for 2 s while the restore executes: the agent
    keeps polling (its tolerance is 30 s), `/readyz` names the node's Corestore as unavailable
    since the storm began (the condition `corestore-unavailable`, no readiness reason: the
    other nodes are served), and the restore ends `ready`; afterwards the condition is gone."""
    driver = stack.driver(plan)
    async with asyncio.timeout(60), stack.agent(outage_tolerance_s=30):
        await driver.prepare()
        await driver.stage_all()
        first_poll = stack.hits[RouteName.RESOURCE_STATUS] + 1
        stack.on_hit(
            RouteName.RESOURCE_STATUS,
            first_poll,
            lambda: stack.faults.fail_for(RouteName.RESOURCE_STATUS, 2.0),
        )
        await driver.execute()
        await stack.wait_hits(RouteName.RESOURCE_STATUS, first_poll + 2)
        during = await _readyz(stack)
        ready = await driver.wait_until({"ready", "failed"})
        after = await _readyz(stack)
    assert ready["status"] == "ready", ready.get("lastErrorCode")
    condition = during["conditions"]["corestore-unavailable"]
    assert condition["text"].startswith(f"the Corestore of {plan.node} since ")
    assert isinstance(condition["since"], int)
    assert "corestore-unavailable" not in during["reasons"]
    assert "corestore-unavailable" not in after["conditions"]
