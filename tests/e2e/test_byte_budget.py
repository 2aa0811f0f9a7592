"""One byte budget, end to end: eight stages at once in the real agent, with a budget that holds
far less than they would take, all stage their objects intact; some waited for room (never
failed for it), and the bytes drawn never passed the budget."""

from __future__ import annotations

import asyncio
import dataclasses
import re
from typing import Any

import aiohttp
import pytest

from devstack.driver import RestorePlan

MiB = 1024 * 1024
BUDGET = 16 * MiB  # the least the configuration allows (with 8 MiB frames: twice them)
STAGES = 8


@pytest.fixture
def big_size() -> int:
    """Each volume image four chunks of 2 MiB."""
    return 8 * MiB


async def _metrics(stack: Any) -> str:
    async with aiohttp.ClientSession() as http, http.get(f"http://{stack.health}/metrics") as got:
        return await got.text()


def _sample(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    assert match is not None, name
    return float(match.group(1))


async def test_stages_beyond_the_byte_budget_wait_for_it_and_never_pass_it(
    stack: Any, plan: RestorePlan
) -> None:
    plans = [
        dataclasses.replace(
            plan,
            restore_id=f"restore-budget-{n}",
            staging_archive_id=f"staging-budget-{n}",
            scratch_namespace_id=f"scratch-budget-{n}",
        )
        for n in range(STAGES)
    ]
    drivers = [stack.driver(p) for p in plans]
    held: list[float] = []
    async with stack.agent(
        max_transfers_per_node=STAGES,
        chunk_size=2 * MiB,
        memory={"budget_bytes": BUDGET},
        cloudly={"max_frame_bytes": 8 * MiB},
    ):
        for driver in drivers:
            await driver.prepare()
        stages = asyncio.gather(*(d.stage("snap-vol/volume.img") for d in drivers))
        while not stages.done():
            held.append(_sample(await _metrics(stack), "restore_agent_byte_budget_held_bytes"))
            await asyncio.wait({stages}, timeout=0.01)
        states = await stages
        text = await _metrics(stack)
    assert [state["status"] for state in states] == ["staging"] * STAGES
    for driver in drivers:
        volume = driver.plan.object("snap-vol/volume.img")
        assert stack.staged_digest(driver.plan, volume.path) == volume.sha256
    assert _sample(text, "restore_agent_byte_budget_bytes") == BUDGET
    assert max(held) <= BUDGET
    waits = _sample(text, "restore_agent_byte_budget_wait_duration_seconds_count")
    at_once = _sample(text, 'restore_agent_byte_budget_wait_duration_seconds_bucket{le="0.001"}')
    assert waits > at_once  # some draws waited for room
