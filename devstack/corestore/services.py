"""The reference Corestore's service data: backups into the node archive, restores, prune, and
database closures (export by ranged reads, import by verified chunks and an atomic commit).

Synchronous and thread-safe, like `storage.py`. Layout under `data_dir`:

    services/<serviceId>/database              the service's database: one file, its closure
    services/<serviceId>/objectstorage/...     the service's bucket
    services/<serviceId>/volume/...            the service's Corestore volume
    services/<serviceId>/uncapturable.json     test switch: resources a backup cannot capture
    archive/<serviceId>/<backupId>/record.json the backup's record (the backup's answer)
    archive/<serviceId>/<backupId>/request.json the body it was made with (replays compare it)
    archive/<serviceId>/<backupId>/<type>...   the captured copies (the database as one file)
    imports/<importId>/meta.json, data         an open closure import and its verified bytes
                                               (gone once aborted; once committed only
                                               meta.json stays: the key's record)
    restores/<serviceId>/<restoreKey>.json      an archive restore applied under its key
    applied.jsonl                               every effect applied, in order (tests count)

A backup is built in a temporary directory and renamed into the archive, so a crash never leaves
half a backup; the same body again answers the same record, another body is 409
`backup-conflict`. A database snapshot's descriptor (`size`, `sha256`, `receipt`) is recorded
when the backup is made: an archive file changed later is exported as it is, and the agent must
notice. The receipt binds service, backup, size and sha256 (this server's key; a real Corestore
signs it), and an import is opened only with a receipt this server issued. A commit re-hashes
the import and replaces the service's database with one `os.replace`: the database is either
as it was or the whole closure, never a mix.

Destructive effects are keyed (docs/corestore-api.md, "Idempotency keys"): an import id is
committed once; its record (`committed`, size, sha256) stays, a second commit answers the
first's result and replaces nothing, and an abort of it is refused (`409 import-committed`).
An archive restore is applied once per restore key: its record is written when the restore is
done, and the same key again answers it, restoring nothing. `applied` lists every database
replacement and archive restore this server made, in order (a journal on disk): what tests
count.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import shutil
import threading
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from agent.corestore.service_models import (
    ArchivePruneBody,
    ClosureImportBody,
    ServiceBackupBody,
    ServiceRestoreBody,
)
from devstack.corestore.ledger import Chunk, ChunkVerdict, judge_chunk, verified_bytes
from devstack.corestore.storage import read_json, refuse, segment, sha256_file, write_json

__all__ = ["RELAY_ENTRIES", "RESOURCE_DIRECTORIES", "Services", "receipt_for"]

RESOURCE_DIRECTORIES = ("objectstorage", "volume")
RELAY_ENTRIES = frozenset({"services", "archive", "imports", "restores", "applied.jsonl"})
"""The top-level names of the data directory this module keeps (the layout above): what an
isolated restore's cleanup leaves alone."""
_RECEIPT_KEY = b"reference-corestore-receipt-key"


def receipt_for(service_id: str, backup_id: str, size: int, sha256: str) -> dict[str, Any]:
    """The receipt this server issues for exactly these closure bytes."""
    message = f"{service_id}\n{backup_id}\n{size}\n{sha256}".encode()
    mac = hmac.new(_RECEIPT_KEY, message, hashlib.sha256).hexdigest()
    return {"issuer": "reference-corestore", "mac": mac}


def _tree_size(root: Path) -> int:
    return sum(path.stat().st_size for path in root.rglob("*") if path.is_file())


class Services:
    """Service data, the node archive and closure imports of one reference Corestore."""

    def __init__(self, data_dir: Path) -> None:
        self.root = data_dir
        self._lock = threading.RLock()
        self._import_locks: dict[str, threading.Lock] = {}
        self._applied = data_dir / "applied.jsonl"

    # --- what tests and the demo set up (not routes) --------------------------------------------

    def service_dir(self, service_id: str) -> Path:
        """Where the service's live resources are."""
        return self.root / "services" / segment(service_id)

    def database_path(self, service_id: str) -> Path:
        """The service's database file (its closure)."""
        return self.service_dir(service_id) / "database"

    def write_database(self, service_id: str, pieces: Iterable[bytes]) -> None:
        """Replace the service's database with the concatenated `pieces`."""
        target = self.database_path(service_id)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".database.{uuid.uuid4().hex}.tmp")
        with tmp.open("wb") as handle:
            for piece in pieces:
                handle.write(piece)
        os.replace(tmp, target)

    def write_file(self, service_id: str, kind: str, path: str, data: bytes) -> None:
        """Put one file into the service's bucket or volume."""
        if kind not in RESOURCE_DIRECTORIES:
            raise ValueError(f"kind must be one of {RESOURCE_DIRECTORIES}")
        target = self.service_dir(service_id) / kind / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)

    def set_uncapturable(self, service_id: str, resources: list[dict[str, Any]]) -> None:
        """Make backups of the service miss these resources (`TBackupUncapturedResource`s)."""
        write_json(self.service_dir(service_id) / "uncapturable.json", resources)

    def archived_closure(self, service_id: str, backup_id: str) -> Path:
        """The archive's copy of the backup's database closure (tests alter it)."""
        return self._backup_dir(service_id, backup_id) / "database"

    def open_imports(self) -> list[str]:
        """The ids of imports open now (not committed, not aborted)."""
        return [i for i, meta in self._imports() if not meta["committed"]]

    def committed_imports(self) -> list[str]:
        """The ids of committed imports (their keys' records)."""
        return [i for i, meta in self._imports() if meta["committed"]]

    @property
    def applied(self) -> list[tuple[str, str, str]]:
        """Every effect this Corestore applied, in order (kept on disk, across restarts):
        ("import", serviceId, importId) for a database a commit replaced, ("restore",
        serviceId, restoreKey) for an archive restore."""
        if not self._applied.exists():
            return []
        lines = self._applied.read_text().splitlines()
        return [(str(k), str(s), str(i)) for k, s, i in map(json.loads, filter(None, lines))]

    def applied_imports(self, service_id: str) -> int:
        """How many times a commit replaced the service's database."""
        return sum(
            1 for kind, service, _ in self.applied if (kind, service) == ("import", service_id)
        )

    def _count_applied(self, kind: str, service_id: str, key: str) -> None:
        with self._lock, self._applied.open("a") as journal:
            journal.write(json.dumps([kind, service_id, key]) + "\n")

    def _imports(self) -> list[tuple[str, dict[str, Any]]]:
        base = self.root / "imports"
        if not base.exists():
            return []
        found = [(p.name, read_json(p / "meta.json")) for p in sorted(base.iterdir())]
        return [(name, meta) for name, meta in found if meta is not None]

    def import_listing(self, after: str | None, limit: int) -> dict[str, Any]:
        """One page of `GET /v1/database-closure-imports`, by importId; `next` the cursor."""
        base = self.root / "imports"
        metas = [read_json(d / "meta.json") for d in base.iterdir()] if base.exists() else []
        found = sorted(
            (str(meta["importId"]), meta)
            for meta in metas
            if meta is not None and "importId" in meta
        )
        found = [(i, meta) for i, meta in found if after is None or i > after]
        page = [
            {
                **self._status(import_id, meta),
                "serviceId": meta["body"]["serviceId"],
                "backupId": meta["body"]["backupId"],
            }
            for import_id, meta in found[:limit]
        ]
        more = len(found) > limit
        return {"imports": page, "next": found[limit - 1][0] if more else None}

    # --- backup, record, restore ----------------------------------------------------------------

    def backup(
        self, service_id: str, backup_id: str, body: ServiceBackupBody
    ) -> tuple[dict[str, Any], bool]:
        """Back the service up (or answer the backup made with this body); `(record, created)`."""
        wire = body.to_wire()
        target = self._backup_dir(service_id, backup_id)
        with self._lock:
            known = read_json(target / "request.json")
            if known is not None:
                if known != wire:
                    raise refuse(409, "backup-conflict", "the backup was made with another body")
                return read_json(target / "record.json"), False
            source = self.service_dir(service_id)
            uncaptured: list[dict[str, Any]] = read_json(source / "uncapturable.json") or []
            missed = {item["type"] for item in uncaptured}
            building = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
            building.mkdir(parents=True)
            snapshots: list[dict[str, Any]] = []
            database = self.database_path(service_id)
            if database.exists() and "database" not in missed:
                shutil.copyfile(database, building / "database")
                size, digest = sha256_file(building / "database")
                snapshots.append(
                    {
                        "type": "database",
                        "snapshotId": f"{backup_id}.database",
                        "resourceName": "database",
                        "size": size,
                        "sha256": digest,
                        "receipt": receipt_for(service_id, backup_id, size, digest),
                    }
                )
            for kind in RESOURCE_DIRECTORIES:
                if (source / kind).is_dir() and kind not in missed:
                    shutil.copytree(source / kind, building / kind)
                    snapshots.append(
                        {
                            "type": kind,
                            "snapshotId": f"{backup_id}.{kind}",
                            "resourceName": kind,
                            "size": _tree_size(building / kind),
                        }
                    )
            record: dict[str, Any] = {
                "serviceId": service_id,
                "backupId": backup_id,
                "createdAt": int(time.time() * 1000),
                "snapshots": snapshots,
                "uncaptured": uncaptured,
            }
            if body.replication is not None and body.replication.enabled:
                record["replication"] = {
                    "totalSize": sum(int(s["size"]) for s in snapshots),
                    "completedAt": record["createdAt"],
                }
            write_json(building / "record.json", record)
            write_json(building / "request.json", wire)
            os.replace(building, target)
        return record, True

    def record(self, service_id: str, backup_id: str) -> dict[str, Any]:
        """The backup's record, or a 404 refusal."""
        record = read_json(self._backup_dir(service_id, backup_id) / "record.json")
        if record is None:
            raise refuse(404, "backup-not-found", "the archive holds no such backup")
        return dict(record)

    def restore(
        self, service_id: str, restore_key: str, body: ServiceRestoreBody
    ) -> tuple[dict[str, Any], bool]:
        """Restore the named snapshots from the archive, in order, once for `restore_key`;
        `({restoreKey, backupId, restored}, applied now)`."""
        wire = body.to_wire()
        record_file = self._restore_record(service_id, restore_key)
        with self._lock:
            known = read_json(record_file)
            if known is not None:
                if known["body"] != wire:
                    raise refuse(
                        409, "restore-key-conflict", "the key was used with another restore"
                    )
                return dict(known["answer"]), False
            restored = self._restore_snapshots(service_id, body.backup_id, body)
            answer = {"restoreKey": restore_key, "backupId": body.backup_id, **restored}
            write_json(record_file, {"body": wire, "answer": answer})
            self._count_applied("restore", service_id, restore_key)
        return answer, True

    def restore_record(self, service_id: str, restore_key: str) -> dict[str, Any]:
        """The restore applied under `restore_key`, or a 404 refusal."""
        known = read_json(self._restore_record(service_id, restore_key))
        if known is None:
            raise refuse(404, "service-restore-not-found", "no restore was applied under the key")
        return dict(known["answer"])

    def _restore_snapshots(
        self, service_id: str, backup_id: str, body: ServiceRestoreBody
    ) -> dict[str, Any]:
        record = self.record(service_id, backup_id)
        by_id = {snapshot["snapshotId"]: snapshot for snapshot in record["snapshots"]}
        chosen: list[dict[str, Any]] = []
        for snapshot_id in body.snapshot_ids:
            snapshot = by_id.get(snapshot_id)
            if snapshot is None:
                raise refuse(404, "snapshot-not-found", "the backup holds no such snapshot")
            if snapshot["type"] not in RESOURCE_DIRECTORIES:
                raise refuse(
                    409, "restore-via-closure", "a database is restored by a closure import"
                )
            chosen.append(snapshot)
        with self._lock:
            for snapshot in chosen:
                kind = snapshot["type"]
                target = self.service_dir(service_id) / kind
                if body.clear and target.exists():
                    shutil.rmtree(target)
                shutil.copytree(
                    self._backup_dir(service_id, backup_id) / kind, target, dirs_exist_ok=True
                )
        return {"restored": chosen}

    # --- the archive ----------------------------------------------------------------------------

    def listing(self) -> dict[str, Any]:
        """Every backup in the archive, oldest first; 404 when the node has no archive."""
        base = self.root / "archive"
        if not base.is_dir():
            raise refuse(404, "archive-not-found", "this node has no archive")
        backups: list[dict[str, Any]] = []
        for record_file in sorted(base.glob("*/*/record.json")):
            record = read_json(record_file)
            backups.append(
                {
                    "serviceId": record["serviceId"],
                    "backupId": record["backupId"],
                    "createdAt": record["createdAt"],
                    "size": _tree_size(record_file.parent),
                }
            )
        backups.sort(key=lambda b: (b["createdAt"], b["serviceId"], b["backupId"]))
        return {"backups": backups}

    def prune(self, body: ArchivePruneBody) -> dict[str, Any]:
        """Keep the newest `keepLast` backups of each service; remove the rest unless dry."""
        with self._lock:
            backups = self.listing()["backups"]
            keep_last = body.retention.keep_last
            removed: list[dict[str, Any]] = []
            if keep_last is not None:
                by_service: dict[str, list[dict[str, Any]]] = {}
                for backup in backups:
                    by_service.setdefault(backup["serviceId"], []).append(backup)
                for entries in by_service.values():
                    removed.extend(entries[: max(0, len(entries) - keep_last)])
            if not body.dry_run:
                for backup in removed:
                    shutil.rmtree(self._backup_dir(backup["serviceId"], backup["backupId"]))
        return {
            "result": {
                "freedBytes": sum(b["size"] for b in removed),
                "dryRun": body.dry_run,
                "removed": [
                    {"serviceId": b["serviceId"], "backupId": b["backupId"]} for b in removed
                ],
                "kept": len(backups) - len(removed),
            }
        }

    # --- closure export -------------------------------------------------------------------------

    def descriptor(self, service_id: str, backup_id: str) -> dict[str, Any]:
        """The backup's closure descriptor, as recorded when the backup was made."""
        for snapshot in self.record(service_id, backup_id)["snapshots"]:
            if snapshot["type"] == "database":
                return {
                    "size": snapshot["size"],
                    "sha256": snapshot["sha256"],
                    "receipt": snapshot["receipt"],
                    "snapshotId": snapshot["snapshotId"],
                }
        raise refuse(404, "closure-not-found", "the backup holds no database closure")

    def read_closure(self, service_id: str, backup_id: str, offset: int, length: int) -> bytes:
        """At most `length` bytes of the archived closure from `offset`."""
        self.descriptor(service_id, backup_id)
        with self.archived_closure(service_id, backup_id).open("rb") as handle:
            handle.seek(offset)
            return handle.read(length)

    # --- closure import -------------------------------------------------------------------------

    def import_status(self, import_id: str) -> dict[str, Any]:
        """The import as it stands (open or committed), or a 404 refusal."""
        with self._import_lock(import_id):
            return self._status(import_id, self._meta(import_id))

    def open_import(self, import_id: str, body: ClosureImportBody) -> tuple[dict[str, Any], bool]:
        """Open an import for the descriptor's bytes (receipt checked); `(status, created)`.
        A committed import of the same body answers its status (`committed`)."""
        expected = receipt_for(body.service_id, body.backup_id, body.size, body.sha256)
        if body.receipt != expected:
            raise refuse(422, "receipt-invalid", "the receipt is not this Corestore's for them")
        wire = body.to_wire()
        with self._import_lock(import_id):
            meta = read_json(self._import_dir(import_id) / "meta.json")
            if meta is not None and meta["body"] != wire:
                raise refuse(409, "import-conflict", "the import was opened with another body")
            created = meta is None
            if meta is None:
                meta = {"body": wire, "chunks": [], "committed": False, "importId": import_id}
                write_json(self._import_dir(import_id) / "meta.json", meta)
        return self._status(import_id, meta), created

    def put_import_chunk(
        self, import_id: str, offset: int, data: bytes, sha256: str
    ) -> dict[str, Any]:
        """Verify and write one chunk of an import (the staging ledger's rules)."""
        if hashlib.sha256(data).hexdigest() != sha256:
            raise refuse(422, "chunk-digest-mismatch", "the chunk bytes do not match its sha256")
        chunk = Chunk(offset, len(data), sha256)
        with self._import_lock(import_id):
            meta = self._meta(import_id)
            counted = [Chunk(**c) for c in meta["chunks"]]
            verdict = judge_chunk(counted, meta["body"]["size"], meta["committed"], chunk)
            if verdict is ChunkVerdict.APPEND:
                target = self._import_dir(import_id) / "data"
                with target.open("r+b" if target.exists() else "wb") as handle:
                    handle.truncate(offset)
                    handle.seek(offset)
                    handle.write(data)
                    handle.flush()
                    os.fsync(handle.fileno())
                counted.append(chunk)
                meta["chunks"].append({"offset": offset, "length": len(data), "sha256": sha256})
                write_json(self._import_dir(import_id) / "meta.json", meta)
            elif verdict is not ChunkVerdict.REPLAY:
                raise refuse(409, verdict.value, f"the chunk at offset {offset} is refused")
        return {
            "offset": offset,
            "length": len(data),
            "sha256": sha256,
            "verifiedBytes": verified_bytes(counted),
        }

    def commit_import(self, import_id: str, size: int, sha256: str) -> dict[str, Any]:
        """Re-hash the import and replace the service's database with it, or remove the
        import (the database untouched) and refuse."""
        with self._import_lock(import_id):
            meta = self._meta(import_id)
            body = meta["body"]
            answer = {"importId": import_id, "size": size, "sha256": sha256}
            if (body["size"], body["sha256"]) != (size, sha256):
                raise refuse(409, "import-mismatch", "size and sha256 differ from the import's")
            if meta["committed"]:
                return answer  # the key was committed once: the first commit's answer
            verified = verified_bytes([Chunk(**c) for c in meta["chunks"]])
            if verified < size:
                raise refuse(409, "import-incomplete", f"{verified} of {size} bytes are verified")
            data = self._import_dir(import_id) / "data"
            if size == 0:
                data.touch()
            if sha256_file(data) != (size, sha256):
                shutil.rmtree(self._import_dir(import_id))
                raise refuse(422, "closure-digest-mismatch", "the import does not match its sha256")
            target = self.database_path(body["serviceId"])
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(data, target)
            # Only the key's record is left of a committed import: the database holds its bytes.
            meta["committed"] = True
            write_json(self._import_dir(import_id) / "meta.json", meta)
            self._count_applied("import", body["serviceId"], import_id)
        return answer

    def abort_import(self, import_id: str) -> None:
        """Remove an import, or a 404 refusal when there is none."""
        with self._import_lock(import_id):
            if self._meta(import_id)["committed"]:
                raise refuse(409, "import-committed", "a committed import's key is kept")
            shutil.rmtree(self._import_dir(import_id))

    # --- helpers --------------------------------------------------------------------------------

    def _backup_dir(self, service_id: str, backup_id: str) -> Path:
        return self.root / "archive" / segment(service_id) / segment(backup_id)

    def _import_dir(self, import_id: str) -> Path:
        return self.root / "imports" / segment(import_id)

    def _meta(self, import_id: str) -> dict[str, Any]:
        meta = read_json(self._import_dir(import_id) / "meta.json")
        if meta is None:
            raise refuse(404, "import-not-found", "no such closure import")
        return dict(meta)

    def _status(self, import_id: str, meta: dict[str, Any]) -> dict[str, Any]:
        status = {
            "importId": import_id,
            "state": "committed" if meta["committed"] else "open",
            "size": meta["body"]["size"],
            "verifiedBytes": verified_bytes([Chunk(**c) for c in meta["chunks"]]),
        }
        if meta["committed"]:
            status["sha256"] = meta["body"]["sha256"]
        return status

    def _restore_record(self, service_id: str, restore_key: str) -> Path:
        return self.root / "restores" / segment(service_id) / f"{segment(restore_key)}.json"

    def _import_lock(self, import_id: str) -> threading.Lock:
        with self._lock:
            return self._import_locks.setdefault(import_id, threading.Lock())
