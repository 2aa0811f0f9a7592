"""The configured transfer timeout and poll interval reach the engine and bound its work."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from agent.config import CorestoreConfig
from agent.corestore.routes import RouteName
from agent.errors import CorestoreUnavailable, InvalidState
from agent.restore.settings import EngineSettings

DUMP = "snap-db/dump.bson"
TRANSFER_TIMEOUT = 0.2
POLL_INTERVAL = 0.0123  # recognisable among the recorded sleeps


@pytest.fixture
def settings(settings: EngineSettings) -> EngineSettings:
    """The shared fast settings with a short transfer timeout and a recognisable poll interval."""
    return dataclasses.replace(
        settings, transfer_timeout=TRANSFER_TIMEOUT, poll_interval=POLL_INTERVAL
    )


def test_engine_settings_take_the_corestore_section() -> None:
    """from_config carries chunking, the transfer timeout and the poll interval; `retries` is
    the Corestore client's alone, so nothing else of the engine changes."""
    corestore = CorestoreConfig(
        chunk_size=128 * 1024,
        max_in_flight=2,
        retries=5,
        transfer_timeout_s=42.0,
        restore_poll_interval_s=0.05,
    )
    assert EngineSettings.from_config(corestore) == EngineSettings(
        chunk_size=128 * 1024, max_in_flight=2, transfer_timeout=42.0, poll_interval=0.05
    )


def test_the_default_section_keeps_the_engine_defaults() -> None:
    """Without the keys: a 300 s transfer bound and one status read per second."""
    settings = EngineSettings.from_config(CorestoreConfig())
    assert (settings.transfer_timeout, settings.poll_interval) == (300.0, 1.0)


@pytest.mark.parametrize("timeout", [0.0, -1.0])
def test_a_transfer_timeout_that_is_not_positive_is_refused(timeout: float) -> None:
    """A transfer that may take no time at all is a bug, refused at construction."""
    with pytest.raises(InvalidState, match="transfer_timeout"):
        EngineSettings(transfer_timeout=timeout)


@pytest.mark.parametrize(
    ("route", "attempts"),
    [
        (RouteName.PUT_CHUNK, 2),  # the client's retries of an idempotent PUT
        (RouteName.COMMIT_OBJECT, 3),  # the engine's commit attempts (progress read between)
    ],
)
async def test_a_bulk_call_outlasting_the_transfer_timeout_ends_corestore_unavailable(
    world: Any, route: RouteName, attempts: int
) -> None:
    """Corestore stalls every attempt for 30 s; each is cut at 0.2 s: corestore-unavailable,
    no new revision."""
    prepared = await world.prepare()
    faults = world.corestore.faults
    faults.delay_next(route, seconds=30.0, times=100)
    with pytest.raises(CorestoreUnavailable) as caught:
        await world.stage(DUMP, prepared["revision"])
    assert caught.value.code == "corestore-unavailable"
    assert faults.hits[route] == attempts
    assert (await world.status())["state"]["revision"] == prepared["revision"]


async def test_the_engine_polls_a_running_resource_restore_at_the_poll_interval(
    world: Any,
) -> None:
    """Corestore answers a started restore `running`; the engine waits poll_interval between
    status reads, once per mapping at least."""
    revision = await world.ready_to_execute()
    await world.execute(revision)
    assert (await world.until("ready", "failed")).status == "ready"
    assert world.clock.slept.count(POLL_INTERVAL) >= 2
    assert world.corestore.faults.hits[RouteName.RESOURCE_STATUS] >= 2
