"""The relay's service routes' requests and the reconciliation listings (pure; the bearer
only, no restore grant): service backup and restore, the node archive (listing, prune), the
database closure's export (descriptor, ranged reads) and import (open, chunks, commit, status,
abort), and the pages of what a node holds.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.contracts.backup import ArchiveRetentionPolicy
from agent.contracts.relay import DatabaseClosureDescriptor, ReplicationOption
from agent.corestore.builders import body_of, path_for, request_for
from agent.corestore.models import CommitObjectBody
from agent.corestore.routes import LIST_PAGE_LIMIT, ROUTES, RouteName, RouteRequest
from agent.corestore.service_models import (
    ArchivePruneBody,
    ClosureImportBody,
    ServiceBackupBody,
    ServiceRestoreBody,
)
from agent.corestore.shapes import MAX_CHUNK_SIZE, check_chunk, check_id
from agent.errors import LocalProtocolError

__all__ = [
    "build_archive_list",
    "build_archive_prune",
    "build_backup_record",
    "build_closure_descriptor",
    "build_closure_import",
    "build_closure_import_abort",
    "build_closure_import_chunk",
    "build_closure_import_commit",
    "build_closure_import_list",
    "build_closure_import_status",
    "build_closure_read",
    "build_restore_list",
    "build_service_backup",
    "build_service_restore",
    "build_service_restore_status",
]


def _service_path(template: str, service_id: str, backup_id: str) -> str:
    return path_for(template, serviceId=service_id, backupId=backup_id)


def build_service_backup(
    service_id: str,
    backup_id: str,
    *,
    service: Mapping[str, Any],
    tags: Mapping[str, str] | None,
    replication: ReplicationOption | None,
) -> RouteRequest:
    """`PUT /v1/services/{serviceId}/backups/{backupId}`: back the service's resources up."""
    name = RouteName.SERVICE_BACKUP
    body = body_of(
        name,
        lambda: ServiceBackupBody(
            service=dict(service),
            tags=None if tags is None else dict(tags),
            replication=replication,
        ),
    )
    path = _service_path(ROUTES[name].template, service_id, backup_id)
    return request_for(name, None, path, body=body, content_type="application/json")


def build_backup_record(service_id: str, backup_id: str) -> RouteRequest:
    """`GET /v1/services/{serviceId}/backups/{backupId}`: Corestore's record of the backup."""
    path = _service_path(ROUTES[RouteName.BACKUP_RECORD].template, service_id, backup_id)
    return request_for(RouteName.BACKUP_RECORD, None, path)


def build_service_restore(
    service_id: str, restore_key: str, backup_id: str, snapshot_ids: list[str], *, clear: bool
) -> RouteRequest:
    """`PUT /v1/services/{serviceId}/restores/{restoreKey}`: restore exactly these snapshots of
    the backup from the archive, once for the key."""
    name = RouteName.SERVICE_RESTORE
    body = body_of(
        name,
        lambda: ServiceRestoreBody(backup_id=backup_id, snapshot_ids=snapshot_ids, clear=clear),
    )
    path = path_for(ROUTES[name].template, serviceId=service_id, restoreKey=restore_key)
    return request_for(name, None, path, body=body, content_type="application/json")


def build_service_restore_status(service_id: str, restore_key: str) -> RouteRequest:
    """`GET /v1/services/{serviceId}/restores/{restoreKey}`: the restore applied under the key
    (404 service-restore-not-found: none was)."""
    path = path_for(
        ROUTES[RouteName.SERVICE_RESTORE_STATUS].template,
        serviceId=service_id,
        restoreKey=restore_key,
    )
    return request_for(RouteName.SERVICE_RESTORE_STATUS, None, path)


def build_archive_list() -> RouteRequest:
    """`GET /v1/archive`: the backups the node's archive holds (404 archive-not-found: none)."""
    return request_for(RouteName.ARCHIVE_LIST, None, ROUTES[RouteName.ARCHIVE_LIST].template)


def build_archive_prune(retention: ArchiveRetentionPolicy, *, dry_run: bool) -> RouteRequest:
    """`POST /v1/archive/prune` (404 archive-not-found: the node has no archive)."""
    name = RouteName.ARCHIVE_PRUNE
    body = body_of(name, lambda: ArchivePruneBody(retention=retention, dry_run=dry_run))
    return request_for(
        name, None, ROUTES[name].template, body=body, content_type="application/json"
    )


def build_closure_descriptor(service_id: str, backup_id: str) -> RouteRequest:
    """`GET .../backups/{backupId}/closure`: the database closure's descriptor."""
    path = _service_path(ROUTES[RouteName.CLOSURE_DESCRIPTOR].template, service_id, backup_id)
    return request_for(RouteName.CLOSURE_DESCRIPTOR, None, path)


def build_closure_read(service_id: str, backup_id: str, offset: int, length: int) -> RouteRequest:
    """`GET .../closure/bytes?offset=N&length=L`: at most `length` bytes from `offset` (fewer
    only at the end of the closure, none at or past it)."""
    if offset < 0 or not 0 < length <= MAX_CHUNK_SIZE:
        raise LocalProtocolError(
            f"a closure read is offset >= 0 and 1 to {MAX_CHUNK_SIZE} bytes, not {offset}+{length}"
        )
    name = RouteName.CLOSURE_READ
    path = _service_path(ROUTES[name].template, service_id, backup_id)
    return request_for(name, None, path, query={"offset": str(offset), "length": str(length)})


def build_closure_import(
    import_id: str,
    *,
    service_id: str,
    backup_id: str,
    descriptor: DatabaseClosureDescriptor,
) -> RouteRequest:
    """`PUT /v1/database-closure-imports/{importId}`: open an import for exactly these bytes."""
    name = RouteName.CLOSURE_IMPORT
    body = body_of(
        name,
        lambda: ClosureImportBody(
            service_id=service_id,
            backup_id=backup_id,
            size=descriptor.size,
            sha256=descriptor.sha256,
            receipt=descriptor.receipt,
        ),
    )
    path = path_for(ROUTES[name].template, importId=import_id)
    return request_for(name, None, path, body=body, content_type="application/json")


def build_closure_import_chunk(
    import_id: str, offset: int, data: bytes | bytearray | memoryview, sha256: str
) -> RouteRequest:
    """`PUT .../{importId}/chunks?offset=N`: one chunk, its sha256 in the chunk header."""
    check_chunk(data, offset, sha256)
    name = RouteName.CLOSURE_IMPORT_CHUNK
    return request_for(
        name,
        None,
        path_for(ROUTES[name].template, importId=import_id),
        query={"offset": str(offset)},
        body=data,
        content_type="application/octet-stream",
        chunk_sha256=sha256,
    )


def build_closure_import_commit(import_id: str, size: int, sha256: str) -> RouteRequest:
    """`POST .../{importId}/commit` with `{size, sha256}`: re-hash, then replace the database."""
    name = RouteName.CLOSURE_IMPORT_COMMIT
    body = body_of(name, lambda: CommitObjectBody(size=size, sha256=sha256))
    path = path_for(ROUTES[name].template, importId=import_id)
    return request_for(name, None, path, body=body, content_type="application/json")


def build_closure_import_status(import_id: str) -> RouteRequest:
    """`GET /v1/database-closure-imports/{importId}`: the import as it stands, open or committed
    (404 import-not-found: none)."""
    name = RouteName.CLOSURE_IMPORT_STATUS
    return request_for(name, None, path_for(ROUTES[name].template, importId=import_id))


def build_closure_import_abort(import_id: str) -> RouteRequest:
    """`DELETE /v1/database-closure-imports/{importId}`: drop the import; the database stays."""
    name = RouteName.CLOSURE_IMPORT_ABORT
    return request_for(name, None, path_for(ROUTES[name].template, importId=import_id))


# --- reconciliation listings --------------------------------------------------------------------


def _page_query(after: str | None, limit: int) -> dict[str, str]:
    if not 1 <= limit <= LIST_PAGE_LIMIT:
        raise LocalProtocolError(
            f"a listing page holds 1 to {LIST_PAGE_LIMIT} entries, not {limit}"
        )
    query = {"limit": str(limit)}
    if after is not None:
        check_id(after, "after")
        query["after"] = after
    return query


def build_restore_list(after: str | None = None, limit: int = LIST_PAGE_LIMIT) -> RouteRequest:
    """`GET /v1/isolated-restores?after=ID&limit=N`: the prepared restores the node holds, by
    restoreId after `after`, each with its scratch resources and staging archive."""
    name = RouteName.RESTORE_LIST
    return request_for(name, None, ROUTES[name].template, query=_page_query(after, limit))


def build_closure_import_list(
    after: str | None = None, limit: int = LIST_PAGE_LIMIT
) -> RouteRequest:
    """`GET /v1/database-closure-imports?after=ID&limit=N`: the closure imports the node holds,
    by importId after `after`."""
    name = RouteName.CLOSURE_IMPORT_LIST
    return request_for(name, None, ROUTES[name].template, query=_page_query(after, limit))
