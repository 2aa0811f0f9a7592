"""Relay methods of seed 001: service backup/restore/prune on a node, and database closures.

Cloudly calls `backupClusterService`, `restoreClusterService` and `pruneClusterNodeArchive` on
the agent (`nodeId` is `IClusterNode.id`); the agent calls `backupServiceDatabaseClosure` (it
sends the closure bytes on `closure`) and `restoreServiceDatabaseClosure` (Cloudly answers with the
descriptor and a stream the agent reads) on Cloudly. Request and response bodies are exact.

Assumptions where the seeds name a shape without defining it:

- `IService` is a tolerant document: the agent reads `id` and keeps `data` and every other field
  verbatim.
- `backupId` and service ids (`IService.id`, `serviceId`) name archives and closures on the
  node (Corestore paths, directories): they follow the one `PathSegmentId` rule of `base.py`.
  `nodeId` stays a plain non-empty id: it is matched against Cloudly's cluster document.
- `ICorestoreDatabaseClosureDescriptor` (decisions.md): `size` (safe integer >= 0), `sha256`
  (64 lower-case hex) and `receipt` (Corestore's opaque receipt, any JSON value but `null`) are
  required; everything else Corestore gives is kept verbatim.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, JsonValue

from agent.contracts.backup import (
    ArchivePruneResult,
    ArchiveRetentionPolicy,
    BackupReplicationResult,
    BackupResourceType,
    BackupSnapshot,
    Identifier,
    PassThroughDocument,
    Sha256Hex,
)
from agent.contracts.base import NonNegativeSafeInt, PathSegmentId, StreamMarker, WireModel

__all__ = [
    "METHOD_BACKUP_CLUSTER_SERVICE",
    "METHOD_BACKUP_SERVICE_DATABASE_CLOSURE",
    "METHOD_PRUNE_CLUSTER_NODE_ARCHIVE",
    "METHOD_RESTORE_CLUSTER_SERVICE",
    "METHOD_RESTORE_SERVICE_DATABASE_CLOSURE",
    "REQUEST_MODELS",
    "BackupClusterServiceRequest",
    "BackupClusterServiceResponse",
    "BackupServiceDatabaseClosureRequest",
    "BackupServiceDatabaseClosureResponse",
    "DatabaseClosureDescriptor",
    "PruneClusterNodeArchiveRequest",
    "PruneClusterNodeArchiveResponse",
    "ReplicationOption",
    "RestoreClusterServiceRequest",
    "RestoreClusterServiceResponse",
    "RestoreServiceDatabaseClosureRequest",
    "RestoreServiceDatabaseClosureResponse",
    "Service",
]

# Cloudly -> agent
METHOD_BACKUP_CLUSTER_SERVICE = "backupClusterService"
METHOD_RESTORE_CLUSTER_SERVICE = "restoreClusterService"
METHOD_PRUNE_CLUSTER_NODE_ARCHIVE = "pruneClusterNodeArchive"
# agent -> Cloudly
METHOD_BACKUP_SERVICE_DATABASE_CLOSURE = "backupServiceDatabaseClosure"
METHOD_RESTORE_SERVICE_DATABASE_CLOSURE = "restoreServiceDatabaseClosure"


class Service(PassThroughDocument):
    """`IService`: `id` is read, `data` and everything else passed on verbatim."""

    id: PathSegmentId
    data: dict[str, Any]


class ReplicationOption(WireModel):
    """`replication: {enabled}` of the backup/restore requests."""

    enabled: bool


def _not_null(value: JsonValue) -> JsonValue:
    if value is None:
        raise ValueError("receipt must not be null")
    return value


class DatabaseClosureDescriptor(PassThroughDocument):
    """`ICorestoreDatabaseClosureDescriptor`: exact bytes and Corestore's receipt for them."""

    size: NonNegativeSafeInt
    sha256: Sha256Hex
    receipt: Annotated[JsonValue, AfterValidator(_not_null)]


# --- Cloudly -> agent ---------------------------------------------------------------------------


class BackupClusterServiceRequest(WireModel):
    """`backupClusterService` request."""

    node_id: Identifier
    backup_id: PathSegmentId
    service: Service
    tags: dict[str, str] | None = None
    replication: ReplicationOption | None = None


class BackupClusterServiceResponse(WireModel):
    """`backupClusterService` response."""

    snapshots: list[BackupSnapshot]
    replication: BackupReplicationResult | None = None


class RestoreClusterServiceRequest(WireModel):
    """`restoreClusterService` request."""

    node_id: Identifier
    backup_id: PathSegmentId
    service: Service
    snapshots: list[BackupSnapshot]
    clear: bool | None = None
    resource_types: list[BackupResourceType] | None = None
    replication: ReplicationOption | None = None


class RestoreClusterServiceResponse(WireModel):
    """`restoreClusterService` response."""

    restored: list[BackupSnapshot]


class PruneClusterNodeArchiveRequest(WireModel):
    """`pruneClusterNodeArchive` request."""

    node_id: Identifier
    retention: ArchiveRetentionPolicy
    dry_run: bool | None = None


class PruneClusterNodeArchiveResponse(WireModel):
    """`pruneClusterNodeArchive` response; `found` false means the node has no archive."""

    found: bool
    result: ArchivePruneResult | None = None


# --- agent -> Cloudly ---------------------------------------------------------------------------


class BackupServiceDatabaseClosureRequest(WireModel):
    """`backupServiceDatabaseClosure` request: the agent sends the closure bytes on `closure`."""

    backup_id: PathSegmentId
    service_id: PathSegmentId
    node_id: Identifier
    descriptor: DatabaseClosureDescriptor
    closure: StreamMarker


class BackupServiceDatabaseClosureResponse(WireModel):
    """`{accepted}`: permission to send, not confirmation of storage."""

    accepted: bool


class RestoreServiceDatabaseClosureRequest(WireModel):
    """`restoreServiceDatabaseClosure` request."""

    backup_id: PathSegmentId
    service_id: PathSegmentId
    node_id: Identifier


class RestoreServiceDatabaseClosureResponse(WireModel):
    """`restoreServiceDatabaseClosure` response: the descriptor first, the bytes on `closure`."""

    descriptor: DatabaseClosureDescriptor
    closure: StreamMarker


# The requests the agent serves (the closure methods are calls the agent makes).
REQUEST_MODELS: dict[str, type[WireModel]] = {
    METHOD_BACKUP_CLUSTER_SERVICE: BackupClusterServiceRequest,
    METHOD_RESTORE_CLUSTER_SERVICE: RestoreClusterServiceRequest,
    METHOD_PRUNE_CLUSTER_NODE_ARCHIVE: PruneClusterNodeArchiveRequest,
}
