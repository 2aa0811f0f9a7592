"""An execute through a Corestore that restarts: the polls ride the outage out.

The clients here have the agent's default patience (`[corestore] outage_tolerance_s`, 120 s,
and its 0.25 s .. 5 s backoff); the clock moves through every backoff at once.
"""

from __future__ import annotations

from typing import Any

import pytest

from agent.corestore.routes import RouteName
from agent.retry import Backoff, RetryPolicy


@pytest.fixture
def client_retry() -> RetryPolicy:
    """The agent's defaults: four sends, and more while an outage is under two minutes old."""
    return RetryPolicy(attempts=4, backoff=Backoff(base=0.25, cap=5.0), tolerance=120.0)


async def test_an_execute_rides_out_twenty_503s_on_its_status_polls(world: Any) -> None:
    """Twenty 503s on the resource-status poll (about 80 s of backoff) during execute: the
    restore ends `ready`, where it used to end `failed: corestore-unavailable` after four."""
    revision = await world.ready_to_execute()
    world.corestore.faults.fail_next(RouteName.RESOURCE_STATUS, status=503, times=20)
    slept = len(world.clock.slept)
    await world.execute(revision)
    state = await world.settled("ready", "failed")
    assert (state["status"], state.get("lastErrorCode")) == ("ready", None)
    assert world.corestore.faults.hits[RouteName.RESOURCE_STATUS] >= 21
    assert 60.0 < sum(world.clock.slept[slept:]) < 120.0


async def test_an_outage_past_the_tolerance_ends_the_execute_failed_and_says_so(
    world: Any,
) -> None:
    """Corestore stays away: the polls give up once the outage is two minutes old, and the
    restore ends `failed` with `corestore-unavailable` (which Cloudly's exact replay resumes)."""
    revision = await world.ready_to_execute()
    world.corestore.faults.fail_next(RouteName.RESOURCE_STATUS, status=503, times=10_000)
    await world.execute(revision)
    state = await world.settled("ready", "failed")
    assert (state["status"], state["lastErrorCode"]) == ("failed", "corestore-unavailable")
    assert "attempt" in state["lastErrorMessage"]
