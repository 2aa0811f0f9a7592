"""The configured transfer timeout and poll interval bound the engine's work: the poll interval
is the engine's setting, the transfer timeout the Corestore clients' (one bulk request each);
the relay bounds Cloudly's answers to its closure calls by `[cloudly] call_timeout_s`."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from agent.config import CloudlyConfig, Config, CorestoreConfig
from agent.corestore.routes import RouteName
from agent.corestore.transport import CorestoreTimeouts
from agent.errors import CorestoreUnavailable, InvalidState
from agent.relay.settings import RelaySettings
from agent.restore.settings import EngineSettings

DUMP = "snap-db/dump.bson"
TRANSFER_TIMEOUT = 0.2
POLL_INTERVAL = 0.0123  # recognisable among the recorded sleeps


@pytest.fixture
def settings(settings: EngineSettings) -> EngineSettings:
    """The shared fast settings with a recognisable poll interval."""
    return dataclasses.replace(settings, poll_interval=POLL_INTERVAL)


@pytest.fixture
def transfer_timeout() -> float:
    """A short bound of one bulk Corestore call."""
    return TRANSFER_TIMEOUT


_SECTION = CorestoreConfig(
    chunk_size=128 * 1024,
    max_in_flight=2,
    retries=5,
    connect_timeout_s=3.0,
    request_timeout_s=7.0,
    transfer_timeout_s=42.0,
    restore_poll_interval_s=0.05,
)


def test_engine_settings_take_the_corestore_section() -> None:
    """engine_settings() carries chunking and the poll interval; `retries` and the timeouts are the
    Corestore client's alone, so nothing else of the engine changes."""
    assert _SECTION.engine_settings() == EngineSettings(
        chunk_size=128 * 1024, max_in_flight=2, poll_interval=0.05
    )


def test_the_corestore_clients_take_the_transfer_timeout_of_the_section() -> None:
    """The clients' timeouts carry connect, request and transfer as configured."""
    assert _SECTION.timeouts() == CorestoreTimeouts(connect=3.0, control=7.0, transfer=42.0)


def test_the_relay_takes_the_chunk_size_and_the_call_timeout() -> None:
    """The relay's closures use the section's chunk size, and bound Cloudly's answer to each
    closure call by `[cloudly] call_timeout_s` (never a whole transfer: that is bounded by its
    progress)."""
    cloudly = CloudlyConfig(url="wss://cloudly.example", token_file=Path("t"), call_timeout_s=9)
    assert Config(cloudly=cloudly, corestore=_SECTION).relay_settings() == RelaySettings(
        chunk_size=128 * 1024, answer_timeout=9.0
    )


def test_the_default_section_keeps_the_engine_defaults() -> None:
    """Without the keys: a 300 s bound on one bulk Corestore request, one status read per
    second, 30 s for Cloudly's answer to a closure call."""
    settings = CorestoreConfig().engine_settings()
    timeouts = CorestoreConfig().timeouts()
    assert (timeouts.transfer, settings.poll_interval) == (300.0, 1.0)
    assert RelaySettings().answer_timeout == 30.0


@pytest.mark.parametrize("timeout", [0.0, -1.0])
def test_a_transfer_timeout_that_is_not_positive_is_refused(timeout: float) -> None:
    """A bound that allows no time at all is a bug, refused at construction (by the Corestore
    clients' timeouts and by the relay's settings)."""
    with pytest.raises(InvalidState, match="transfer"):
        CorestoreTimeouts(transfer=timeout)
    with pytest.raises(InvalidState, match="answer_timeout"):
        RelaySettings(answer_timeout=timeout)


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
