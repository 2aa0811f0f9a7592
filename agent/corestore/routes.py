"""THE one place that knows Corestore's control routes (see docs/corestore-api.md).

Two families: the isolated-restore routes (restore grant + bearer) and the service routes of
the relay duties (bearer only): service backup and restore, the node archive (listing, prune),
database closure export (descriptor, then ranged reads) and import (open, chunks, commit,
abort).

Pure: no I/O, no asyncio. Here: the table of routes (`ROUTES`), the headers, `RouteRequest`;
`parse_answer` turns a 2xx body into a small frozen model; `classify_answer` decides what any
status means. The `build_*` functions of `builders.py` (the isolated restore) and
`service_builders.py` (the relay's service routes, the listings) turn typed arguments into a
`RouteRequest` (method, encoded path, query, body, the grant to carry) from this table. The
client (`client.py`) sends what they build, and the reference server (`devstack/corestore/`)
registers `ROUTES` and parses bodies with the same models, so the two cannot drift.

Request bodies are exact (`extra="forbid"`); answers tolerate fields a newer Corestore adds.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, TypeVar

from pydantic import BaseModel

from agent.contracts.relay import DatabaseClosureDescriptor
from agent.corestore.models import (
    ChunkAccepted,
    Deleted,
    ErrorAnswer,
    Health,
    ObjectCommitted,
    ObjectProgress,
    PreparedRestore,
    ResourceStatus,
    RestoreListing,
    VerificationAnswer,
)
from agent.corestore.service_models import (
    ArchiveListing,
    ArchivePruned,
    ClosureChunkAccepted,
    ClosureImportCommitted,
    ClosureImportListing,
    ClosureImportStatus,
    ServiceBackupRecord,
    ServiceRestored,
)
from agent.corestore.shapes import (
    MAX_CHUNK_SIZE,
)
from agent.errors import LocalProtocolError
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
