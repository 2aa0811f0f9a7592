"""Body shapes of the Corestore control API: what the agent sends and what Corestore answers.

Pure pydantic, camelCase on the wire (the `WireModel` conventions). Request bodies are exact
(`extra="forbid"`, except where they pass a contract document through); answers ignore fields a
newer Corestore adds, so the agent keeps working against it. `routes.py` says which route carries
which shape; docs/corestore-api.md shows them as JSON.
"""

from __future__ import annotations

import enum
from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from agent.contracts.backup import ArchivePath, Sha256Hex
from agent.contracts.base import NonNegativeSafeInt, PathSegmentId, WireModel

__all__ = [
    "ArchiveManifest",
    "ArchiveObject",
    "CheckAnswer",
    "ChunkAccepted",
    "CommitObjectBody",
    "DeleteOutcome",
    "Deleted",
    "ErrorAnswer",
    "ErrorDetail",
    "Health",
    "ListedResource",
    "ListedRestore",
    "MappingBody",
    "MappingSource",
    "ObjectCommitted",
    "ObjectProgress",
    "ObjectState",
    "PrepareRestoreBody",
    "PreparedRestore",
    "ResourceState",
    "ResourceStatus",
    "ResourceType",
    "RestoreListing",
    "VerificationAnswer",
    "VerifiedChunk",
]


ResourceType = Literal["database", "objectstorage", "volume"]
ObjectState = Literal["absent", "partial", "committed"]
ResourceState = Literal["absent", "running", "succeeded", "failed"]


class _Answer(WireModel):
    model_config = ConfigDict(extra="ignore")


# --- request bodies -----------------------------------------------------------------------------


class MappingSource(WireModel):
    """`source` of a resource mapping: `snapshotId` is read, the rest passes through."""

    model_config = ConfigDict(extra="allow")

    snapshot_id: PathSegmentId


class MappingBody(WireModel):
    """`TIsolatedRestoreResourceMapping`, as Cloudly generated it; `target` passes through."""

    id: PathSegmentId
    type: ResourceType
    source: MappingSource
    target: dict[str, Any]


class ArchiveObject(WireModel):
    """`IBackupArchiveObject`: one manifest entry."""

    path: ArchivePath
    size: NonNegativeSafeInt
    sha256: Sha256Hex


class ArchiveManifest(WireModel):
    """`IBackupArchiveManifest`: extra top-level fields pass through (the grant binds them)."""

    model_config = ConfigDict(extra="allow")

    objects: list[ArchiveObject]

    @model_validator(mode="after")
    def _unique_paths(self) -> ArchiveManifest:
        paths = [entry.path for entry in self.objects]
        if len(set(paths)) != len(paths):
            raise ValueError("manifest object paths must be unique")
        return self


class PrepareRestoreBody(WireModel):
    """Body of `PUT /v1/isolated-restores/{restoreId}`."""

    scratch_namespace_id: PathSegmentId
    staging_archive_id: PathSegmentId
    resource_mappings: list[MappingBody] = Field(min_length=1)
    archive_manifest: ArchiveManifest

    @model_validator(mode="after")
    def _unique_mapping_ids(self) -> PrepareRestoreBody:
        ids = [mapping.id for mapping in self.resource_mappings]
        if len(set(ids)) != len(ids):
            raise ValueError("resource mapping ids must be unique")
        return self


class CommitObjectBody(WireModel):
    """Body of `POST .../objects/commit`: the whole object's exact size and digest."""

    size: NonNegativeSafeInt
    sha256: Sha256Hex


# --- answers ------------------------------------------------------------------------------------


class ErrorDetail(_Answer):
    """`error` of an error answer: a stable kebab-case `code` and a human `message`."""

    code: str
    message: str = ""


class ErrorAnswer(_Answer):
    """`{error: {code, message}}`: every non-2xx answer of a control route."""

    error: ErrorDetail


class Health(_Answer):
    """`GET /health`."""

    status: str


class PreparedRestore(_Answer):
    """The prepared restore; `created` is false when an identical prepare was replayed."""

    restore_id: str
    scratch_namespace_id: str
    staging_archive_id: str
    created: bool


class VerifiedChunk(_Answer):
    """One chunk Corestore verified and counted (an entry of `ObjectProgress.chunks`)."""

    offset: int
    length: int
    sha256: str


class ChunkAccepted(_Answer):
    """A chunk PUT was verified and counted (or was an exact replay of a counted chunk)."""

    path: str
    offset: int
    length: int
    sha256: str
    verified_bytes: int


class ObjectProgress(_Answer):
    """What Corestore holds of one staging object; a stage resumes at `verified_bytes`."""

    path: str
    state: ObjectState
    size: int  # the manifest size
    verified_bytes: int  # contiguous bytes from offset 0 whose chunks were verified
    chunks: tuple[VerifiedChunk, ...] = ()
    sha256: str | None = None  # present once committed


class ObjectCommitted(_Answer):
    """The object was re-hashed by Corestore and counts as written."""

    path: str
    size: int
    sha256: str


class Deleted(_Answer):
    """A delete removed something."""

    deleted: bool


class DeleteOutcome(enum.Enum):
    """What a cleanup call found; both outcomes mean the thing is gone."""

    DELETED = "deleted"
    ALREADY_ABSENT = "already-absent"

    @property
    def cleaned(self) -> bool:
        """Always true: a delete that finds nothing has nothing left to clean."""
        return True


class ResourceStatus(_Answer):
    """Where the restore of one resource mapping stands."""

    restore_id: str
    mapping_id: str
    resource_type: ResourceType
    state: ResourceState
    error: ErrorDetail | None = None  # present when `failed`


class CheckAnswer(_Answer):
    """One check in Corestore's verification answer (becomes an
    `IIsolatedRestoreVerificationCheck` of the node state, whose code is never empty)."""

    code: str = Field(min_length=1)
    status: Literal["passed", "failed"]
    message: str | None = None


class VerificationAnswer(_Answer):
    """Corestore's checks of one restored resource; `status` is `passed` only if every check
    passed. The engine turns it into the node state's `IIsolatedRestoreResourceVerification`."""

    mapping_id: str
    resource_type: ResourceType
    status: Literal["passed", "failed"]
    checks: tuple[CheckAnswer, ...]


class ListedResource(_Answer):
    """A scratch resource a prepared restore has on the node (restored, failed or running)."""

    mapping_id: PathSegmentId
    state: ResourceState


class ListedRestore(_Answer):
    """One prepared isolated restore the node holds, with everything of it on its disk: what
    reconciliation needs to take it into cleanup (the mappings as they were prepared)."""

    restore_id: PathSegmentId
    scratch_namespace_id: PathSegmentId
    staging_archive_id: PathSegmentId
    resource_mappings: tuple[MappingBody, ...]
    resources: tuple[ListedResource, ...] = ()
    staging_archive: bool  # the staging archive (staged bytes) exists


class RestoreListing(_Answer):
    """One page of `GET /v1/isolated-restores`, by restoreId; `next` is the cursor of the
    following page (None: this was the last)."""

    restores: tuple[ListedRestore, ...]
    next: str | None = None
