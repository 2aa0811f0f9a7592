"""What Cloudly's requests meet once retention forgot a cleaned restore: the answers for a key
the agent holds no state of (docs/isolated-restore.md, "Retention")."""

from __future__ import annotations

from typing import Any

import pytest

from agent.errors import RestoreNotFound, RevisionConflict
from agent.store.retention import DAY_S, Retention, RetentionSettings


async def _forgotten(world: Any) -> int:
    """The restore driven to `cleaned`, then forgotten; the revision it was cleaned at."""
    revision = await world.ready_to_execute()
    await world.execute(revision)
    ready = await world.until("ready")
    await world.cleanup(ready.revision)
    cleaned = await world.until("cleaned")
    world.clock.advance(31 * DAY_S)
    outcome = await Retention(
        world.store, RetentionSettings(max_age_s=30 * DAY_S), clock=world.clock
    ).sweep()
    assert outcome.restores == 1
    return int(cleaned.revision)


async def test_the_status_of_a_forgotten_restore_is_not_found(world: Any) -> None:
    """`found: false`, as for a key never prepared."""
    await _forgotten(world)
    assert await world.status() == {"found": False}


async def test_a_cleanup_repeated_after_the_restore_was_forgotten_is_restore_not_found(
    world: Any,
) -> None:
    """Even the request that cleaned it: there is no state to answer (not retryable)."""
    revision = await _forgotten(world)
    with pytest.raises(RestoreNotFound):
        await world.cleanup(revision - 2)


async def test_a_prepare_at_a_revision_of_the_forgotten_restore_is_a_revision_conflict(
    world: Any,
) -> None:
    """The key is at revision 0 now: any other `expectedRevision` conflicts with it."""
    revision = await _forgotten(world)
    with pytest.raises(RevisionConflict) as caught:
        await world.call("coreflowPrepareIsolatedRestore", world.prepare_body(expected=revision))
    assert caught.value.data == {"currentRevision": 0, "status": None}


async def test_a_prepare_at_revision_zero_for_a_forgotten_key_is_a_new_restore(
    world: Any,
) -> None:
    """Revision 0 is an absent key: the prepare creates it anew and the engine prepares it."""
    await _forgotten(world)
    prepared = await world.prepare()
    assert (prepared["revision"], prepared["status"]) == (2, "prepared")
