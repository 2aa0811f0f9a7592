"""CorestoreClient against the reference Corestore: every route's documented success path."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from agent.corestore import MAX_CHUNK_SIZE, DeleteOutcome
from agent.errors import CorestoreRefused

DUMP = "snap-db-1/dump.bson"
INDEXES = "snap-db-1/meta/indexes.json"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def test_health_answers_ok(world: Any) -> None:
    """GET /health answers `ok`."""
    assert (await world.client.health()).status == "ok"


async def test_prepare_creates_the_restore_then_replays_identically(world: Any) -> None:
    """The first prepare creates; the same prepare again answers the same, created=False."""
    await world.prepare()
    again = await world.prepare_again()
    assert (again.restore_id, again.staging_archive_id, again.created) == (
        world.restore_id,
        world.archive,
        False,
    )


async def test_prepare_with_another_body_for_the_same_restore_is_refused(world: Any) -> None:
    """Idempotency is per restore id and body: a different body is a 409."""
    await world.prepare()
    with pytest.raises(CorestoreRefused, match="restore-conflict") as caught:
        await world.client.prepare_restore(
            world.restore_id,
            scratch_namespace_id="another-namespace",
            staging_archive_id=world.archive,
            resource_mappings=[world.mapping()],
            archive_manifest={"objects": [world.entry(path) for path in world.objects]},
            grant=world.grant,
        )
    assert caught.value.data == {"httpStatus": 409, "corestoreCode": "restore-conflict"}


async def test_chunks_are_written_at_their_offsets_and_counted(world: Any) -> None:
    """Each PUT extends the verified bytes; the file holds exactly the bytes sent."""
    await world.prepare()
    data = world.objects[DUMP]
    first = await world.client.put_chunk(
        world.archive, DUMP, 0, data[:6000], _sha(data[:6000]), world.grant
    )
    second = await world.client.put_chunk(
        world.archive, DUMP, 6000, data[6000:], _sha(data[6000:]), world.grant
    )
    assert (first.verified_bytes, second.verified_bytes) == (6000, len(data))
    assert world.staged_file(DUMP).read_bytes() == data


async def test_progress_of_an_untouched_object_is_absent(world: Any) -> None:
    """An object of the manifest with no chunk yet: absent, nothing verified."""
    await world.prepare()
    progress = await world.client.object_progress(world.archive, DUMP, world.grant)
    assert (progress.state, progress.size, progress.verified_bytes, progress.chunks) == (
        "absent",
        len(world.objects[DUMP]),
        0,
        (),
    )


async def test_progress_tells_where_an_interrupted_stage_resumes(world: Any) -> None:
    """After some chunks, progress lists them and resuming from verified_bytes completes it."""
    await world.prepare()
    data = world.objects[DUMP]
    for offset in (0, 1000, 2000):
        chunk = data[offset : offset + 1000]
        await world.client.put_chunk(world.archive, DUMP, offset, chunk, _sha(chunk), world.grant)
    progress = await world.client.object_progress(world.archive, DUMP, world.grant)
    assert (progress.state, progress.verified_bytes) == ("partial", 3000)
    assert [c.offset for c in progress.chunks] == [0, 1000, 2000]
    rest = data[progress.verified_bytes :]
    await world.client.put_chunk(world.archive, DUMP, 3000, rest, _sha(rest), world.grant)
    committed = await world.client.commit_object(
        world.archive, DUMP, len(data), _sha(data), world.grant
    )
    assert committed.sha256 == _sha(data)


async def test_resending_a_counted_chunk_is_answered_as_before(world: Any) -> None:
    """A chunk PUT is idempotent: the replay changes neither the file nor the count."""
    await world.prepare()
    chunk = world.objects[DUMP][:4096]
    await world.client.put_chunk(world.archive, DUMP, 0, chunk, _sha(chunk), world.grant)
    again = await world.client.put_chunk(world.archive, DUMP, 0, chunk, _sha(chunk), world.grant)
    assert again.verified_bytes == 4096
    assert world.staged_file(DUMP).read_bytes() == chunk


async def test_a_chunk_leaving_a_gap_is_refused(world: Any) -> None:
    """Offsets past the verified bytes are a 409 offset-gap; nothing is written."""
    await world.prepare()
    chunk = world.objects[DUMP][4096:8192]
    with pytest.raises(CorestoreRefused, match="offset-gap"):
        await world.client.put_chunk(world.archive, DUMP, 4096, chunk, _sha(chunk), world.grant)
    assert not world.staged_file(DUMP).exists()


async def test_a_chunk_for_an_object_outside_the_manifest_is_refused(world: Any) -> None:
    """Corestore stages only what the prepared manifest lists."""
    await world.prepare()
    with pytest.raises(CorestoreRefused, match="object-not-in-manifest"):
        await world.client.put_chunk(world.archive, "snap-db-1/x", 0, b"x", _sha(b"x"), world.grant)


async def test_commit_counts_the_object_as_written(world: Any) -> None:
    """After commit, progress says committed with the object's sha256."""
    await world.prepare()
    await world.stage(DUMP)
    progress = await world.client.object_progress(world.archive, DUMP, world.grant)
    assert (progress.state, progress.sha256) == ("committed", world.entry(DUMP)["sha256"])


async def test_commit_of_an_incomplete_object_is_refused_and_keeps_it(world: Any) -> None:
    """Committing before every byte is verified is a 409; the partial object stays."""
    await world.prepare()
    await world.stage(DUMP, commit=False)
    chunk = world.objects[INDEXES][:4]
    await world.client.put_chunk(world.archive, INDEXES, 0, chunk, _sha(chunk), world.grant)
    entry = world.entry(INDEXES)
    with pytest.raises(CorestoreRefused, match="object-incomplete"):
        await world.client.commit_object(
            world.archive, INDEXES, entry["size"], entry["sha256"], world.grant
        )
    assert world.staged_file(INDEXES).read_bytes() == chunk


async def test_an_empty_object_is_committed_without_chunks(world: Any) -> None:
    """Size 0 needs no chunk PUT; commit alone writes it."""
    await world.prepare({"snap-db-1/empty": b"", DUMP: b"dump"})
    committed = await world.client.commit_object(
        world.archive, "snap-db-1/empty", 0, _sha(b""), world.grant
    )
    assert committed.size == 0
    assert world.staged_file("snap-db-1/empty").read_bytes() == b""


async def test_delete_object_removes_it_and_a_second_delete_counts_as_cleaned(world: Any) -> None:
    """The object's bytes go; deleting again answers already-absent."""
    await world.prepare()
    await world.stage(DUMP, commit=False)
    first = await world.client.delete_object(world.archive, DUMP, world.grant)
    second = await world.client.delete_object(world.archive, DUMP, world.grant)
    assert (first, second) == (DeleteOutcome.DELETED, DeleteOutcome.ALREADY_ABSENT)
    assert not world.staged_file(DUMP).exists()


async def test_restore_runs_asynchronously_and_completes(world: Any) -> None:
    """The restore answers running (202); the status route reports it until it succeeds."""
    await world.prepare()
    await world.stage_all()
    world.corestore.faults.hold_restores()
    started = await world.client.restore_resource(world.restore_id, world.mapping_id, world.grant)
    status = await world.client.resource_restore_status(
        world.restore_id, world.mapping_id, world.grant
    )
    assert (started.state, status.state) == ("running", "running")
    world.corestore.faults.release_restores()
    done = await world.client.wait_resource_restored(
        world.restore_id, world.mapping_id, world.grant, poll_interval=0.01
    )
    assert (done.state, done.resource_type) == ("succeeded", "database")


async def test_a_restored_resource_holds_the_snapshot_files(world: Any) -> None:
    """The scratch resource is made from the staged objects, below the snapshot prefix."""
    await world.prepare()
    await world.stage_all()
    await world.client.wait_resource_restored(
        world.restore_id, world.mapping_id, world.grant, poll_interval=0.01
    )
    restored = world.restored_dir()
    assert (restored / "dump.bson").read_bytes() == world.objects[DUMP]
    assert (restored / "meta" / "indexes.json").read_bytes() == world.objects[INDEXES]


async def test_restoring_again_after_success_does_not_start_twice(world: Any) -> None:
    """The restore POST is idempotent: a finished restore answers succeeded (200)."""
    await world.prepare()
    await world.stage_all()
    await world.client.wait_resource_restored(
        world.restore_id, world.mapping_id, world.grant, poll_interval=0.01
    )
    again = await world.client.restore_resource(world.restore_id, world.mapping_id, world.grant)
    assert again.state == "succeeded"


async def test_restore_before_staging_is_complete_is_refused(world: Any) -> None:
    """Every object of the mapping's snapshot must be committed first."""
    await world.prepare()
    await world.stage(DUMP)
    with pytest.raises(CorestoreRefused, match="staging-incomplete"):
        await world.client.restore_resource(world.restore_id, world.mapping_id, world.grant)


async def test_status_of_a_resource_never_restored_is_absent(world: Any) -> None:
    """The status route answers absent, not an error, before the first restore."""
    await world.prepare()
    status = await world.client.resource_restore_status(
        world.restore_id, world.mapping_id, world.grant
    )
    assert status.state == "absent"


async def test_verification_of_a_faithful_restore_passes_every_check(world: Any) -> None:
    """Restored bytes match the manifest: every check passed."""
    await world.prepare()
    await world.stage_all()
    await world.client.wait_resource_restored(
        world.restore_id, world.mapping_id, world.grant, poll_interval=0.01
    )
    verification = await world.client.verify_resource(
        world.restore_id, world.mapping_id, world.grant
    )
    assert verification.status == "passed"
    assert [(c.code, c.status) for c in verification.checks] == [
        ("resource-restored", "passed"),
        ("objects-present", "passed"),
        ("content-sha256", "passed"),
    ]


async def test_verification_detects_restored_bytes_that_differ(world: Any) -> None:
    """The checks are real: a changed restored file fails content-sha256."""
    await world.prepare()
    await world.stage_all()
    await world.client.wait_resource_restored(
        world.restore_id, world.mapping_id, world.grant, poll_interval=0.01
    )
    (world.restored_dir() / "dump.bson").write_bytes(b"tampered")
    verification = await world.client.verify_resource(
        world.restore_id, world.mapping_id, world.grant
    )
    failed = {c.code: c.message for c in verification.checks if c.status == "failed"}
    assert verification.status == "failed"
    assert failed == {"content-sha256": "1 object(s) differ"}


async def test_delete_resource_removes_it_and_a_second_delete_counts_as_cleaned(world: Any) -> None:
    """The scratch resource goes; deleting again answers already-absent."""
    await world.prepare()
    await world.stage_all()
    await world.client.wait_resource_restored(
        world.restore_id, world.mapping_id, world.grant, poll_interval=0.01
    )
    first = await world.client.delete_resource(world.restore_id, world.mapping_id, world.grant)
    second = await world.client.delete_resource(world.restore_id, world.mapping_id, world.grant)
    assert (first, second) == (DeleteOutcome.DELETED, DeleteOutcome.ALREADY_ABSENT)
    assert not world.restored_dir().exists()


async def test_deleting_a_resource_of_an_unknown_restore_counts_as_cleaned(world: Any) -> None:
    """404 restore-not-found on a delete: nothing is left to clean."""
    outcome = await world.client.delete_resource("never-prepared", world.mapping_id, world.grant)
    assert outcome is DeleteOutcome.ALREADY_ABSENT
    assert outcome.cleaned


async def test_deleting_a_mapping_the_restore_never_had_is_refused(world: Any) -> None:
    """404 mapping-not-found is a bug, not a successful cleanup."""
    await world.prepare()
    with pytest.raises(CorestoreRefused, match="mapping-not-found"):
        await world.client.delete_resource(world.restore_id, "no-such-mapping", world.grant)


async def test_deleting_a_running_restore_stops_it(world: Any) -> None:
    """A delete during the restore leaves nothing behind once the run ends."""
    await world.prepare()
    await world.stage_all()
    world.corestore.faults.hold_restores()
    await world.client.restore_resource(world.restore_id, world.mapping_id, world.grant)
    outcome = await world.client.delete_resource(world.restore_id, world.mapping_id, world.grant)
    world.corestore.faults.release_restores()
    status = await world.client.resource_restore_status(
        world.restore_id, world.mapping_id, world.grant
    )
    assert (outcome, status.state) == (DeleteOutcome.DELETED, "absent")
    assert not world.restored_dir().exists()


async def test_delete_staging_archive_removes_it_and_again_counts_as_cleaned(world: Any) -> None:
    """The whole archive goes; deleting again answers already-absent."""
    await world.prepare()
    await world.stage_all()
    first = await world.client.delete_staging_archive(world.archive, world.grant)
    second = await world.client.delete_staging_archive(world.archive, world.grant)
    assert (first, second) == (DeleteOutcome.DELETED, DeleteOutcome.ALREADY_ABSENT)
    assert not (world.corestore.data_dir / "staging" / world.archive).exists()


async def test_odd_object_paths_and_ids_round_trip(world: Any) -> None:
    """Paths with spaces, '+', '%', '&', '#' and non-ASCII, and an archive id with every kind of
    character the id rule allows, reach the right file."""
    world.archive = "Archive:1.2_x-y"
    path = "snap-db-1/a b+c%d&e=f#g é.bin"
    await world.prepare({path: b"odd bytes"})
    await world.stage(path)
    progress = await world.client.object_progress(world.archive, path, world.grant)
    assert (progress.path, progress.state) == (path, "committed")


async def test_a_chunk_of_exactly_16_mib_is_accepted(world: Any) -> None:
    """The largest chunk the API allows goes through in one PUT."""
    data = bytes(range(256)) * (MAX_CHUNK_SIZE // 256)
    await world.prepare({DUMP: data})
    accepted = await world.client.put_chunk(world.archive, DUMP, 0, data, _sha(data), world.grant)
    assert accepted.verified_bytes == MAX_CHUNK_SIZE
