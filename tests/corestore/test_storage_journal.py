"""The reference Corestore's staging ledger: an append-only journal per archive, group commit,
the crash guarantee (an answered chunk is counted after a restart, a torn record is not), and
the discarding mode the benchmarks use."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import pytest

from agent.corestore.models import PrepareRestoreBody
from agent.errors import CorestoreRefused
from devstack.corestore import storage as storage_module
from devstack.corestore.storage import Storage, _Journal

CHUNK = 1000
PATH = "snap-1/dump.bson"


def prepared(root: Path, data: bytes, *, discard: bool = False) -> Storage:
    """A Storage with one prepared restore whose manifest holds `data` under PATH."""
    storage = Storage(root, discard=discard)
    body = PrepareRestoreBody.model_validate(
        {
            "scratchNamespaceId": "ns-1",
            "stagingArchiveId": "sa-1",
            "resourceMappings": [
                {
                    "id": "m-1",
                    "type": "database",
                    "source": {"snapshotId": "snap-1", "resourceName": "db", "databaseName": "d"},
                    "target": {"resourceName": "db", "databaseName": "d"},
                }
            ],
            "archiveManifest": {
                "objects": [
                    {"path": PATH, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
                ]
            },
        }
    )
    storage.prepare("r-1", body)
    return storage


def put(storage: Storage, data: bytes, index: int) -> dict[str, object]:
    piece = data[index * CHUNK : (index + 1) * CHUNK]
    sha = hashlib.sha256(piece).hexdigest()
    return storage.put_chunk("sa-1", PATH, index * CHUNK, piece, sha)


DATA = os.urandom(3 * CHUNK)


def test_answered_chunks_are_counted_by_a_restarted_storage(tmp_path: Path) -> None:
    """The ledger survives the process: a new Storage on the directory reports the same chunks."""
    first = prepared(tmp_path, DATA)
    put(first, DATA, 0)
    put(first, DATA, 1)
    again = Storage(tmp_path)
    progress = again.progress("sa-1", PATH)
    assert (progress["state"], progress["verifiedBytes"]) == ("partial", 2 * CHUNK)
    put(again, DATA, 2)
    again.commit("sa-1", PATH, len(DATA), hashlib.sha256(DATA).hexdigest())
    assert Storage(tmp_path).progress("sa-1", PATH)["state"] == "committed"


def test_a_record_torn_by_a_crash_is_ignored_and_cut_off(tmp_path: Path) -> None:
    """A half-written last line (never answered) does not count, and the next chunk after the
    restart starts a line of its own, which counts."""
    first = prepared(tmp_path, DATA)
    put(first, DATA, 0)
    journal = tmp_path / "staging-meta" / "sa-1" / "ledger.jsonl"
    with journal.open("ab") as handle:
        handle.write(b'{"length": 1000, "offset": 1000, "pa')
    again = Storage(tmp_path)
    assert again.progress("sa-1", PATH)["verifiedBytes"] == CHUNK
    put(again, DATA, 1)
    assert journal.read_bytes().endswith(b"\n")
    assert Storage(tmp_path).progress("sa-1", PATH)["verifiedBytes"] == 2 * CHUNK


def test_a_chunk_is_on_disk_before_its_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bytes are synced before the ledger entry is appended (a counted chunk always has its
    bytes on disk)."""
    order: list[str] = []
    real_sync, real_append = os.fdatasync, _Journal.append

    def sync(fd: int) -> None:
        order.append("sync")
        real_sync(fd)

    def append(self: _Journal, record: dict[str, object]) -> None:
        order.append("record")
        real_append(self, record)

    monkeypatch.setattr(storage_module.os, "fdatasync", sync)
    monkeypatch.setattr(_Journal, "append", append)
    storage = prepared(tmp_path, DATA)
    put(storage, DATA, 0)
    assert order[:2] == ["sync", "record"]


def test_records_appended_together_share_one_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Group commit: while one sync runs, the records appended meanwhile wait for the next one,
    which covers them all; every append returns only once its record was synced."""
    journal = _Journal(tmp_path / "ledger.jsonl")
    syncs: list[int] = []
    first_sync_started, release = threading.Event(), threading.Event()
    real_sync = os.fdatasync

    def slow_sync(fd: int) -> None:
        syncs.append(fd)
        if len(syncs) == 1:
            first_sync_started.set()
            release.wait(5)
        real_sync(fd)

    monkeypatch.setattr(storage_module.os, "fdatasync", slow_sync)
    leader = threading.Thread(target=journal.append, args=({"path": "p", "removed": True},))
    leader.start()
    assert first_sync_started.wait(5)
    followers = [
        threading.Thread(target=journal.append, args=({"path": f"q{i}", "removed": True},))
        for i in range(8)
    ]
    for thread in followers:
        thread.start()
    assert journal.wait_appended(9, 5)  # all eight wrote their record while the sync ran
    release.set()
    for thread in (leader, *followers):
        thread.join(5)
        assert not thread.is_alive()
    assert len(syncs) == 2  # the leader's, then one for all eight followers
    assert journal.path.read_bytes().count(b"\n") == 9
    journal.close()


def test_discarding_storage_verifies_and_keeps_no_bytes(tmp_path: Path) -> None:
    """Discard mode (benchmarks): chunk digests and the whole object's digest are still
    checked, but no staged byte and no ledger reaches the disk."""
    storage = prepared(tmp_path, DATA, discard=True)
    with pytest.raises(CorestoreRefused):
        storage.put_chunk("sa-1", PATH, 0, DATA[:CHUNK], "0" * 64)
    for index in range(3):
        put(storage, DATA, index)
    storage.commit("sa-1", PATH, len(DATA), hashlib.sha256(DATA).hexdigest())
    assert storage.progress("sa-1", PATH)["state"] == "committed"
    assert not any("staging/" in name or "ledger" in name for name in storage.files())


def test_discarding_storage_refuses_an_object_whose_bytes_differ(tmp_path: Path) -> None:
    """The digest of what was sent decides the commit, as a re-hash would."""
    other = os.urandom(len(DATA))
    storage = prepared(tmp_path, DATA, discard=True)
    for index in range(3):
        put(storage, other, index)
    with pytest.raises(CorestoreRefused) as refused:
        storage.commit("sa-1", PATH, len(DATA), hashlib.sha256(DATA).hexdigest())
    assert refused.value.data["corestoreCode"] == "object-digest-mismatch"
    assert storage.progress("sa-1", PATH)["state"] == "absent"
