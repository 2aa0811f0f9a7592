"""Cleanup: per resource with attempts, idempotent, retryable after cleanup-failed."""

from __future__ import annotations

from typing import Any

import pytest

from agent.contracts.isolatedrestore import METHOD_CLEANUP
from agent.corestore.routes import RouteName
from agent.errors import IllegalTransition
from agent.secret import Secret


async def _ready(world: Any) -> int:
    revision = await world.ready_to_execute()
    await world.execute(revision)
    stored = await world.until("ready")
    return int(stored.revision)


async def test_cleanup_deletes_each_resource_then_the_staging_archive(world: Any) -> None:
    """One entry per mapping plus the archive; each succeeded after one attempt."""
    revision = await _ready(world)
    started = await world.cleanup(revision)
    assert started["status"] == "cleaning"
    assert [e["status"] for e in started["cleanup"]["resources"]] == ["pending", "pending"]
    cleaned = await world.settled("cleaned", "cleanup-failed")
    assert cleaned["status"] == "cleaned"
    resources = cleaned["cleanup"]["resources"]
    assert [(e["resourceMappingId"], e["resourceType"]) for e in resources] == [
        ("map-db", "database"),
        ("map-os", "objectstorage"),
    ]
    assert all((e["status"], e["attempts"]) == ("succeeded", 1) for e in resources)
    archive = cleaned["cleanup"]["stagingArchive"]
    assert (archive["stagingArchiveId"], archive["status"], archive["attempts"]) == (
        "staging-1",
        "succeeded",
        1,
    )
    assert world.data_files() == []


async def test_a_resource_corestore_no_longer_has_counts_as_cleaned(world: Any) -> None:
    """Deleted behind the engine's back: Corestore's not-found answer is a success."""
    revision = await _ready(world)
    client = world.clients.client_for(world.NODE, world.corestore.url)
    await client.delete_resource("restore-1", "map-db", Secret(world.grant()))
    await world.cleanup(revision)
    cleaned = await world.settled("cleaned", "cleanup-failed")
    assert cleaned["status"] == "cleaned"
    assert cleaned["cleanup"]["resources"][0]["status"] == "succeeded"


async def test_cleanup_of_a_restore_never_executed_succeeds(world: Any) -> None:
    """From prepared: nothing was restored, so every resource is already gone."""
    prepared = await world.prepare()
    await world.cleanup(prepared["revision"])
    assert (await world.until("cleaned", "cleanup-failed")).status == "cleaned"
    assert world.data_files() == []


async def test_cleanup_failed_is_retryable_and_converges_once_corestore_recovers(
    world: Any,
) -> None:
    """Deletes fail: one try per entry (the client's two sends, no engine retry on top), then
    cleanup-failed with per-entry errors; a new cleanup retries only the failed entries."""
    revision = await _ready(world)
    faults = world.corestore.faults
    faults.fail_next(RouteName.DELETE_RESOURCE, status=503, times=100)
    waited = len(world.clock.slept)
    await world.cleanup(revision)
    failed = await world.settled("cleaned", "cleanup-failed")
    assert failed["status"] == "cleanup-failed"
    assert failed["lastErrorCode"] == "corestore-unavailable"
    for entry in failed["cleanup"]["resources"]:
        assert (entry["status"], entry["attempts"]) == ("failed", 1)
        assert entry["errorCode"] == "corestore-unavailable"
    assert failed["cleanup"]["stagingArchive"]["status"] == "succeeded"
    assert faults.hits[RouteName.DELETE_RESOURCE] == 2 * 2  # mappings x client sends
    assert world.clock.slept[waited:] == [0.01, 0.01]  # one client backoff per mapping

    faults.clear()
    archive_deletes = faults.hits[RouteName.DELETE_STAGING_ARCHIVE]
    retried = await world.cleanup(failed["revision"])
    assert retried["status"] == "cleaning"
    cleaned = await world.settled("cleaned", "cleanup-failed")
    assert cleaned["status"] == "cleaned"
    for entry in cleaned["cleanup"]["resources"]:
        assert (entry["status"], entry["attempts"]) == ("succeeded", 2)
        assert "errorCode" not in entry
    assert cleaned["cleanup"]["stagingArchive"]["attempts"] == 1
    assert faults.hits[RouteName.DELETE_STAGING_ARCHIVE] == archive_deletes
    assert world.data_files() == []


async def test_cleanup_while_restoring_is_an_illegal_transition(world: Any) -> None:
    """Work in flight is not cleaned up under its feet."""
    revision = await world.ready_to_execute()
    world.corestore.faults.hold_restores()
    restoring = await world.execute(revision)
    with pytest.raises(IllegalTransition) as caught:
        await world.cleanup(restoring["revision"])
    assert caught.value.data["status"] == "restoring"
    world.corestore.faults.release_restores()
    await world.until("ready")


async def test_a_cleanup_cut_off_by_a_restart_resumes_on_its_replay(world: Any) -> None:
    """cleaning survives the restart; the replayed cleanup (fresh grant) finishes it."""
    revision = await _ready(world)
    faults = world.corestore.faults
    faults.delay_next(RouteName.DELETE_RESOURCE, seconds=60)
    body = world.cleanup_body(revision)
    await world.call(METHOD_CLEANUP, body)
    await world.reached(
        lambda s: s.state.cleanup is not None and s.state.cleanup.resources[0].status == "running",
    )
    await world.restart()
    faults.clear()  # the stalled delete died with the old engine's connection
    assert (await world.status())["state"]["status"] == "cleaning"
    answer = await world.call(METHOD_CLEANUP, {**body, "restoreGrant": world.grant()})
    assert answer["state"]["status"] == "cleaning"
    cleaned = await world.settled("cleaned", "cleanup-failed")
    assert cleaned["status"] == "cleaned"
    assert cleaned["cleanup"]["resources"][0]["attempts"] == 2
    assert world.data_files() == []


async def test_cleanup_ends_by_having_corestore_forget_the_prepared_restore(world: Any) -> None:
    """After the entries, DELETE of the restore: its record is gone, and so is every file."""
    revision = await _ready(world)
    record = world.corestore.data_dir / "restores" / "restore-1.json"
    assert record.exists()
    await world.cleanup(revision)
    cleaned = await world.settled("cleaned", "cleanup-failed")
    assert cleaned["status"] == "cleaned"
    assert not record.exists()
    assert "lastErrorCode" not in cleaned
    assert world.data_files() == []


async def test_forgetting_the_restore_failing_ends_cleanup_failed_with_every_entry_clean(
    world: Any,
) -> None:
    """Corestore unavailable for the final DELETE: cleanup-failed, entries succeeded, the error
    on the state; the next cleanup deletes nothing again and only forgets the restore."""
    revision = await _ready(world)
    faults = world.corestore.faults
    faults.fail_next(RouteName.DELETE_RESTORE, status=503, times=100)
    await world.cleanup(revision)
    failed = await world.settled("cleaned", "cleanup-failed")
    assert failed["status"] == "cleanup-failed"
    assert failed["lastErrorCode"] == "corestore-unavailable"
    assert "forgetting the prepared restore failed" in failed["lastErrorMessage"]
    entries = [*failed["cleanup"]["resources"], failed["cleanup"]["stagingArchive"]]
    assert all((e["status"], e["attempts"]) == ("succeeded", 1) for e in entries)
    assert faults.hits[RouteName.DELETE_RESTORE] == 2  # the client's sends, nothing on top
    assert (world.corestore.data_dir / "restores" / "restore-1.json").exists()

    faults.clear()
    deletes = faults.hits[RouteName.DELETE_RESOURCE] + faults.hits[RouteName.DELETE_STAGING_ARCHIVE]
    await world.cleanup(failed["revision"])
    cleaned = await world.settled("cleaned", "cleanup-failed")
    assert cleaned["status"] == "cleaned"
    assert cleaned["cleanup"] == failed["cleanup"]
    assert (
        faults.hits[RouteName.DELETE_RESOURCE] + faults.hits[RouteName.DELETE_STAGING_ARCHIVE]
        == deletes
    )
    assert world.data_files() == []


async def test_corestore_refusing_to_forget_the_restore_ends_cleanup_failed_at_once(
    world: Any,
) -> None:
    """A 409 from the final DELETE is not retried: cleanup-failed with corestore-refused."""
    revision = await _ready(world)
    faults = world.corestore.faults
    faults.fail_next(RouteName.DELETE_RESTORE, status=409)
    await world.cleanup(revision)
    failed = await world.settled("cleaned", "cleanup-failed")
    assert (failed["status"], failed["lastErrorCode"]) == ("cleanup-failed", "corestore-refused")
    assert faults.hits[RouteName.DELETE_RESTORE] == 1
