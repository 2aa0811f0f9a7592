"""Forgetting a prepared restore (`DELETE /v1/isolated-restores/{id}`): only once it is empty."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent.corestore import DeleteOutcome
from agent.errors import CorestoreRefused


def _record(world: Any) -> Path:
    return Path(world.corestore.data_dir) / "restores" / f"{world.restore_id}.json"


async def _restored(world: Any) -> None:
    await world.prepare()
    await world.stage_all()
    await world.client.wait_resource_restored(
        world.restore_id, world.mapping_id, world.grant, poll_interval=0.01
    )


async def test_delete_restore_forgets_it_and_a_second_delete_counts_as_cleaned(
    world: Any,
) -> None:
    """Once its archive is gone the record goes; deleting again answers already-absent."""
    await world.prepare()
    await world.client.delete_staging_archive(world.archive, world.grant)
    first = await world.client.delete_restore(world.restore_id, world.grant)
    second = await world.client.delete_restore(world.restore_id, world.grant)
    assert (first, second) == (DeleteOutcome.DELETED, DeleteOutcome.ALREADY_ABSENT)
    assert not _record(world).exists()


async def test_a_restore_whose_staging_archive_exists_is_not_forgotten(world: Any) -> None:
    """409 restore-not-empty while the staging archive exists; the record stays."""
    await world.prepare()
    with pytest.raises(CorestoreRefused, match="restore-not-empty") as caught:
        await world.client.delete_restore(world.restore_id, world.grant)
    assert caught.value.data == {"httpStatus": 409, "corestoreCode": "restore-not-empty"}
    assert _record(world).exists()


async def test_a_restore_with_a_scratch_resource_is_not_forgotten_until_it_is_deleted(
    world: Any,
) -> None:
    """A restored resource blocks the delete (409); after deleting it the restore goes."""
    await _restored(world)
    await world.client.delete_staging_archive(world.archive, world.grant)
    with pytest.raises(CorestoreRefused, match="restore-not-empty"):
        await world.client.delete_restore(world.restore_id, world.grant)
    await world.client.delete_resource(world.restore_id, world.mapping_id, world.grant)
    outcome = await world.client.delete_restore(world.restore_id, world.grant)
    assert outcome is DeleteOutcome.DELETED
    assert not _record(world).exists()


async def test_a_restore_with_a_running_resource_restore_is_not_forgotten(world: Any) -> None:
    """A resource restore still running blocks the delete, before any file of it exists."""
    await world.prepare()
    await world.stage_all()
    world.corestore.faults.hold_restores()
    await world.client.restore_resource(world.restore_id, world.mapping_id, world.grant)
    await world.client.delete_staging_archive(world.archive, world.grant)
    try:
        with pytest.raises(CorestoreRefused, match="restore-not-empty"):
            await world.client.delete_restore(world.restore_id, world.grant)
        await world.client.delete_resource(world.restore_id, world.mapping_id, world.grant)
        assert await world.client.delete_restore(world.restore_id, world.grant) is (
            DeleteOutcome.DELETED
        )
    finally:
        world.corestore.faults.release_restores()


async def test_an_identical_prepare_after_the_restore_was_forgotten_creates_it_anew(
    world: Any,
) -> None:
    """Forgetting is complete: the same prepare answers created=True again."""
    await world.prepare()
    await world.client.delete_staging_archive(world.archive, world.grant)
    await world.client.delete_restore(world.restore_id, world.grant)
    again = await world.prepare_again()
    assert again.created is True
