"""The bound of one resource restore (`restore_timeout`) runs on the engine's clock, like the
waits between Corestore's status reads it bounds."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest

from agent.restore.settings import EngineSettings

POLL_INTERVAL = 10.0
RESTORE_TIMEOUT = 30.0


@pytest.fixture
def settings(settings: EngineSettings) -> EngineSettings:
    """Status reads 10 s apart, a restore bounded to 30 s (of the test's hand-moved clock)."""
    return dataclasses.replace(
        settings, poll_interval=POLL_INTERVAL, restore_timeout=RESTORE_TIMEOUT
    )


async def test_a_resource_restore_outlasting_the_restore_timeout_fails_the_restore(
    world: Any,
) -> None:
    """Corestore keeps the restore `running`: once three 10 s waits moved the clock to the 30 s
    bound, the restore is `failed` with `corestore-unavailable`, though hardly any real time
    passed."""
    revision = await world.ready_to_execute()
    world.corestore.faults.hold_restores()
    try:
        await world.execute(revision)
        async with asyncio.timeout(10):  # a guard against a hang, not a synchronisation
            settled = await world.until("ready", "failed")
    finally:
        world.corestore.faults.release_restores()
    assert settled.status == "failed"
    assert settled.state.last_error_code == "corestore-unavailable"
    assert "map-db within 30 s" in (settled.state.last_error_message or "")
    assert world.clock.slept.count(POLL_INTERVAL) == 3
