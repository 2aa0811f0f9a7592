"""The least byte budget the configuration allows with the default frames (twice `[cloudly]
max_frame_bytes`, 32 MiB) stages an object on a session that has seen no chunk frame yet, from
a Cloudly that opens each stream with a probe (as typedrequest 3.3.0 does): the invitation of
the first frame fits beside the buffers the stage drew, instead of waiting behind them."""

from __future__ import annotations

from typing import Any

import pytest

from devstack.driver import RestorePlan

MiB = 1024 * 1024


@pytest.fixture
def big_size() -> int:
    """Eight chunks of 4 MiB (the default): the stage draws five buffers, 20 MiB of 32."""
    return 32 * MiB


async def test_a_stage_on_a_fresh_session_moves_within_the_least_budget_allowed(
    stack: Any, plan: RestorePlan
) -> None:
    driver = stack.driver(plan, piece_size=1 * MiB)
    async with stack.agent(chunk_size=4 * MiB, memory={"budget_bytes": 32 * MiB}):
        await driver.prepare()
        state = await driver.stage("snap-vol/volume.img")
    assert state["status"] == "staging"
    volume = driver.plan.object("snap-vol/volume.img")
    assert stack.staged_digest(driver.plan, volume.path) == volume.sha256
