"""The reference Corestore's scratch namespaces: restoring, verifying and deleting resources.

Synchronous and thread-safe, like `storage.py`. Layout under `data_dir`:

    scratch/<namespace>/<mappingId>/...        a restored resource: its snapshot's files
    scratch-meta/<namespace>/<mappingId>.json  its restore state (running, succeeded, failed)

A mapping's snapshot is the manifest objects under `<source.snapshotId>/` (this server's
convention; a real Corestore knows its archive format); each is copied to its path below that
prefix. A restore runs in a worker thread and builds the resource in a temporary directory that
replaces the resource only if no delete or newer start overtook it (`generation`). A state
`running` on disk that no live run owns (the server restarted) reads as `failed` /
`restore-interrupted`, and starting the restore again runs it again. `forget` deletes a prepared
restore once none of its resources (and not its staging archive) is left.
"""

from __future__ import annotations

import shutil
import threading
import uuid
from pathlib import Path
from typing import Any

from agent.corestore.models import MappingBody, PrepareRestoreBody
from agent.errors import CorestoreRefused
from devstack.corestore.storage import (
    Storage,
    read_json,
    refuse,
    segment,
    sha256_file,
    write_json,
)

__all__ = ["Scratch"]

_Key = tuple[str, str]


class Scratch:
    """Restored resources of every prepared restore."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage
        self._lock = threading.Lock()
        self._running: dict[_Key, int] = {}  # live runs, by generation
        self._generation = 0

    def start(self, restore_id: str, mapping_id: str) -> tuple[dict[str, Any], int | None]:
        """The `ResourceStatus` answer and the generation to run, None when nothing must run."""
        with self._lock:
            body, mapping = self._storage.mapping(restore_id, mapping_id)
            answer = self._status(restore_id, body, mapping)
            if answer["state"] in ("running", "succeeded"):
                return answer, None
            archive = body.staging_archive_id
            objects = self._storage.snapshot_objects(body, mapping)
            if not objects:
                raise refuse(409, "snapshot-not-staged", "the manifest holds no such snapshot")
            if not all(self._storage.committed(archive, o.path) for o in objects):
                raise refuse(409, "staging-incomplete", "the snapshot is not completely staged")
            self._generation += 1
            self._running[(restore_id, mapping_id)] = self._generation
            write_json(self._meta(body, mapping), {"state": "running"})
            return {**answer, "state": "running"}, self._generation

    def run(self, restore_id: str, mapping_id: str, generation: int) -> None:
        """Copy the snapshot into the scratch namespace (in a worker thread)."""
        key = (restore_id, mapping_id)
        body, mapping = self._storage.mapping(restore_id, mapping_id)
        final = self._resource(body, mapping)
        work = final.with_name(f".{final.name}.{uuid.uuid4().hex}.tmp")
        prefix = mapping.source.snapshot_id + "/"
        error: dict[str, str] | None = None
        try:
            for entry in self._storage.snapshot_objects(body, mapping):
                target = work.joinpath(*entry.path[len(prefix) :].split("/"))
                target.parent.mkdir(parents=True, exist_ok=True)
                source = self._storage.object_path(body.staging_archive_id, entry.path)
                shutil.copyfile(source, target)
            work.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            error = {"code": "restore-failed", "message": f"copying failed: {type(exc).__name__}"}
        with self._lock:
            if self._running.get(key) != generation:  # deleted or restarted meanwhile
                shutil.rmtree(work, ignore_errors=True)
                return
            del self._running[key]
            if error is None:
                shutil.rmtree(final, ignore_errors=True)
                work.rename(final)
                write_json(self._meta(body, mapping), {"state": "succeeded"})
            else:
                shutil.rmtree(work, ignore_errors=True)
                write_json(self._meta(body, mapping), {"state": "failed", "error": error})

    def status(self, restore_id: str, mapping_id: str) -> dict[str, Any]:
        """The `ResourceStatus` answer."""
        with self._lock:
            body, mapping = self._storage.mapping(restore_id, mapping_id)
            return self._status(restore_id, body, mapping)

    def verify(self, restore_id: str, mapping_id: str) -> dict[str, Any]:
        """Corestore's `VerificationAnswer`: real checks of the restored bytes."""
        body, mapping = self._storage.mapping(restore_id, mapping_id)
        state = self.status(restore_id, mapping_id)["state"]
        resource = self._resource(body, mapping)
        prefix = mapping.source.snapshot_id + "/"
        missing, wrong = [], []
        for entry in self._storage.snapshot_objects(body, mapping):
            file = resource.joinpath(*entry.path[len(prefix) :].split("/"))
            if not file.is_file():
                missing.append(entry.path)
            elif sha256_file(file) != (entry.size, entry.sha256):
                wrong.append(entry.path)
        checks = [
            _check("resource-restored", state == "succeeded", f"the restore is {state}"),
            _check("objects-present", not missing, f"{len(missing)} object(s) missing"),
            _check("content-sha256", not (missing or wrong), f"{len(wrong)} object(s) differ"),
        ]
        passed = all(check["status"] == "passed" for check in checks)
        return {
            "mappingId": mapping_id,
            "resourceType": mapping.type,
            "status": "passed" if passed else "failed",
            "checks": checks,
        }

    def delete(self, restore_id: str, mapping_id: str) -> None:
        """Remove one restored resource (stopping its run), or a 404 refusal if there is none."""
        with self._lock:
            body, mapping = self._storage.mapping(restore_id, mapping_id)
            self._running.pop((restore_id, mapping_id), None)
            resource, meta = self._resource(body, mapping), self._meta(body, mapping)
            found = resource.exists() or meta.exists()
            shutil.rmtree(resource, ignore_errors=True)
            meta.unlink(missing_ok=True)
            for directory in (resource.parent, meta.parent):
                if directory.exists() and not any(directory.iterdir()):
                    directory.rmdir()
        if not found:
            raise refuse(404, "resource-not-found", "no such restored resource")

    def forget(self, restore_id: str) -> None:
        """Delete the prepared restore: 404 when there is none, 409 `restore-not-empty` while a
        restored resource (or a run of one) or the staging archive of it still exists."""
        with self._lock:  # no restore of it can start meanwhile
            body = self._storage.restore(restore_id)
            held = [
                mapping.id
                for mapping in body.resource_mappings
                if (restore_id, mapping.id) in self._running
                or self._resource(body, mapping).exists()
                or self._meta(body, mapping).exists()
            ]
            if held:
                raise refuse(
                    409,
                    "restore-not-empty",
                    f"{len(held)} scratch resource(s) of the restore still exist",
                )
            self._storage.forget(restore_id)

    def listing(self, after: str | None, limit: int) -> dict[str, Any]:
        """One page of `GET /v1/isolated-restores`: each prepared restore with the resources
        it has on the disk and whether its staging archive exists; `next` the cursor."""
        page: list[dict[str, Any]] = []
        ids = self._storage.restore_ids(after, limit + 1)
        for restore_id in ids[:limit]:
            try:
                body = self._storage.restore(restore_id)
            except CorestoreRefused:
                continue  # forgotten meanwhile
            with self._lock:
                resources = [
                    {"mappingId": mapping.id, "state": status["state"]}
                    for mapping in body.resource_mappings
                    if (status := self._status(restore_id, body, mapping))["state"] != "absent"
                ]
            page.append(
                {
                    "restoreId": restore_id,
                    "scratchNamespaceId": body.scratch_namespace_id,
                    "stagingArchiveId": body.staging_archive_id,
                    "resourceMappings": [m.to_wire() for m in body.resource_mappings],
                    "resources": resources,
                    "stagingArchive": self._storage.archive_exists(
                        restore_id, body.staging_archive_id
                    ),
                }
            )
        more = len(ids) > limit
        return {"restores": page, "next": ids[limit - 1] if more else None}

    def _status(
        self, restore_id: str, body: PrepareRestoreBody, mapping: MappingBody
    ) -> dict[str, Any]:
        known = read_json(self._meta(body, mapping)) or {"state": "absent"}
        if known["state"] == "running" and (restore_id, mapping.id) not in self._running:
            known = {
                "state": "failed",
                "error": {"code": "restore-interrupted", "message": "Corestore restarted"},
            }
        return {
            "restoreId": restore_id,
            "mappingId": mapping.id,
            "resourceType": mapping.type,
            **known,
        }

    def _resource(self, body: PrepareRestoreBody, mapping: MappingBody) -> Path:
        root = self._storage.root / "scratch"
        return root / segment(body.scratch_namespace_id) / segment(mapping.id)

    def _meta(self, body: PrepareRestoreBody, mapping: MappingBody) -> Path:
        root = self._storage.root / "scratch-meta"
        return root / segment(body.scratch_namespace_id) / f"{segment(mapping.id)}.json"


def _check(code: str, passed: bool, failure: str) -> dict[str, str]:
    if passed:
        return {"code": code, "status": "passed"}
    return {"code": code, "status": "failed", "message": failure}
