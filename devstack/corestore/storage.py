"""The reference Corestore's disk: prepared restores and their staging objects.

Synchronous and thread-safe (the server calls it through `asyncio.to_thread`). Layout under
`data_dir` (ids are percent-encoded into one path segment):

    restores/<restoreId>.json                 the prepare body, as accepted (until forgotten)
    restores/<restoreId>.id                   the restore id itself (the listing's; a long id's
                                              file name is a hash)
    staging/<archive>/<object path>           object bytes, written at their offsets
    staging-meta/<archive>/archive.json       which restore owns the archive
    staging-meta/<archive>/ledger.jsonl       the chunk ledger of every object of the archive

(`scratch.py` keeps the restored resources.) Refusals are `CorestoreRefused` carrying
`httpStatus` and `corestoreCode`, which the server turns into the error answer.

**Crash guarantee** (unchanged): a chunk is answered only once its bytes and its ledger entry
are on disk, so after a crash the ledger counts exactly the answered chunks (or, for the one in
flight, possibly that one too; never a chunk whose bytes are not there). The ledger is an
append-only journal per archive (one JSON line per counted chunk, commit or removal; a torn last
line is a write the crash cut short, never answered, and is ignored on reading), kept in memory
once read. **Group commit:** appending a record does not fsync it alone: the first writer
fdatasyncs the journal for every record appended so far while the others wait for that one
sync, so chunks of one archive arriving together share one ledger sync (and no chunk rewrites
or renames a whole ledger file any more). The chunk's bytes are fdatasynced before its record
is appended.

Prepared restores are read from disk once and kept in memory with their manifest indexed by
path (until forgotten), so a chunk, progress or commit costs the same whatever the manifest's
size, as a real Corestore's would.

`Storage(root, discard=True)` is the benchmarks' discarding Corestore: chunks are verified and
judged as usual but their bytes are thrown away, and the ledger lives in memory only; commit
compares the digest of the bytes it was sent.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from agent.corestore.models import ArchiveObject, MappingBody, PrepareRestoreBody
from agent.errors import CorestoreRefused
from devstack.corestore.ledger import Chunk, ChunkVerdict, judge_chunk, verified_bytes

__all__ = ["Storage", "read_json", "refuse", "segment", "sha256_file", "write_json"]


def refuse(status: int, code: str, message: str) -> CorestoreRefused:
    """The error answer `status` `{error: {code, message}}`, as an exception to raise."""
    return CorestoreRefused(message, httpStatus=status, corestoreCode=code)


def segment(value: str) -> str:
    name = quote(value, safe="")
    return name if len(name) <= 200 else "h-" + hashlib.sha256(value.encode()).hexdigest()


def write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with tmp.open("w") as handle:
        json.dump(value, handle, sort_keys=True)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


def sha256_file(path: Path) -> tuple[int, str]:
    digest, size = hashlib.sha256(), 0
    with path.open("rb") as handle:
        while block := handle.read(1024 * 1024):
            digest.update(block)
            size += len(block)
    return size, digest.hexdigest()


@dataclass(slots=True)
class _Ledger:
    """One object's counted chunks and whether it is committed."""

    chunks: list[Chunk] = field(default_factory=list)
    committed: bool = False
    running: Any = None  # discard mode: the sha256 of the bytes counted so far


class _Journal:
    """One archive's append-only ledger journal, with group commit."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._cond = threading.Condition()
        self._fd: int | None = None
        self._written = 0  # records appended
        self._durable = 0  # records known to be on disk
        self._syncing = False

    def read(self) -> dict[str, _Ledger]:
        """Every object's ledger as the journal says (a torn last line is ignored)."""
        ledgers: dict[str, _Ledger] = {}
        try:
            text = self.path.read_bytes()
        except FileNotFoundError:
            return ledgers
        if not text.endswith(b"\n") and text:
            # A record a crash cut short (never answered): cut it off, so the next append
            # starts a line of its own.
            text = text[: text.rfind(b"\n") + 1]
            os.truncate(self.path, len(text))
        for line in text.split(b"\n")[:-1]:
            try:
                record = json.loads(line)
            except ValueError:
                continue  # cut short by a crash: never answered
            path = record["path"]
            if record.get("removed"):
                ledgers.pop(path, None)
            elif record.get("committed"):
                ledgers.setdefault(path, _Ledger()).committed = True
            else:
                ledger = ledgers.setdefault(path, _Ledger())
                ledger.chunks.append(Chunk(record["offset"], record["length"], record["sha256"]))
        return ledgers

    def append(self, record: dict[str, Any]) -> None:
        """Append `record` and return once it is on disk (sharing one sync with its peers)."""
        line = json.dumps(record, sort_keys=True).encode() + b"\n"
        with self._cond:
            if self._fd is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            os.write(self._fd, line)  # O_APPEND, one write: records never interleave
            self._written += 1
            mine = self._written
            self._cond.notify_all()  # whoever waits for records to be appended
            while self._durable < mine:
                if self._syncing:
                    self._cond.wait()  # a sync is running; it may cover this record
                    continue
                self._syncing, target, fd = True, self._written, self._fd
                self._cond.release()
                try:
                    os.fdatasync(fd)
                finally:
                    self._cond.acquire()
                    self._syncing = False
                    self._cond.notify_all()
                self._durable = max(self._durable, target)

    def wait_appended(self, count: int, timeout: float) -> bool:
        """Whether `count` records were appended within `timeout` seconds (tests)."""
        with self._cond:
            return self._cond.wait_for(lambda: self._written >= count, timeout)

    def close(self) -> None:
        """Close the file (the archive is being deleted)."""
        with self._cond:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


class Storage:
    """All state of one reference Corestore, on disk (`discard`: staging bytes are dropped)."""

    def __init__(self, data_dir: Path, *, discard: bool = False) -> None:
        self.root = data_dir
        self.discard = discard
        self._lock = threading.RLock()  # metadata, restores, resources
        self._object_locks: dict[tuple[str, str], threading.Lock] = {}
        self._journals: dict[str, _Journal] = {}
        self._ledgers: dict[str, dict[str, _Ledger]] = {}  # archive -> path -> ledger
        # restore id -> (its prepare body, its manifest by path), read from disk once
        self._prepared: dict[str, tuple[PrepareRestoreBody, dict[str, ArchiveObject]]] = {}

    # --- restores -------------------------------------------------------------------------------

    def prepare(self, restore_id: str, body: PrepareRestoreBody) -> tuple[dict[str, Any], bool]:
        """Record a restore and create its staging archive; `(answer, created)`."""
        wire = body.to_wire()
        path = self._restore_path(restore_id)
        with self._lock:
            known = read_json(path)
            if known is not None and known != wire:
                raise refuse(409, "restore-conflict", "the restore was prepared with another body")
            owner = self._archive_owner(body.staging_archive_id)
            if owner is not None and owner != restore_id:
                raise refuse(409, "staging-archive-conflict", "another restore owns the archive")
            if known is None:
                write_json(path, wire)
                write_json(path.with_suffix(".id"), restore_id)
            meta = self._meta_dir(body.staging_archive_id) / "archive.json"
            if owner is None:  # also after a cleanup: an idempotent prepare re-creates it
                write_json(meta, {"restoreId": restore_id})
        answer = {
            "restoreId": restore_id,
            "scratchNamespaceId": body.scratch_namespace_id,
            "stagingArchiveId": body.staging_archive_id,
            "created": known is None,
        }
        return answer, known is None

    def restore(self, restore_id: str) -> PrepareRestoreBody:
        """The prepared restore, or a 404 refusal."""
        return self._prepared_restore(restore_id)[0]

    def _prepared_restore(
        self, restore_id: str
    ) -> tuple[PrepareRestoreBody, dict[str, ArchiveObject]]:
        with self._lock:
            prepared = self._prepared.get(restore_id)
            if prepared is None:
                known = read_json(self._restore_path(restore_id))
                if known is None:
                    raise refuse(404, "restore-not-found", "no restore was prepared under this id")
                body = PrepareRestoreBody.model_validate(known)
                index = {entry.path: entry for entry in body.archive_manifest.objects}
                prepared = self._prepared[restore_id] = (body, index)
            return prepared

    def forget(self, restore_id: str) -> None:
        """Delete the prepared-restore record: 404 when there is none, 409 while its staging
        archive exists. (`Scratch.forget` checks the restored resources first.)"""
        with self._lock:
            body = self.restore(restore_id)
            if self._archive_held(restore_id, body.staging_archive_id):
                raise refuse(
                    409, "restore-not-empty", "the staging archive of the restore still exists"
                )
            self._restore_path(restore_id).unlink()
            self._restore_path(restore_id).with_suffix(".id").unlink(missing_ok=True)
            self._prepared.pop(restore_id, None)

    def restore_ids(self, after: str | None, limit: int) -> list[str]:
        """Up to `limit` prepared restore ids after `after`, in order (the listing's page)."""
        with self._lock:
            ids = sorted(
                str(read_json(path))
                for path in (self.root / "restores").glob("*.id")
                if read_json(path) is not None
            )
        return [restore_id for restore_id in ids if after is None or restore_id > after][:limit]

    def archive_exists(self, restore_id: str, archive: str) -> bool:
        """Whether the restore's staging archive (its bytes or its ledger) is on the disk."""
        with self._lock:
            return self._archive_held(restore_id, archive)

    def mapping(self, restore_id: str, mapping_id: str) -> tuple[PrepareRestoreBody, MappingBody]:
        """The restore and one of its mappings, or a 404 refusal."""
        body = self.restore(restore_id)
        for mapping in body.resource_mappings:
            if mapping.id == mapping_id:
                return body, mapping
        raise refuse(404, "mapping-not-found", "the restore has no such resource mapping")

    # --- staging objects ------------------------------------------------------------------------

    def put_chunk(
        self, archive: str, path: str, offset: int, data: bytes, sha256: str
    ) -> dict[str, Any]:
        """Verify, judge and write one chunk; the `ChunkAccepted` answer."""
        entry = self._entry(archive, path)
        if hashlib.sha256(data).hexdigest() != sha256:
            raise refuse(422, "chunk-digest-mismatch", "the chunk bytes do not match its sha256")
        chunk = Chunk(offset, len(data), sha256)
        with self._object_lock(archive, path):
            ledger = self._ledger(archive, path)
            verdict = judge_chunk(ledger.chunks, entry.size, ledger.committed, chunk)
            if verdict is ChunkVerdict.APPEND:
                if self.discard:
                    ledger.running = ledger.running or hashlib.sha256()
                    ledger.running.update(data)
                else:
                    self._write_at(self._object_path(archive, path), offset, data)
                    record = {"path": path, "offset": offset, "length": len(data), "sha256": sha256}
                    self._journal(archive).append(record)
                ledger.chunks.append(chunk)
            elif verdict is not ChunkVerdict.REPLAY:
                raise refuse(409, verdict.value, f"the chunk at offset {offset} is refused")
            verified = verified_bytes(ledger.chunks)
        return {
            "path": path,
            "offset": offset,
            "length": len(data),
            "sha256": sha256,
            "verifiedBytes": verified,
        }

    @staticmethod
    def _write_at(target: Path, offset: int, data: bytes) -> None:
        """`data` at `offset`, on disk before this returns; bytes past it are cut off (never
        counted: the remains of a chunk whose answer a crash lost)."""
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            if os.fstat(fd).st_size != offset:
                os.ftruncate(fd, offset)
            view = memoryview(data)
            while view:
                view = view[os.pwrite(fd, view, offset + len(data) - len(view)) :]
            os.fdatasync(fd)
        finally:
            os.close(fd)

    def progress(self, archive: str, path: str) -> dict[str, Any]:
        """The `ObjectProgress` answer."""
        entry = self._entry(archive, path)
        with self._object_lock(archive, path):
            ledger = self._ledgers_of(archive).get(path)
            if ledger is None:
                return {"path": path, "state": "absent", "size": entry.size, "verifiedBytes": 0}
            chunks = [
                {"offset": c.offset, "length": c.length, "sha256": c.sha256} for c in ledger.chunks
            ]
            answer = {
                "path": path,
                "state": "committed" if ledger.committed else "partial",
                "size": entry.size,
                "verifiedBytes": verified_bytes(ledger.chunks),
                "chunks": chunks,
            }
            if ledger.committed:
                answer["sha256"] = entry.sha256
        return answer

    def commit(self, archive: str, path: str, size: int, sha256: str) -> dict[str, Any]:
        """Re-hash the object; count it, or remove it (and refuse) on a mismatch."""
        entry = self._entry(archive, path)
        if (entry.size, entry.sha256) != (size, sha256):
            raise refuse(409, "object-not-in-manifest", "size and sha256 differ from the manifest")
        answer = {"path": path, "size": size, "sha256": sha256}
        with self._object_lock(archive, path):
            ledger = self._ledger(archive, path)
            if ledger.committed:
                return answer
            verified = verified_bytes(ledger.chunks)
            if verified < size:
                raise refuse(409, "object-incomplete", f"{verified} of {size} bytes are verified")
            if self.discard:
                digest = (ledger.running or hashlib.sha256()).hexdigest()
                actual = (verified, digest)
            else:
                target = self._object_path(archive, path)
                if size == 0:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.touch()
                actual = sha256_file(target)
            if actual != (size, sha256):
                self._remove_object(archive, path)
                raise refuse(422, "object-digest-mismatch", "the object does not match its sha256")
            if not self.discard:
                self._journal(archive).append({"path": path, "committed": True})
            ledger.committed = True
        return answer

    def delete_object(self, archive: str, path: str) -> None:
        """Remove one object, or a 404 refusal when there is nothing to remove."""
        self._archive_restore(archive)
        with self._object_lock(archive, path):
            if not self._remove_object(archive, path):
                raise refuse(404, "object-not-found", "the archive holds no such object")

    def delete_archive(self, archive: str) -> None:
        """Remove the whole staging archive, or a 404 refusal when it does not exist."""
        with self._lock:
            journal = self._journals.pop(archive, None)
            if journal is not None:
                journal.close()
            self._ledgers.pop(archive, None)
            found = False
            for directory in (self.root / "staging" / segment(archive), self._meta_dir(archive)):
                if directory.exists():
                    shutil.rmtree(directory)
                    found = True
        if not found:
            raise refuse(404, "staging-archive-not-found", "no such staging archive")

    def files(self) -> list[str]:
        """Every file under the data directory, as sorted relative POSIX paths (a cleaned
        restore leaves none of its own)."""
        return sorted(
            path.relative_to(self.root).as_posix()
            for path in self.root.rglob("*")
            if path.is_file()
        )

    def snapshot_objects(
        self, body: PrepareRestoreBody, mapping: MappingBody
    ) -> list[ArchiveObject]:
        """The manifest objects of the mapping's snapshot."""
        prefix = mapping.source.snapshot_id + "/"
        return [o for o in body.archive_manifest.objects if o.path.startswith(prefix)]

    def committed(self, archive: str, path: str) -> bool:
        """Whether the object is committed."""
        ledger = self._ledgers_of(archive).get(path)
        return ledger is not None and ledger.committed

    def object_path(self, archive: str, path: str) -> Path:
        """Where the object's bytes are."""
        return self._object_path(archive, path)

    # --- helpers --------------------------------------------------------------------------------

    def _restore_path(self, restore_id: str) -> Path:
        return self.root / "restores" / f"{segment(restore_id)}.json"

    def _archive_held(self, restore_id: str, archive: str) -> bool:
        """Whether the archive still exists for `restore_id` (bytes without an owner count:
        the remains of a delete that did not finish)."""
        owner = self._archive_owner(archive)
        if owner is not None:
            return owner == restore_id
        return (self.root / "staging" / segment(archive)).exists()

    def _meta_dir(self, archive: str) -> Path:
        return self.root / "staging-meta" / segment(archive)

    def _archive_owner(self, archive: str) -> str | None:
        meta = read_json(self._meta_dir(archive) / "archive.json")
        return None if meta is None else str(meta["restoreId"])

    def _archive_restore(self, archive: str) -> tuple[PrepareRestoreBody, dict[str, ArchiveObject]]:
        owner = self._archive_owner(archive)
        if owner is None:
            raise refuse(404, "staging-archive-not-found", "no such staging archive")
        return self._prepared_restore(owner)

    def _entry(self, archive: str, path: str) -> ArchiveObject:
        entry = self._archive_restore(archive)[1].get(path)
        if entry is None:
            raise refuse(409, "object-not-in-manifest", "the manifest lists no such object")
        return entry

    def _object_path(self, archive: str, path: str) -> Path:
        base = self.root / "staging" / segment(archive)
        target = base.joinpath(*path.split("/"))
        if not target.resolve().is_relative_to(base.resolve()):
            raise refuse(400, "invalid-request", "the object path leaves the archive")
        return target

    def _journal(self, archive: str) -> _Journal:
        with self._lock:
            journal = self._journals.get(archive)
            if journal is None:
                journal = self._journals[archive] = _Journal(
                    self._meta_dir(archive) / "ledger.jsonl"
                )
            return journal

    def _ledgers_of(self, archive: str) -> dict[str, _Ledger]:
        """The archive's ledgers, read from its journal the first time."""
        with self._lock:
            ledgers = self._ledgers.get(archive)
            if ledgers is None:
                ledgers = {} if self.discard else self._journal(archive).read()
                self._ledgers[archive] = ledgers
            return ledgers

    def _ledger(self, archive: str, path: str) -> _Ledger:
        return self._ledgers_of(archive).setdefault(path, _Ledger())

    def _remove_object(self, archive: str, path: str) -> bool:
        """Forget the object (a durable removal record first), then delete its bytes."""
        ledger = self._ledgers_of(archive).pop(path, None)
        removed = ledger is not None and (bool(ledger.chunks) or ledger.committed)
        if ledger is not None and not self.discard:
            self._journal(archive).append({"path": path, "removed": True})
        target = self._object_path(archive, path)
        if target.exists():
            target.unlink()
            removed = True
        return removed

    def _object_lock(self, archive: str, path: str) -> threading.Lock:
        with self._lock:
            return self._object_locks.setdefault((archive, path), threading.Lock())
