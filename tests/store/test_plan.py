"""The plan, written once with its state: read whole, by its mappings, or by manifest path."""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest

from agent.domain.restore_machine import Op
from agent.domain.restores import PreparedPlan, RestoreKey
from agent.errors import RestoreNotFound, RevisionConflict
from agent.store import RevisionStore
from tests.store.states import KEY, node_state, plan

A, B = "a" * 64, "b" * 64


def _manifest_plan(*objects: tuple[str, int, str], **extras: Any) -> PreparedPlan:
    wire = plan(**extras).to_wire()
    wire["archiveManifest"]["objects"] = [
        {"path": path, "size": size, "sha256": sha256} for path, size, sha256 in objects
    ]
    return PreparedPlan.from_wire(wire)


TWO = _manifest_plan(("snap-1/a.bin", 10, A), ("snap-1/b.bin", 20, B), note="kept")


async def _prepared(store: RevisionStore, written: PreparedPlan = TWO) -> None:
    await store.mutate(KEY, expected_revision=0, op=Op.PREPARE, state=node_state(), plan=written)


async def test_a_manifest_path_answers_its_size_and_sha256(store: RevisionStore) -> None:
    """One keyed lookup gives the manifest's entry of the path; not written yet."""
    await _prepared(store)
    entry = await store.manifest_entry(KEY, "snap-1/b.bin")
    assert entry is not None
    assert (entry.size, entry.sha256, entry.written) == (20, B, False)


async def test_a_path_the_manifest_does_not_list_has_no_entry(store: RevisionStore) -> None:
    """An unknown path (or another restore's) is None."""
    await _prepared(store)
    other = RestoreKey("cluster-1", "node-1", "restore-2")
    assert await store.manifest_entry(KEY, "snap-1/c.bin") is None
    assert await store.manifest_entry(other, "snap-1/a.bin") is None


async def test_an_entry_is_written_once_its_object_is_marked_written(
    store: RevisionStore,
) -> None:
    """`mark_object_written` makes the entry's `written` true, that object's only."""
    await _prepared(store)
    await store.mark_object_written(KEY, "snap-1/a.bin", 10, A)
    written = await store.manifest_entry(KEY, "snap-1/a.bin")
    other = await store.manifest_entry(KEY, "snap-1/b.bin")
    assert written is not None
    assert other is not None
    assert (written.written, other.written) == (True, False)


async def test_staging_is_complete_once_every_manifest_object_is_written(
    store: RevisionStore,
) -> None:
    """Incomplete with one of two objects written, complete with both."""
    await _prepared(store)
    await store.mark_object_written(KEY, "snap-1/a.bin", 10, A)
    half = await store.staging_complete(KEY)
    await store.mark_object_written(KEY, "snap-1/b.bin", 20, B)
    assert (half, await store.staging_complete(KEY)) == (False, True)


async def test_an_object_written_with_another_digest_does_not_complete_staging(
    store: RevisionStore,
) -> None:
    """Only the manifest's size and sha256 count as that object written."""
    await _prepared(store, _manifest_plan(("snap-1/a.bin", 10, A)))
    await store.mark_object_written(KEY, "snap-1/a.bin", 10, B)
    assert not await store.staging_complete(KEY)


async def test_an_empty_manifest_is_complete_at_once(store: RevisionStore) -> None:
    """No object to stage: complete."""
    await _prepared(store, plan())
    assert await store.staging_complete(KEY)


async def test_the_plan_reads_back_whole(store: RevisionStore) -> None:
    """Mappings, manifest objects in order and the manifest's extra fields."""
    await _prepared(store)
    assert await store.plan(KEY) == TWO


async def test_the_mappings_read_back_without_the_manifest(store: RevisionStore) -> None:
    """What execute and cleanup need: the plan's resource mappings."""
    await _prepared(store)
    assert await store.resource_mappings(KEY) == TWO.resource_mappings


async def test_a_key_without_a_state_has_no_plan(store: RevisionStore) -> None:
    """`RestoreNotFound` for the plan and for the mappings."""
    with pytest.raises(RestoreNotFound):
        await store.plan(KEY)
    with pytest.raises(RestoreNotFound):
        await store.resource_mappings(KEY)


async def test_a_refused_second_prepare_leaves_the_first_plan(store: RevisionStore) -> None:
    """A create that meets an existing row writes neither its state nor its plan."""
    await _prepared(store)
    with pytest.raises(RevisionConflict):
        await _prepared(store, _manifest_plan(("snap-1/z.bin", 1, B)))
    assert await store.plan(KEY) == TWO
    assert await store.manifest_entry(KEY, "snap-1/z.bin") is None


async def test_restore_facts_count_the_plan_and_a_counted_status_staging(
    store: RevisionStore,
) -> None:
    """Mappings, objects and manifest bytes always; chunk bytes and written objects only for
    a status the caller counts."""
    await _prepared(store)
    await store.record_chunk(KEY, "snap-1/a.bin", 0, 10, A)
    await store.mark_object_written(KEY, "snap-1/a.bin", 10, A)
    routing = (KEY.cluster_id, KEY.node_name, KEY.restore_id)
    counted = await store.restore_facts(counted={"preparing"})
    uncounted = await store.restore_facts(counted={"staging"})
    assert counted == {routing: (1, 2, 30, 10, 1)}
    assert uncounted == {routing: (1, 2, 30, 0, 0)}


async def test_the_state_reads_without_its_plan(store: RevisionStore) -> None:
    """`get` (what a status answers) reads the small state row only: even a plan that no
    longer reads leaves the state readable."""
    await _prepared(store)
    with sqlite3.connect(store.path) as raw:
        raw.execute("UPDATE restore_plan SET manifest_json = 'not json'")
    raw.close()
    stored = await store.get(KEY)
    assert stored is not None
    assert stored.revision == 1
