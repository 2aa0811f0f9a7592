"""THE one place that knows Corestore's control routes (see docs/corestore-api.md).

Two families: the isolated-restore routes (restore grant + bearer) and the service routes of
the relay duties (bearer only): service backup and restore, the node archive (listing, prune),
database closure export (descriptor, then ranged reads) and import (open, chunks, commit,
abort).

Pure: no I/O, no asyncio. `build_*` functions turn typed arguments into a `RouteRequest` (method,
encoded path, query, body, the grant to carry); `parse_answer` turns a 2xx body into a small frozen
model; `classify_answer` decides what any status means. The client (`client.py`) sends what this
module builds, and the reference server (`devstack/corestore/`) registers `ROUTES` and parses
bodies with the same models, so the two cannot drift.

Request bodies are exact (`extra="forbid"`); answers tolerate fields a newer Corestore adds.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, TypeVar
from urllib.parse import quote

from pydantic import BaseModel, ValidationError

from agent.contracts.backup import ArchiveRetentionPolicy
from agent.contracts.base import first_problem
from agent.contracts.relay import DatabaseClosureDescriptor, ReplicationOption
from agent.corestore.models import (
    ArchiveManifest,
    ChunkAccepted,
    CommitObjectBody,
    Deleted,
    ErrorAnswer,
    Health,
    MappingBody,
    ObjectCommitted,
    ObjectProgress,
    PreparedRestore,
    PrepareRestoreBody,
    ResourceStatus,
    RestoreListing,
    VerificationAnswer,
)
from agent.corestore.service_models import (
    ArchiveListing,
    ArchivePruneBody,
    ArchivePruned,
    ClosureChunkAccepted,
    ClosureImportBody,
    ClosureImportCommitted,
    ClosureImportListing,
    ClosureImportStatus,
    ServiceBackupBody,
    ServiceBackupRecord,
    ServiceRestoreBody,
    ServiceRestored,
)
from agent.corestore.shapes import (
    MAX_CHUNK_SIZE,
    check_archive_path,
    check_id,
    check_sha256,
    is_compact_jws,
)
from agent.errors import GrantInvalid, LocalProtocolError
from agent.secret import Secret

__all__ = [
    "HEADER_AUTHORIZATION",
    "HEADER_CHUNK_SHA256",
    "HEADER_RESTORE_GRANT",
    "LIST_PAGE_LIMIT",
    "MAX_ANSWER_BYTES",
    "ROUTES",
    "STORAGE_FULL_CODE",
    "AnswerKind",
    "RouteName",
    "RouteRequest",
    "RouteSpec",
    "SupportsToWire",
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
    "build_commit_object",
    "build_delete_object",
    "build_delete_resource",
    "build_delete_restore",
    "build_delete_staging_archive",
    "build_health",
    "build_object_progress",
    "build_prepare_restore",
    "build_put_chunk",
    "build_resource_status",
    "build_restore_list",
    "build_restore_resource",
    "build_service_backup",
    "build_service_restore",
    "build_service_restore_status",
    "build_verify_resource",
    "classify_answer",
    "is_credential_refusal",
    "parse_answer",
    "parse_error",
    "request_headers",
]

HEADER_AUTHORIZATION: Final = "Authorization"
HEADER_RESTORE_GRANT: Final = "X-Serve-Zone-Restore-Grant"
HEADER_CHUNK_SHA256: Final = "X-Serve-Zone-Chunk-Sha256"
# Answers are small JSON documents; anything bigger is not a Corestore answer.
MAX_ANSWER_BYTES: Final = 1024 * 1024

_RESTORE: Final = "/v1/isolated-restores/{restoreId}"
_RESOURCE: Final = _RESTORE + "/resources/{mappingId}"
_ARCHIVE: Final = "/v1/staging-archives/{stagingArchiveId}"
_OBJECTS: Final = _ARCHIVE + "/objects"
_SERVICE_BACKUP: Final = "/v1/services/{serviceId}/backups/{backupId}"
_CLOSURE: Final = _SERVICE_BACKUP + "/closure"
_NODE_ARCHIVE: Final = "/v1/archive"
_IMPORTS: Final = "/v1/database-closure-imports"
_IMPORT: Final = _IMPORTS + "/{importId}"
_SERVICE_RESTORE: Final = "/v1/services/{serviceId}/restores/{restoreKey}"
_RESTORES: Final = "/v1/isolated-restores"
# The most entries one listing page may hold (Corestore may answer fewer).
LIST_PAGE_LIMIT: Final = 100


class RouteName(enum.StrEnum):
    """Every route this agent relies on; also the keys of the reference server's faults."""

    HEALTH = "health"
    PREPARE_RESTORE = "prepare-restore"
    PUT_CHUNK = "put-chunk"
    OBJECT_PROGRESS = "object-progress"
    COMMIT_OBJECT = "commit-object"
    DELETE_OBJECT = "delete-object"
    DELETE_STAGING_ARCHIVE = "delete-staging-archive"
    RESTORE_RESOURCE = "restore-resource"
    RESOURCE_STATUS = "resource-status"
    VERIFY_RESOURCE = "verify-resource"
    DELETE_RESOURCE = "delete-resource"
    DELETE_RESTORE = "delete-restore"
    SERVICE_BACKUP = "service-backup"
    BACKUP_RECORD = "backup-record"
    SERVICE_RESTORE = "service-restore"
    SERVICE_RESTORE_STATUS = "service-restore-status"
    ARCHIVE_LIST = "archive-list"
    ARCHIVE_PRUNE = "archive-prune"
    CLOSURE_DESCRIPTOR = "closure-descriptor"
    CLOSURE_READ = "closure-read"
    CLOSURE_IMPORT = "closure-import"
    CLOSURE_IMPORT_CHUNK = "closure-import-chunk"
    CLOSURE_IMPORT_COMMIT = "closure-import-commit"
    CLOSURE_IMPORT_ABORT = "closure-import-abort"
    CLOSURE_IMPORT_STATUS = "closure-import-status"
    RESTORE_LIST = "restore-list"
    CLOSURE_IMPORT_LIST = "closure-import-list"


class AnswerKind(enum.Enum):
    """What an HTTP answer means to the agent."""

    OK = "ok"  # the documented success; parse it
    GONE = "gone"  # a delete found nothing to delete: counts as cleaned
    INTEGRITY = "integrity"  # Corestore refused bytes that do not match their digest
    REFUSED = "refused"  # any other 4xx: retrying the same request cannot help
    UNAVAILABLE = "unavailable"  # 5xx, 408, 429: Corestore may answer later
    STORAGE_FULL = "storage-full"  # 507, or a 5xx `storage-full`: Corestore's disk is full


@dataclass(frozen=True, slots=True)
class RouteSpec:
    """One route: how it is called and what its answers mean."""

    name: RouteName
    method: str
    template: str  # aiohttp-style path template
    answer: type[BaseModel] | None  # None: the answer is raw bytes (a closure read)
    success: frozenset[int]
    idempotent: bool  # safe to resend after an unknown outcome: the client retries it
    grant: bool = True  # carries the restore grant
    authenticated: bool = True  # carries the bearer credential
    transfer: bool = False  # moves or hashes bulk bytes: uses the transfer timeout
    gone_codes: frozenset[str] = frozenset()  # 404 codes meaning "already deleted"/"none"
    answer_limit: int = MAX_ANSWER_BYTES  # the largest answer body the client reads


def _spec(
    name: RouteName, method: str, template: str, answer: type[BaseModel] | None, **kw: Any
) -> tuple[RouteName, RouteSpec]:
    success = frozenset(kw.pop("success", (200,)))
    return name, RouteSpec(name, method, template, answer, success, **kw)


ROUTES: Final[Mapping[RouteName, RouteSpec]] = dict(
    [
        _spec(
            RouteName.HEALTH, "GET", "/health", Health,
            idempotent=True, grant=False, authenticated=False,
        ),
        _spec(
            RouteName.PREPARE_RESTORE, "PUT", _RESTORE, PreparedRestore,
            success=(200, 201), idempotent=True,
        ),
        _spec(RouteName.PUT_CHUNK, "PUT", _OBJECTS, ChunkAccepted, idempotent=True, transfer=True),
        _spec(RouteName.OBJECT_PROGRESS, "GET", _OBJECTS, ObjectProgress, idempotent=True),
        # Not retried: a mismatch removes the partial object and a re-hash of a large object
        # may outlast the timeout; after an unknown outcome the caller asks object-progress.
        _spec(
            RouteName.COMMIT_OBJECT, "POST", _OBJECTS + "/commit", ObjectCommitted,
            idempotent=False, transfer=True,
        ),
        _spec(
            RouteName.DELETE_OBJECT, "DELETE", _OBJECTS, Deleted,
            idempotent=True,
            gone_codes=frozenset({"object-not-found", "staging-archive-not-found"}),
        ),
        _spec(
            RouteName.DELETE_STAGING_ARCHIVE, "DELETE", _ARCHIVE, Deleted,
            idempotent=True, gone_codes=frozenset({"staging-archive-not-found"}),
        ),
        _spec(
            RouteName.RESTORE_RESOURCE, "POST", _RESOURCE + "/restore", ResourceStatus,
            success=(200, 202), idempotent=True,
        ),
        _spec(RouteName.RESOURCE_STATUS, "GET", _RESOURCE, ResourceStatus, idempotent=True),
        _spec(
            RouteName.VERIFY_RESOURCE, "POST", _RESOURCE + "/verify", VerificationAnswer,
            idempotent=True, transfer=True,
        ),
        _spec(
            RouteName.DELETE_RESOURCE, "DELETE", _RESOURCE, Deleted,
            idempotent=True, gone_codes=frozenset({"resource-not-found", "restore-not-found"}),
        ),
        # Refused (409 restore-not-empty) while a scratch resource or the staging archive of
        # the restore exists: cleanup deletes those first.
        _spec(
            RouteName.DELETE_RESTORE, "DELETE", _RESTORE, Deleted,
            idempotent=True, gone_codes=frozenset({"restore-not-found"}),
        ),
        # --- the relay's service routes: the bearer only, no restore grant ---
        # The same body answers the same record (201 the first time): a replay after a crash
        # never makes a second backup; another body for the same ids is 409 backup-conflict.
        _spec(
            RouteName.SERVICE_BACKUP, "PUT", _SERVICE_BACKUP, ServiceBackupRecord,
            success=(200, 201), idempotent=True, grant=False, transfer=True,
        ),
        _spec(
            RouteName.BACKUP_RECORD, "GET", _SERVICE_BACKUP, ServiceBackupRecord,
            idempotent=True, grant=False,
        ),
        # Keyed: Corestore applies one restore key once and answers its record again (200);
        # the same key with another body is 409 restore-key-conflict.
        _spec(
            RouteName.SERVICE_RESTORE, "PUT", _SERVICE_RESTORE, ServiceRestored,
            success=(200, 201), idempotent=True, grant=False, transfer=True,
        ),
        _spec(
            RouteName.SERVICE_RESTORE_STATUS, "GET", _SERVICE_RESTORE, ServiceRestored,
            idempotent=True, grant=False,
            gone_codes=frozenset({"service-restore-not-found"}),
        ),
        _spec(
            RouteName.ARCHIVE_LIST, "GET", _NODE_ARCHIVE, ArchiveListing,
            idempotent=True, grant=False, gone_codes=frozenset({"archive-not-found"}),
        ),
        # Idempotent: a second prune with the same retention finds nothing more to remove.
        _spec(
            RouteName.ARCHIVE_PRUNE, "POST", _NODE_ARCHIVE + "/prune", ArchivePruned,
            idempotent=True, grant=False, transfer=True,
            gone_codes=frozenset({"archive-not-found"}),
        ),
        _spec(
            RouteName.CLOSURE_DESCRIPTOR, "GET", _CLOSURE, DatabaseClosureDescriptor,
            idempotent=True, grant=False,
        ),
        _spec(
            RouteName.CLOSURE_READ, "GET", _CLOSURE + "/bytes", None,
            idempotent=True, grant=False, transfer=True, answer_limit=MAX_CHUNK_SIZE,
        ),
        _spec(
            RouteName.CLOSURE_IMPORT, "PUT", _IMPORT, ClosureImportStatus,
            success=(200, 201), idempotent=True, grant=False,
        ),
        _spec(
            RouteName.CLOSURE_IMPORT_CHUNK, "PUT", _IMPORT + "/chunks", ClosureChunkAccepted,
            idempotent=True, grant=False, transfer=True,
        ),
        # Not retried, like commit-object: a mismatch removes the import, and the re-hash of a
        # large closure may outlast the timeout; after an unknown outcome the caller asks the
        # import's state (`closure-import-status`: `committed` = done). The import id is the
        # key: Corestore commits one key once, and answers a second commit with the first's.
        _spec(
            RouteName.CLOSURE_IMPORT_COMMIT, "POST", _IMPORT + "/commit", ClosureImportCommitted,
            idempotent=False, grant=False, transfer=True,
        ),
        # A committed import is no longer aborted (409 import-committed): its key stays.
        _spec(
            RouteName.CLOSURE_IMPORT_ABORT, "DELETE", _IMPORT, Deleted,
            idempotent=True, grant=False, gone_codes=frozenset({"import-not-found"}),
        ),
        _spec(
            RouteName.CLOSURE_IMPORT_STATUS, "GET", _IMPORT, ClosureImportStatus,
            idempotent=True, grant=False, gone_codes=frozenset({"import-not-found"}),
        ),
        # --- reconciliation: what the node holds, page by page (the bearer only) ---
        _spec(
            RouteName.RESTORE_LIST, "GET", _RESTORES, RestoreListing,
            idempotent=True, grant=False,
        ),
        _spec(
            RouteName.CLOSURE_IMPORT_LIST, "GET", _IMPORTS, ClosureImportListing,
            idempotent=True, grant=False,
        ),
    ]
)  # fmt: skip

# What Corestore answers when its disk is full (docs/corestore-api.md, "Errors").
_INSUFFICIENT_STORAGE: Final = 507
STORAGE_FULL_CODE: Final = "storage-full"

# 422 codes for bytes that do not match their digest: the sender may resend them.
_INTEGRITY_CODES: Final = frozenset(
    {"chunk-digest-mismatch", "object-digest-mismatch", "closure-digest-mismatch"}
)


class SupportsToWire(Protocol):
    """A contract model (`agent.contracts`): its JSON-ready wire form."""

    def to_wire(self) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """One call, ready to send: secrets stay `Secret` until `request_headers`."""

    spec: RouteSpec
    path: str  # percent-encoded
    query: Mapping[str, str] = field(default_factory=dict)
    # chunk bytes (the caller's buffer, sent without a copy) or JSON text
    body: bytes | bytearray | memoryview | None = field(default=None, repr=False)
    content_type: str | None = None
    chunk_sha256: str | None = None
    grant: Secret | None = None


def request_headers(request: RouteRequest, bearer: Secret | None) -> dict[str, str]:
    """The headers of `request`, secrets revealed. Call inline where the request is sent."""
    headers: dict[str, str] = {}
    if request.spec.authenticated:
        if bearer is None:
            raise LocalProtocolError(f"{request.spec.name} needs the control credential")
        headers[HEADER_AUTHORIZATION] = "Bearer " + bearer.reveal()
    if request.grant is not None:
        headers[HEADER_RESTORE_GRANT] = request.grant.reveal()
    if request.content_type is not None:
        headers["Content-Type"] = request.content_type
    if request.chunk_sha256 is not None:
        headers[HEADER_CHUNK_SHA256] = request.chunk_sha256
    return headers


# --- builders -----------------------------------------------------------------------------------


def _path(template: str, **ids: str) -> str:
    for key, value in ids.items():
        check_id(value, key)
        template = template.replace("{" + key + "}", quote(value, safe=""))
    return template


def _checked_grant(grant: Secret) -> Secret:
    if not is_compact_jws(grant.reveal()):
        raise GrantInvalid("the restore grant is not a compact JWS (three base64url parts)")
    return grant


def _json(model: BaseModel) -> bytes:
    return model.model_dump_json(by_alias=True, exclude_none=True).encode()


def _request(name: RouteName, grant: Secret | None, path: str, **kw: Any) -> RouteRequest:
    spec = ROUTES[name]
    return RouteRequest(spec, path, grant=None if grant is None else _checked_grant(grant), **kw)


def _wire(value: Mapping[str, Any] | SupportsToWire) -> Any:
    return value.to_wire() if hasattr(value, "to_wire") else dict(value)


def build_health() -> RouteRequest:
    """`GET /health`: unauthenticated liveness."""
    return RouteRequest(ROUTES[RouteName.HEALTH], "/health")


def build_prepare_restore(
    restore_id: str,
    *,
    scratch_namespace_id: str,
    staging_archive_id: str,
    resource_mappings: list[Mapping[str, Any] | SupportsToWire],
    archive_manifest: Mapping[str, Any] | SupportsToWire,
    grant: Secret,
) -> RouteRequest:
    """`PUT /v1/isolated-restores/{restoreId}`: create the scratch namespace and staging archive."""
    try:
        body = PrepareRestoreBody(
            scratch_namespace_id=scratch_namespace_id,
            staging_archive_id=staging_archive_id,
            resource_mappings=[MappingBody.model_validate(_wire(m)) for m in resource_mappings],
            archive_manifest=ArchiveManifest.model_validate(_wire(archive_manifest)),
        )
    except ValidationError as exc:
        field, reason = first_problem(exc, root="body")
        raise LocalProtocolError(f"prepare-restore body is invalid: {field}: {reason}") from exc
    return _request(
        RouteName.PREPARE_RESTORE,
        grant,
        _path(_RESTORE, restoreId=restore_id),
        body=_json(body),
        content_type="application/json",
    )


def _object_request(
    name: RouteName, archive_id: str, path: str, grant: Secret, **kw: Any
) -> RouteRequest:
    check_archive_path(path)
    template = ROUTES[name].template
    query = {"path": path, **kw.pop("query", {})}
    return _request(name, grant, _path(template, stagingArchiveId=archive_id), query=query, **kw)


def build_put_chunk(
    staging_archive_id: str,
    path: str,
    offset: int,
    data: bytes | bytearray | memoryview,
    sha256: str,
    grant: Secret,
) -> RouteRequest:
    """`PUT .../objects?path=P&offset=N`: one chunk, its sha256 in `X-Serve-Zone-Chunk-Sha256`."""
    if not 0 < len(data) <= MAX_CHUNK_SIZE:
        raise LocalProtocolError(f"a chunk holds 1 to {MAX_CHUNK_SIZE} bytes, not {len(data)}")
    if offset < 0:
        raise LocalProtocolError(f"a chunk offset is >= 0, not {offset}")
    check_sha256(sha256, "chunk sha256")
    return _object_request(
        RouteName.PUT_CHUNK,
        staging_archive_id,
        path,
        grant,
        query={"offset": str(offset)},
        body=data,
        content_type="application/octet-stream",
        chunk_sha256=sha256,
    )


def build_object_progress(staging_archive_id: str, path: str, grant: Secret) -> RouteRequest:
    """`GET .../objects?path=P`: which bytes of the object Corestore has verified."""
    return _object_request(RouteName.OBJECT_PROGRESS, staging_archive_id, path, grant)


def build_commit_object(
    staging_archive_id: str, path: str, size: int, sha256: str, grant: Secret
) -> RouteRequest:
    """`POST .../objects/commit?path=P` with `{size, sha256}` of the whole object."""
    try:
        body = CommitObjectBody(size=size, sha256=sha256)
    except ValidationError as exc:
        field, reason = first_problem(exc, root="body")
        raise LocalProtocolError(f"commit-object body is invalid: {field}: {reason}") from exc
    return _object_request(
        RouteName.COMMIT_OBJECT,
        staging_archive_id,
        path,
        grant,
        body=_json(body),
        content_type="application/json",
    )


def build_delete_object(staging_archive_id: str, path: str, grant: Secret) -> RouteRequest:
    """`DELETE .../objects?path=P`: remove a partial (or committed) object."""
    return _object_request(RouteName.DELETE_OBJECT, staging_archive_id, path, grant)


def build_delete_staging_archive(staging_archive_id: str, grant: Secret) -> RouteRequest:
    """`DELETE /v1/staging-archives/{stagingArchiveId}`: the whole staging archive."""
    path = _path(_ARCHIVE, stagingArchiveId=staging_archive_id)
    return _request(RouteName.DELETE_STAGING_ARCHIVE, grant, path)


def _resource_request(
    name: RouteName, restore_id: str, mapping_id: str, grant: Secret
) -> RouteRequest:
    path = _path(ROUTES[name].template, restoreId=restore_id, mappingId=mapping_id)
    return _request(name, grant, path)


def build_restore_resource(restore_id: str, mapping_id: str, grant: Secret) -> RouteRequest:
    """`POST .../resources/{mappingId}/restore`: start (or confirm) restoring one mapping."""
    return _resource_request(RouteName.RESTORE_RESOURCE, restore_id, mapping_id, grant)


def build_resource_status(restore_id: str, mapping_id: str, grant: Secret) -> RouteRequest:
    """`GET .../resources/{mappingId}`: where the restore of one mapping stands."""
    return _resource_request(RouteName.RESOURCE_STATUS, restore_id, mapping_id, grant)


def build_verify_resource(restore_id: str, mapping_id: str, grant: Secret) -> RouteRequest:
    """`POST .../resources/{mappingId}/verify`: run the checks on one restored resource."""
    return _resource_request(RouteName.VERIFY_RESOURCE, restore_id, mapping_id, grant)


def build_delete_resource(restore_id: str, mapping_id: str, grant: Secret) -> RouteRequest:
    """`DELETE .../resources/{mappingId}`: remove one restored scratch resource."""
    return _resource_request(RouteName.DELETE_RESOURCE, restore_id, mapping_id, grant)


def build_delete_restore(restore_id: str, grant: Secret) -> RouteRequest:
    """`DELETE /v1/isolated-restores/{restoreId}`: forget the prepared restore (the last step)."""
    path = _path(_RESTORE, restoreId=restore_id)
    return _request(RouteName.DELETE_RESTORE, grant, path)


# --- the relay's service routes -----------------------------------------------------------------


def _body_of(name: RouteName, build: Any) -> bytes:
    try:
        model: BaseModel = build()
    except ValidationError as exc:
        field, reason = first_problem(exc, root="body")
        raise LocalProtocolError(f"{name} body is invalid: {field}: {reason}") from exc
    return _json(model)


def _service_path(template: str, service_id: str, backup_id: str) -> str:
    return _path(template, serviceId=service_id, backupId=backup_id)


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
    body = _body_of(
        name,
        lambda: ServiceBackupBody(
            service=dict(service),
            tags=None if tags is None else dict(tags),
            replication=replication,
        ),
    )
    path = _service_path(_SERVICE_BACKUP, service_id, backup_id)
    return _request(name, None, path, body=body, content_type="application/json")


def build_backup_record(service_id: str, backup_id: str) -> RouteRequest:
    """`GET /v1/services/{serviceId}/backups/{backupId}`: Corestore's record of the backup."""
    path = _service_path(_SERVICE_BACKUP, service_id, backup_id)
    return _request(RouteName.BACKUP_RECORD, None, path)


def build_service_restore(
    service_id: str, restore_key: str, backup_id: str, snapshot_ids: list[str], *, clear: bool
) -> RouteRequest:
    """`PUT /v1/services/{serviceId}/restores/{restoreKey}`: restore exactly these snapshots of
    the backup from the archive, once for the key."""
    name = RouteName.SERVICE_RESTORE
    body = _body_of(
        name,
        lambda: ServiceRestoreBody(backup_id=backup_id, snapshot_ids=snapshot_ids, clear=clear),
    )
    path = _path(_SERVICE_RESTORE, serviceId=service_id, restoreKey=restore_key)
    return _request(name, None, path, body=body, content_type="application/json")


def build_service_restore_status(service_id: str, restore_key: str) -> RouteRequest:
    """`GET /v1/services/{serviceId}/restores/{restoreKey}`: the restore applied under the key
    (404 service-restore-not-found: none was)."""
    path = _path(_SERVICE_RESTORE, serviceId=service_id, restoreKey=restore_key)
    return _request(RouteName.SERVICE_RESTORE_STATUS, None, path)


def build_archive_list() -> RouteRequest:
    """`GET /v1/archive`: the backups the node's archive holds (404 archive-not-found: none)."""
    return _request(RouteName.ARCHIVE_LIST, None, _NODE_ARCHIVE)


def build_archive_prune(retention: ArchiveRetentionPolicy, *, dry_run: bool) -> RouteRequest:
    """`POST /v1/archive/prune` (404 archive-not-found: the node has no archive)."""
    name = RouteName.ARCHIVE_PRUNE
    body = _body_of(name, lambda: ArchivePruneBody(retention=retention, dry_run=dry_run))
    return _request(name, None, ROUTES[name].template, body=body, content_type="application/json")


def build_closure_descriptor(service_id: str, backup_id: str) -> RouteRequest:
    """`GET .../backups/{backupId}/closure`: the database closure's descriptor."""
    path = _service_path(_CLOSURE, service_id, backup_id)
    return _request(RouteName.CLOSURE_DESCRIPTOR, None, path)


def build_closure_read(service_id: str, backup_id: str, offset: int, length: int) -> RouteRequest:
    """`GET .../closure/bytes?offset=N&length=L`: at most `length` bytes from `offset` (fewer
    only at the end of the closure, none at or past it)."""
    if offset < 0 or not 0 < length <= MAX_CHUNK_SIZE:
        raise LocalProtocolError(
            f"a closure read is offset >= 0 and 1 to {MAX_CHUNK_SIZE} bytes, not {offset}+{length}"
        )
    name = RouteName.CLOSURE_READ
    path = _service_path(ROUTES[name].template, service_id, backup_id)
    return _request(name, None, path, query={"offset": str(offset), "length": str(length)})


def build_closure_import(
    import_id: str,
    *,
    service_id: str,
    backup_id: str,
    descriptor: DatabaseClosureDescriptor,
) -> RouteRequest:
    """`PUT /v1/database-closure-imports/{importId}`: open an import for exactly these bytes."""
    name = RouteName.CLOSURE_IMPORT
    body = _body_of(
        name,
        lambda: ClosureImportBody(
            service_id=service_id,
            backup_id=backup_id,
            size=descriptor.size,
            sha256=descriptor.sha256,
            receipt=descriptor.receipt,
        ),
    )
    path = _path(_IMPORT, importId=import_id)
    return _request(name, None, path, body=body, content_type="application/json")


def build_closure_import_chunk(
    import_id: str, offset: int, data: bytes | bytearray | memoryview, sha256: str
) -> RouteRequest:
    """`PUT .../{importId}/chunks?offset=N`: one chunk, its sha256 in the chunk header."""
    if not 0 < len(data) <= MAX_CHUNK_SIZE:
        raise LocalProtocolError(f"a chunk holds 1 to {MAX_CHUNK_SIZE} bytes, not {len(data)}")
    if offset < 0:
        raise LocalProtocolError(f"a chunk offset is >= 0, not {offset}")
    check_sha256(sha256, "chunk sha256")
    name = RouteName.CLOSURE_IMPORT_CHUNK
    return _request(
        name,
        None,
        _path(ROUTES[name].template, importId=import_id),
        query={"offset": str(offset)},
        body=data,
        content_type="application/octet-stream",
        chunk_sha256=sha256,
    )


def build_closure_import_commit(import_id: str, size: int, sha256: str) -> RouteRequest:
    """`POST .../{importId}/commit` with `{size, sha256}`: re-hash, then replace the database."""
    name = RouteName.CLOSURE_IMPORT_COMMIT
    body = _body_of(name, lambda: CommitObjectBody(size=size, sha256=sha256))
    path = _path(ROUTES[name].template, importId=import_id)
    return _request(name, None, path, body=body, content_type="application/json")


def build_closure_import_status(import_id: str) -> RouteRequest:
    """`GET /v1/database-closure-imports/{importId}`: the import as it stands, open or committed
    (404 import-not-found: none)."""
    return _request(RouteName.CLOSURE_IMPORT_STATUS, None, _path(_IMPORT, importId=import_id))


def build_closure_import_abort(import_id: str) -> RouteRequest:
    """`DELETE /v1/database-closure-imports/{importId}`: drop the import; the database stays."""
    return _request(RouteName.CLOSURE_IMPORT_ABORT, None, _path(_IMPORT, importId=import_id))


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
    return _request(name, None, _RESTORES, query=_page_query(after, limit))


def build_closure_import_list(
    after: str | None = None, limit: int = LIST_PAGE_LIMIT
) -> RouteRequest:
    """`GET /v1/database-closure-imports?after=ID&limit=N`: the closure imports the node holds,
    by importId after `after`."""
    name = RouteName.CLOSURE_IMPORT_LIST
    return _request(name, None, _IMPORTS, query=_page_query(after, limit))


# --- answers ------------------------------------------------------------------------------------

_M = TypeVar("_M", bound=BaseModel)


def parse_answer(model: type[_M], body: bytes) -> _M:
    """A 2xx body as its model; raises `ValueError` (pydantic's) when it has another shape."""
    return model.model_validate_json(body)


def parse_error(body: bytes) -> tuple[str, str] | None:
    """`(code, message)` of a `{error: {code, message}}` body, or None for any other body."""
    try:
        answer = ErrorAnswer.model_validate_json(body)
    except ValueError:
        return None
    return answer.error.code, answer.error.message


def classify_answer(spec: RouteSpec, status: int, error_code: str | None) -> AnswerKind:
    """What `status` (with Corestore's error code, if any) means for a call of `spec`."""
    if status in spec.success:
        return AnswerKind.OK
    if status == _INSUFFICIENT_STORAGE or (status >= 500 and error_code == STORAGE_FULL_CODE):
        return AnswerKind.STORAGE_FULL
    if status >= 500 or status in (408, 429):
        return AnswerKind.UNAVAILABLE
    # Only Corestore's own "not found" codes count as cleaned: a bare 404 may be a wrong base
    # URL or an old Corestore without the route, and must not pass for a successful cleanup.
    if status == 404 and error_code in spec.gone_codes:
        return AnswerKind.GONE
    if status == 422 and error_code in _INTEGRITY_CODES:
        return AnswerKind.INTEGRITY
    return AnswerKind.REFUSED


def is_credential_refusal(spec: RouteSpec, status: int, error_code: str | None) -> bool:
    """Whether Corestore refused the bearer control credential (not the grant, not the call).

    401 always names the bearer. 403 is the grant's (`grant-missing`, `grant-malformed`,
    `grant-refused`); a 403 with any other code (or none) is read as the bearer not being
    allowed, which a fresh credential may fix. A route that sends no bearer is never refused for
    one.
    """
    if not spec.authenticated:
        return False
    if status == 401:
        return True
    return status == 403 and not (error_code or "").startswith("grant-")
