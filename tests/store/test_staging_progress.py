"""Resumable staging progress: chunks and written objects per restore."""

from __future__ import annotations

import pytest

from agent.domain.restores import RestoreKey
from agent.errors import InvalidState, RestoreNotFound
from agent.store import ChunkRecord, RevisionStore

KEY = RestoreKey("cluster-1", "node-1", "restore-1")
SHA_A = "a" * 64
SHA_B = "b" * 64


async def test_chunks_come_back_ordered_by_offset(prepared_store: RevisionStore) -> None:
    """Chunks recorded out of order are listed by offset."""
    await prepared_store.record_chunk(KEY, "db/dump.bin", 8, 8, SHA_B)
    await prepared_store.record_chunk(KEY, "db/dump.bin", 0, 8, SHA_A)
    assert await prepared_store.verified_chunks(KEY, "db/dump.bin") == [
        ChunkRecord("db/dump.bin", 0, 8, SHA_A),
        ChunkRecord("db/dump.bin", 8, 8, SHA_B),
    ]


async def test_recording_an_offset_again_replaces_it(prepared_store: RevisionStore) -> None:
    """The later write at an offset is what Corestore holds."""
    await prepared_store.record_chunk(KEY, "db/dump.bin", 0, 8, SHA_A)
    await prepared_store.record_chunk(KEY, "db/dump.bin", 0, 4, SHA_B)
    assert await prepared_store.verified_chunks(KEY, "db/dump.bin") == [
        ChunkRecord("db/dump.bin", 0, 4, SHA_B)
    ]


async def test_chunks_are_per_object(prepared_store: RevisionStore) -> None:
    """Another object's chunks are not listed."""
    await prepared_store.record_chunk(KEY, "a.bin", 0, 8, SHA_A)
    assert await prepared_store.verified_chunks(KEY, "b.bin") == []


async def test_staging_progress_does_not_advance_the_revision(
    prepared_store: RevisionStore,
) -> None:
    """Chunk and object records are private progress, not node-state mutations."""
    await prepared_store.record_chunk(KEY, "a.bin", 0, 8, SHA_A)
    await prepared_store.mark_object_written(KEY, "a.bin", 8, SHA_A)
    stored = await prepared_store.get(KEY)
    assert stored is not None
    assert stored.revision == 2


async def test_written_objects_are_listed_by_path(prepared_store: RevisionStore) -> None:
    """Objects marked written come back with size, digest and time, sorted by path."""
    await prepared_store.mark_object_written(KEY, "z.bin", 0, SHA_B)
    await prepared_store.mark_object_written(KEY, "a.bin", 8, SHA_A)
    objects = await prepared_store.written_objects(KEY)
    assert [(o.object_path, o.size, o.sha256) for o in objects] == [
        ("a.bin", 8, SHA_A),
        ("z.bin", 0, SHA_B),
    ]
    assert all(o.written_at > 0 for o in objects)


async def test_forget_object_drops_its_chunks_and_mark_only(
    prepared_store: RevisionStore,
) -> None:
    """Forgetting one object leaves the others' progress alone."""
    for path in ("a.bin", "b.bin"):
        await prepared_store.record_chunk(KEY, path, 0, 8, SHA_A)
        await prepared_store.mark_object_written(KEY, path, 8, SHA_A)
    await prepared_store.forget_object(KEY, "a.bin")
    assert await prepared_store.verified_chunks(KEY, "a.bin") == []
    assert [o.object_path for o in await prepared_store.written_objects(KEY)] == ["b.bin"]
    assert len(await prepared_store.verified_chunks(KEY, "b.bin")) == 1


async def test_progress_for_a_missing_state_is_restore_not_found(store: RevisionStore) -> None:
    """Staging progress needs a state to belong to."""
    with pytest.raises(RestoreNotFound):
        await store.record_chunk(KEY, "a.bin", 0, 8, SHA_A)
    with pytest.raises(RestoreNotFound):
        await store.mark_object_written(KEY, "a.bin", 8, SHA_A)


@pytest.mark.parametrize(
    ("offset", "length", "sha256"),
    [(-1, 8, SHA_A), (0, 0, SHA_A), (0, 8, "A" * 64), (0, 8, "a" * 63), (True, 8, SHA_A)],
)
async def test_malformed_chunk_records_are_refused(
    prepared_store: RevisionStore, offset: int, length: int, sha256: str
) -> None:
    """Negative offsets, empty chunks and non-digests are bugs, refused before SQL."""
    with pytest.raises(InvalidState):
        await prepared_store.record_chunk(KEY, "a.bin", offset, length, sha256)
    assert await prepared_store.verified_chunks(KEY, "a.bin") == []
