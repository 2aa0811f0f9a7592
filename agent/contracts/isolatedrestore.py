"""Isolated restore: the node state, resource mappings and the five methods Cloudly calls.

Mirrors `IIsolatedRestoreNodeState` and what it nests (seed 000), the resource mappings with the
database target's optional `databaseAllocation` (seed 001), and the request/response bodies of
`coreflowPrepareIsolatedRestore`, `stageIsolatedRestoreArchive`,
`coreflowGetIsolatedRestoreStatus`, `coreflowExecuteIsolatedRestore` and
`coreflowCleanupIsolatedRestore` (seeds 000 + 001). Every shape here is exact.

Decisions where the seeds are silent:

- `restoreGrant` is a `Secret`; its shape is the engine's to check. `to_wire()` masks it;
  `revealed_wire()` is the one way to put it back on the wire (for whoever sends the request).
- Ids that become path segments elsewhere (`restoreId`, `scratchNamespaceId`,
  `stagingArchiveId`, resource mapping `id`s and their `source.snapshotId`: Corestore URL paths,
  directory names, SQLite keys) follow the one `PathSegmentId` rule of `base.py` on every
  request, so `../../x` is refused as `invalid-request` before anything is stored. Other ids
  (`clusterId`, `targetNodeName`, matched against Cloudly's cluster document; names and mount
  paths, whose seed readers are not shown) must only be non-empty. Mapping ids must be unique
  within a prepare request: verification and cleanup progress are keyed by them. The node state
  the agent answers keeps the plain non-empty rule: it is read back from the agent's own store,
  and a state written before this rule must stay readable (to be cleaned up).
- `readScopedId` (for `databaseAllocation.rehearsalId`) is not shown in seed 001. Our rule is the
  same `PathSegmentId` rule — no whitespace, no control characters, no path separators, no
  non-ASCII. Corestore stays the authority and re-reads it; this only refuses values that cannot
  be a scoped id.
- `generation` is read as seed 001 does (a safe integer >= 1) but strictly: a JSON `1.0` is refused.
- `revision`, `attempts` and timestamps are non-negative safe integers (a missing state has
  revision 0).
- `IsolatedRestoreStatusResponse` holds `state` exactly when `found` is true.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import Field, Strict, TypeAdapter, model_validator

from agent.contracts.backup import (
    BackupArchiveManifest,
    BackupArchiveObject,
    BackupResourceType,
    Identifier,
    Sha256Hex,
)
from agent.contracts.base import (
    MAX_SAFE_INTEGER,
    NonNegativeSafeInt,
    PathSegmentId,
    StreamMarker,
    WireModel,
)
from agent.secret import Secret

__all__ = [
    "CLEANUP_PROGRESS_STATUSES",
    "METHOD_CLEANUP",
    "METHOD_EXECUTE",
    "METHOD_GET_STATUS",
    "METHOD_PREPARE",
    "METHOD_STAGE",
    "NODE_STATUSES",
    "REQUEST_MODELS",
    "RESOURCE_MAPPING_ADAPTER",
    "VERIFICATION_STATUSES",
    "CleanupIsolatedRestoreRequest",
    "CleanupProgress",
    "CleanupProgressStatus",
    "DatabaseAllocationReference",
    "DatabaseMapping",
    "DatabaseMappingSource",
    "DatabaseMappingTarget",
    "ExecuteIsolatedRestoreRequest",
    "GetIsolatedRestoreStatusRequest",
    "IsolatedRestoreNodeState",
    "IsolatedRestoreRequest",
    "IsolatedRestoreStateResponse",
    "IsolatedRestoreStatusResponse",
    "IsolatedRestoreVerification",
    "NodeStatus",
    "ObjectStorageMapping",
    "ObjectStorageMappingSource",
    "ObjectStorageMappingTarget",
    "PrepareIsolatedRestoreRequest",
    "ResourceCleanupProgress",
    "ResourceMapping",
    "ResourceVerification",
    "ScopedId",
    "StageIsolatedRestoreArchiveRequest",
    "StagingCleanupProgress",
    "VerificationCheck",
    "VerificationStatus",
    "VolumeMapping",
    "VolumeMappingSource",
    "VolumeMappingTarget",
]

METHOD_PREPARE = "coreflowPrepareIsolatedRestore"
METHOD_STAGE = "stageIsolatedRestoreArchive"
METHOD_GET_STATUS = "coreflowGetIsolatedRestoreStatus"
METHOD_EXECUTE = "coreflowExecuteIsolatedRestore"
METHOD_CLEANUP = "coreflowCleanupIsolatedRestore"

NodeStatus = Literal[
    "preparing",
    "prepared",
    "staging",
    "restoring",
    "verifying",
    "ready",
    "failed",
    "cleaning",
    "cleaned",
    "cleanup-failed",
]
NODE_STATUSES: tuple[NodeStatus, ...] = get_args(NodeStatus)

VerificationStatus = Literal["pending", "running", "passed", "failed"]
VERIFICATION_STATUSES: tuple[VerificationStatus, ...] = get_args(VerificationStatus)

CleanupProgressStatus = Literal["pending", "running", "succeeded", "failed"]
CLEANUP_PROGRESS_STATUSES: tuple[CleanupProgressStatus, ...] = get_args(CleanupProgressStatus)

ScopedId = PathSegmentId  # one rule for both (see the module docstring)
_Generation = Annotated[int, Strict(), Field(ge=1, le=MAX_SAFE_INTEGER)]


# --- resource mappings --------------------------------------------------------------------------


class VolumeMappingSource(WireModel):
    snapshot_id: PathSegmentId
    volume_name: Identifier
    mount_path: Identifier


class VolumeMappingTarget(WireModel):
    volume_name: Identifier
    mount_path: Identifier


class VolumeMapping(WireModel):
    """`IIsolatedRestoreVolumeMapping`."""

    id: PathSegmentId
    type: Literal["volume"]
    source: VolumeMappingSource
    target: VolumeMappingTarget


class DatabaseAllocationReference(WireModel):
    """`ICorestoreDatabaseAllocationReference`: Corestore's reference to an allocated database."""

    purpose: Literal["scratch-rehearsal"]
    rehearsal_id: ScopedId
    allocation_id: Sha256Hex
    generation: _Generation
    binding_sha256: Sha256Hex
    receipt_sha256: Sha256Hex


class DatabaseMappingSource(WireModel):
    snapshot_id: PathSegmentId
    resource_name: Identifier
    database_name: Identifier


class DatabaseMappingTarget(WireModel):
    """Present `databaseAllocation` means the target is allocation-managed (seed 001)."""

    resource_name: Identifier
    database_name: Identifier
    database_allocation: DatabaseAllocationReference | None = None


class DatabaseMapping(WireModel):
    """`IIsolatedRestoreDatabaseMapping`."""

    id: PathSegmentId
    type: Literal["database"]
    source: DatabaseMappingSource
    target: DatabaseMappingTarget


class ObjectStorageMappingSource(WireModel):
    snapshot_id: PathSegmentId
    resource_name: Identifier
    bucket_name: Identifier


class ObjectStorageMappingTarget(WireModel):
    resource_name: Identifier
    bucket_name: Identifier


class ObjectStorageMapping(WireModel):
    """`IIsolatedRestoreObjectStorageMapping`."""

    id: PathSegmentId
    type: Literal["objectstorage"]
    source: ObjectStorageMappingSource
    target: ObjectStorageMappingTarget


ResourceMapping = Annotated[
    VolumeMapping | DatabaseMapping | ObjectStorageMapping, Field(discriminator="type")
]
RESOURCE_MAPPING_ADAPTER: TypeAdapter[ResourceMapping] = TypeAdapter(ResourceMapping)


# --- verification and cleanup progress ----------------------------------------------------------


class VerificationCheck(WireModel):
    """`IIsolatedRestoreVerificationCheck`."""

    code: Identifier
    status: Literal["passed", "failed"]
    message: str | None = None


class ResourceVerification(WireModel):
    """`IIsolatedRestoreResourceVerification`."""

    resource_mapping_id: Identifier
    resource_type: BackupResourceType
    status: VerificationStatus
    checks: list[VerificationCheck]
    checked_at: NonNegativeSafeInt | None = None


class IsolatedRestoreVerification(WireModel):
    """`IIsolatedRestoreVerification`."""

    status: VerificationStatus
    results: list[ResourceVerification]
    started_at: NonNegativeSafeInt | None = None
    completed_at: NonNegativeSafeInt | None = None


class ResourceCleanupProgress(WireModel):
    """`IIsolatedRestoreResourceCleanupProgress`."""

    resource_mapping_id: Identifier
    resource_type: BackupResourceType
    status: CleanupProgressStatus
    attempts: NonNegativeSafeInt
    updated_at: NonNegativeSafeInt | None = None
    error_code: str | None = None
    error_message: str | None = None


class StagingCleanupProgress(WireModel):
    """`IIsolatedRestoreStagingCleanupProgress`."""

    staging_archive_id: Identifier
    status: CleanupProgressStatus
    attempts: NonNegativeSafeInt
    updated_at: NonNegativeSafeInt | None = None
    error_code: str | None = None
    error_message: str | None = None


class CleanupProgress(WireModel):
    """`IIsolatedRestoreCleanupProgress`."""

    resources: list[ResourceCleanupProgress]
    staging_archive: StagingCleanupProgress


# --- the node state -----------------------------------------------------------------------------


class IsolatedRestoreNodeState(WireModel):
    """`IIsolatedRestoreNodeState`: one cluster/node/restore key; `revision` is the CAS value."""

    restore_id: Identifier
    cluster_id: Identifier
    target_node_name: Identifier
    source_backup_id: Identifier
    source_service_id: Identifier
    scratch_namespace_id: Identifier
    staging_archive_id: Identifier
    revision: NonNegativeSafeInt
    status: NodeStatus
    completed_resource_mapping_ids: list[Identifier]
    verification: IsolatedRestoreVerification
    cleanup: CleanupProgress | None = None
    prepared_at: NonNegativeSafeInt | None = None
    ready_at: NonNegativeSafeInt | None = None
    updated_at: NonNegativeSafeInt
    last_error_code: str | None = None
    last_error_message: str | None = None


# --- requests -----------------------------------------------------------------------------------


class IsolatedRestoreRequest(WireModel):
    """The fields every isolated-restore request starts with, in the seed's order."""

    restore_grant: Secret
    cluster_id: Identifier
    target_node_name: Identifier
    restore_id: PathSegmentId

    def revealed_wire(self) -> dict[str, Any]:
        """The wire body with the grant itself: only for sending it to the party it is for."""
        wire = self.to_wire()
        wire["restoreGrant"] = self.restore_grant.reveal()
        return wire


class PrepareIsolatedRestoreRequest(IsolatedRestoreRequest):
    """`coreflowPrepareIsolatedRestore` request."""

    expected_revision: NonNegativeSafeInt
    source_backup_id: Identifier
    source_service_id: Identifier
    scratch_namespace_id: PathSegmentId
    staging_archive_id: PathSegmentId
    resource_mappings: list[ResourceMapping]
    archive_manifest: BackupArchiveManifest

    @model_validator(mode="after")
    def _mapping_ids_are_unique(self) -> PrepareIsolatedRestoreRequest:
        seen: set[str] = set()
        for mapping in self.resource_mappings:
            if mapping.id in seen:
                raise ValueError(f"resourceMappings lists id {mapping.id!r} more than once")
            seen.add(mapping.id)
        return self


class StageIsolatedRestoreArchiveRequest(IsolatedRestoreRequest):
    """`stageIsolatedRestoreArchive` request: one manifest object's bytes on `archive`."""

    expected_revision: NonNegativeSafeInt
    object: BackupArchiveObject
    archive: StreamMarker


class GetIsolatedRestoreStatusRequest(IsolatedRestoreRequest):
    """`coreflowGetIsolatedRestoreStatus` request."""


class ExecuteIsolatedRestoreRequest(IsolatedRestoreRequest):
    """`coreflowExecuteIsolatedRestore` request."""

    expected_revision: NonNegativeSafeInt


class CleanupIsolatedRestoreRequest(IsolatedRestoreRequest):
    """`coreflowCleanupIsolatedRestore` request."""

    expected_revision: NonNegativeSafeInt


# --- responses ----------------------------------------------------------------------------------


class IsolatedRestoreStateResponse(WireModel):
    """`{state}`: the answer to prepare, stage, execute and cleanup."""

    state: IsolatedRestoreNodeState


class IsolatedRestoreStatusResponse(WireModel):
    """`{found, state?}`: the answer to get-status."""

    found: bool
    state: IsolatedRestoreNodeState | None = None

    @model_validator(mode="after")
    def _state_iff_found(self) -> IsolatedRestoreStatusResponse:
        if self.found != (self.state is not None):
            raise ValueError("state must be present exactly when found is true")
        return self


REQUEST_MODELS: dict[str, type[IsolatedRestoreRequest]] = {
    METHOD_PREPARE: PrepareIsolatedRestoreRequest,
    METHOD_STAGE: StageIsolatedRestoreArchiveRequest,
    METHOD_GET_STATUS: GetIsolatedRestoreStatusRequest,
    METHOD_EXECUTE: ExecuteIsolatedRestoreRequest,
    METHOD_CLEANUP: CleanupIsolatedRestoreRequest,
}
