"""The service routes against the reference Corestore: backup, record, archive restore, prune,
closure export and import, each as the client sees it."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from agent.contracts.backup import ArchiveRetentionPolicy
from agent.contracts.relay import DatabaseClosureDescriptor
from agent.corestore.client import CorestoreClient
from agent.corestore.models import DeleteOutcome
from agent.errors import CorestoreRefused, IntegrityError
from devstack.corestore import CorestoreHandle

SERVICE: dict[str, Any] = {"id": "svc", "data": {}}
DATABASE = b"database bytes " * 1000


@pytest.fixture
def services(corestore: CorestoreHandle) -> Any:
    """The service `svc` with a database and a bucket file."""
    services = corestore.services
    services.write_database("svc", [DATABASE])
    services.write_file("svc", "objectstorage", "a.txt", b"a")
    return services


async def test_a_repeated_backup_answers_the_same_record_and_another_body_conflicts(
    client: CorestoreClient, services: Any
) -> None:
    """Same body: the same record (no second backup); other tags: 409 backup-conflict."""
    first = await client.service_backup("svc", "bk", service=SERVICE)
    again = await client.service_backup("svc", "bk", service=SERVICE)
    assert again == first
    assert [s.type for s in first.snapshots] == ["database", "objectstorage"]
    with pytest.raises(CorestoreRefused) as refused:
        await client.service_backup("svc", "bk", service=SERVICE, tags={"x": "y"})
    assert refused.value.data["corestoreCode"] == "backup-conflict"


async def test_the_export_reads_exactly_the_recorded_bytes_and_nothing_past_them(
    client: CorestoreClient, services: Any
) -> None:
    """Ranged reads give the closure; a read at its end gives nothing."""
    await client.service_backup("svc", "bk", service=SERVICE)
    descriptor = await client.closure_descriptor("svc", "bk")
    assert (descriptor.size, descriptor.sha256) == (
        len(DATABASE),
        hashlib.sha256(DATABASE).hexdigest(),
    )
    head = await client.read_closure("svc", "bk", 0, 10)
    tail = await client.read_closure("svc", "bk", 10, len(DATABASE))
    assert head + tail == DATABASE
    assert await client.read_closure("svc", "bk", len(DATABASE), 1) == b""


async def test_an_import_with_a_foreign_receipt_is_refused(
    client: CorestoreClient, services: Any
) -> None:
    """A receipt Corestore did not issue for these bytes: 422 receipt-invalid, no import."""
    forged = DatabaseClosureDescriptor.from_wire(
        {"size": 1, "sha256": "0" * 64, "receipt": {"issuer": "someone else"}}
    )
    with pytest.raises(CorestoreRefused) as refused:
        await client.open_closure_import("imp", service_id="svc", backup_id="bk", descriptor=forged)
    assert refused.value.data["corestoreCode"] == "receipt-invalid"
    assert services.open_imports() == []


async def test_an_import_commits_the_whole_closure_in_one_step(
    client: CorestoreClient, services: Any
) -> None:
    """Open, chunks, commit: the database is the closure, the import is gone."""
    await client.service_backup("svc", "bk", service=SERVICE)
    descriptor = await client.closure_descriptor("svc", "bk")
    services.write_database("svc", [b"other"])
    await client.open_closure_import("imp", service_id="svc", backup_id="bk", descriptor=descriptor)
    for offset in range(0, len(DATABASE), 4096):
        piece = DATABASE[offset : offset + 4096]
        await client.put_closure_chunk("imp", offset, piece, hashlib.sha256(piece).hexdigest())
    assert services.database_path("svc").read_bytes() == b"other"  # nothing before the commit
    await client.commit_closure_import("imp", descriptor.size, descriptor.sha256)
    assert services.database_path("svc").read_bytes() == DATABASE
    assert services.open_imports() == []


async def test_a_commit_of_other_bytes_removes_the_import_and_keeps_the_database(
    client: CorestoreClient, services: Any
) -> None:
    """Chunks verified one by one but a whole of another digest: 422, database untouched."""
    await client.service_backup("svc", "bk", service=SERVICE)
    descriptor = await client.closure_descriptor("svc", "bk")
    archived = services.archived_closure("svc", "bk")
    archived.write_bytes(b"X" + DATABASE[1:])  # the bytes the import gets differ by one
    altered = archived.read_bytes()
    await client.open_closure_import("imp", service_id="svc", backup_id="bk", descriptor=descriptor)
    await client.put_closure_chunk("imp", 0, altered, hashlib.sha256(altered).hexdigest())
    with pytest.raises(IntegrityError):
        await client.commit_closure_import("imp", descriptor.size, descriptor.sha256)
    assert services.database_path("svc").read_bytes() == DATABASE
    assert services.open_imports() == []
    assert await client.abort_closure_import("imp") is DeleteOutcome.ALREADY_ABSENT


async def test_no_archive_is_none_and_a_dry_run_prune_removes_nothing(
    client: CorestoreClient, services: Any
) -> None:
    """Before any backup: None (no archive). With two, dryRun names one and keeps both."""
    retention = ArchiveRetentionPolicy.from_wire({"keepLast": 1})
    assert await client.archive_prune(retention, dry_run=True) is None
    await client.service_backup("svc", "bk-1", service=SERVICE)
    await client.service_backup("svc", "bk-2", service=SERVICE)
    pruned = await client.archive_prune(retention, dry_run=True)
    listing = await client.archive_list()
    assert pruned is not None
    assert listing is not None
    assert pruned.result.dry_run is True
    assert len(listing.backups) == 2


# --- idempotency keys: Corestore applies one key once --------------------------------------------


async def _imported(client: CorestoreClient, import_id: str = "imp") -> DatabaseClosureDescriptor:
    """A backup's closure imported under `import_id`, not committed yet; its descriptor."""
    await client.service_backup("svc", "bk", service=SERVICE)
    descriptor = await client.closure_descriptor("svc", "bk")
    await client.open_closure_import(
        import_id, service_id="svc", backup_id="bk", descriptor=descriptor
    )
    await client.put_closure_chunk(import_id, 0, DATABASE, hashlib.sha256(DATABASE).hexdigest())
    return descriptor


async def test_an_import_id_is_committed_once_and_its_record_stays(
    client: CorestoreClient, services: Any
) -> None:
    """The second commit of a key answers the first's result and replaces nothing (the
    service wrote its database since); the import's state says `committed`, with its bytes,
    and it is never aborted (409 import-committed)."""
    descriptor = await _imported(client)
    first = await client.commit_closure_import("imp", descriptor.size, descriptor.sha256)
    services.write_database("svc", [b"written since"])
    second = await client.commit_closure_import("imp", descriptor.size, descriptor.sha256)
    status = await client.closure_import_status("imp")
    with pytest.raises(CorestoreRefused) as refused:
        await client.abort_closure_import("imp")
    assert second == first
    assert services.database_path("svc").read_bytes() == b"written since"
    assert services.applied_imports("svc") == 1
    assert status is not None
    assert (status.state, status.size, status.sha256) == (
        "committed",
        descriptor.size,
        descriptor.sha256,
    )
    assert refused.value.data["corestoreCode"] == "import-committed"
    assert services.committed_imports() == ["imp"]


async def test_an_import_unknown_to_corestore_has_no_state(client: CorestoreClient) -> None:
    assert await client.closure_import_status("never-opened") is None


async def test_an_archive_restore_key_is_applied_once(
    client: CorestoreClient, services: Any
) -> None:
    """The same key again answers the restore it made and copies nothing (the bucket keeps
    what the service wrote since); the key's state is its record; another body under the key
    is 409 restore-key-conflict; a key never used has no state."""
    record = await client.service_backup("svc", "bk", service=SERVICE)
    bucket = [s.snapshot_id for s in record.snapshots if s.type == "objectstorage"]
    services.write_file("svc", "objectstorage", "a.txt", b"changed")
    first = await client.service_restore("svc", "restore-k", "bk", bucket, clear=False)
    services.write_file("svc", "objectstorage", "a.txt", b"written since")
    again = await client.service_restore("svc", "restore-k", "bk", bucket, clear=False)
    status = await client.service_restore_status("svc", "restore-k")
    with pytest.raises(CorestoreRefused) as refused:
        await client.service_restore("svc", "restore-k", "bk", bucket, clear=True)
    assert again == first == status
    assert [s.snapshot_id for s in first.restored] == bucket
    assert (services.service_dir("svc") / "objectstorage" / "a.txt").read_bytes() == (
        b"written since"
    )
    assert [kind for kind, _, _ in services.applied] == ["restore"]
    assert refused.value.data["corestoreCode"] == "restore-key-conflict"
    assert await client.service_restore_status("svc", "other-key") is None
