"""Execute: the engine's own task restores and verifies; failures end `failed`; a restart
leaves the state visible and a replayed execute resumes it."""

from __future__ import annotations

from typing import Any

from agent.contracts.isolatedrestore import METHOD_EXECUTE
from agent.corestore.routes import RouteName
from agent.domain.restores import StoredState


async def _execute_until_settled(world: Any) -> StoredState:
    revision = await world.ready_to_execute()
    assert (await world.execute(revision))["status"] == "restoring"
    settled: StoredState = await world.until("ready", "failed")
    return settled


async def test_a_failed_verification_ends_failed_with_verification_failed(world: Any) -> None:
    """Staged bytes damaged at Corestore restore fine but fail content-sha256."""
    revision = await world.ready_to_execute()
    damaged = world.staged_file("snap-os/media/logo.png")
    data = bytearray(damaged.read_bytes())
    data[0] ^= 0xFF
    damaged.write_bytes(bytes(data))
    await world.execute(revision)
    state = await world.settled("ready", "failed")
    assert state["status"] == "failed"
    assert state["lastErrorCode"] == "verification-failed"
    assert "map-os" in state["lastErrorMessage"]
    assert "content-sha256" in state["lastErrorMessage"]
    verification = state["verification"]
    assert verification["status"] == "failed"
    by_id = {r["resourceMappingId"]: r for r in verification["results"]}
    assert (by_id["map-db"]["status"], by_id["map-os"]["status"]) == ("passed", "failed")
    assert "readyAt" not in state


async def test_corestore_unavailable_ends_failed_after_the_clients_retries(world: Any) -> None:
    """Every send answers 503: the client's two sends with one backoff between them, no engine
    retry on top, then failed with corestore-unavailable."""
    world.corestore.faults.fail_next(RouteName.RESTORE_RESOURCE, status=503, times=100)
    revision = await world.ready_to_execute()
    waited = len(world.clock.slept)
    assert (await world.execute(revision))["status"] == "restoring"
    state = await world.settled("ready", "failed")
    assert state["status"] == "failed"
    assert state["lastErrorCode"] == "corestore-unavailable"
    assert world.corestore.faults.hits[RouteName.RESTORE_RESOURCE] == 2
    assert world.clock.slept[waited:] == [0.01]  # the client's one backoff
    assert state["completedResourceMappingIds"] == []


async def test_corestore_refusing_a_restore_ends_failed_without_retrying(world: Any) -> None:
    """A 4xx is not retried: one call, failed with corestore-refused."""
    world.corestore.faults.fail_next(RouteName.RESTORE_RESOURCE, status=409)
    state = (await _execute_until_settled(world)).state.to_wire()
    assert (state["status"], state["lastErrorCode"]) == ("failed", "corestore-refused")
    assert world.corestore.faults.hits[RouteName.RESTORE_RESOURCE] == 1


async def test_a_resource_restore_that_fails_at_corestore_ends_failed(world: Any) -> None:
    """Corestore reports the restore failed (its staged object vanished): restore-failed."""
    revision = await world.ready_to_execute()
    world.staged_file("snap-db/dump.bson").unlink()
    await world.execute(revision)
    state = await world.settled("ready", "failed")
    assert (state["status"], state["lastErrorCode"]) == ("failed", "restore-failed")
    assert "map-db" in state["lastErrorMessage"]


async def test_verification_unavailable_ends_failed_with_its_code(world: Any) -> None:
    """A verify call that never answers ends failed (from verifying) with its code."""
    world.corestore.faults.fail_next(RouteName.VERIFY_RESOURCE, status=500, times=100)
    state = (await _execute_until_settled(world)).state.to_wire()
    assert (state["status"], state["lastErrorCode"]) == ("failed", "corestore-unavailable")
    assert state["verification"]["status"] == "failed"
    assert sorted(state["completedResourceMappingIds"]) == ["map-db", "map-os"]


async def test_a_restart_mid_execute_keeps_the_state_and_a_replay_resumes_it(
    world: Any,
) -> None:
    """Close the engine after one mapping; a new engine shows restoring; the replay finishes."""
    revision = await world.ready_to_execute()
    faults = world.corestore.faults

    def stall_after_the_first_mapping(stored: StoredState) -> None:
        # Runs inside the work task, before its next call: the restore of map-os then hangs
        # at Corestore's door (before Corestore starts anything) until the engine is closed.
        if stored.state.completed_resource_mapping_ids == ["map-db"]:
            faults.delay_next(RouteName.RESTORE_RESOURCE, seconds=60)

    world.engine.observe(stall_after_the_first_mapping)
    body = world.execute_body(revision)
    await world.call(METHOD_EXECUTE, body)
    await world.reached(lambda s: s.state.completed_resource_mapping_ids == ["map-db"])
    await world.restart()

    unfinished = (await world.status())["state"]
    assert unfinished["status"] == "restoring"
    assert unfinished["completedResourceMappingIds"] == ["map-db"]
    assert world.engine.owner.working(world.KEY) is False

    restores = faults.hits[RouteName.RESTORE_RESOURCE]
    answer = await world.call(METHOD_EXECUTE, {**body, "restoreGrant": world.grant()})
    assert answer["state"] == unfinished
    assert (await world.until("ready", "failed")).status == "ready"
    assert faults.hits[RouteName.RESTORE_RESOURCE] - restores == 1  # map-os only
