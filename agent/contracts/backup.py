"""Backup shapes: archive manifest and objects, snapshots, failures, retention, partial restore.

Mirrors `@serve.zone/interfaces` `data/backup.ts` as far as the seeds show it, plus the shared
scalar types the other contract modules use (`Identifier`, `Sha256Hex`) and `PassThroughDocument`,
the tolerant base every pass-through document here and in `relay`/`cluster` uses.

Assumptions where the seeds name a shape without defining it (see also
`../shared/research/decisions.md`):

- `IBackupArchiveManifest` / `IBackupArchiveObject`: as decisions.md defines them. `path` is a
  relative POSIX path (no leading `/`, no `.`/`..`/empty segment, no NUL, at most 1024 UTF-8 bytes),
  unique within the manifest; extra top-level manifest fields are kept verbatim, because the
  restore grant binds the manifest and a dropped field would change what Corestore checks.
- `TBackupSnapshot`: only `type` (a `TBackupResourceType`) is modelled; the rest is kept verbatim.
- `IBackupReplicationResult`, `IArchiveRetentionPolicy`, `IArchivePruneResult`: the seeds show only
  `totalSize`/`completedAt`, `keepLast?` and `freedBytes`/`dryRun`; those are typed, anything else
  is kept verbatim.
- Timestamps, sizes and counts are non-negative safe integers (JS `number`, but always integral).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    StringConstraints,
    model_validator,
)

from agent.contracts.base import NonNegativeSafeInt, PassThroughModel, WireModel

__all__ = [
    "BACKUP_RESOURCE_TYPES",
    "MAX_ARCHIVE_PATH_BYTES",
    "ArchivePath",
    "ArchivePruneResult",
    "ArchiveRetentionPolicy",
    "BackupArchiveManifest",
    "BackupArchiveObject",
    "BackupFailure",
    "BackupReplicationResult",
    "BackupResourceType",
    "BackupRestoreEvent",
    "BackupSnapshot",
    "BackupUncapturedResource",
    "Identifier",
    "IncompleteBackupFailure",
    "PartialRestoreResourceType",
    "PassThroughDocument",
    "Sha256Hex",
    "UncapturedBinding",
    "UncapturedVolume",
    "UnreadableArchiveFailure",
    "archive_path_problem",
    "read_partial_restore_resource_types",
]

# --- shared scalars -----------------------------------------------------------------------------

# Ids route work to a cluster, node, restore or resource; an empty one names nothing, so it is
# refused even where the seeds only say `string`.
Identifier = Annotated[str, StringConstraints(min_length=1)]

# pydantic's patterns run on the Rust regex engine, where `$` is the end of the text (a trailing
# newline does not match).
Sha256Hex = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]

BackupResourceType = Literal["volume", "database", "objectstorage"]
BACKUP_RESOURCE_TYPES: tuple[BackupResourceType, ...] = get_args(BackupResourceType)

PartialRestoreResourceType = Literal["database", "objectstorage"]

MAX_ARCHIVE_PATH_BYTES = 1024


# Kept as a name for the documents of this package; the null-keeping rule lives in base.py.
PassThroughDocument = PassThroughModel


# --- archive manifest ---------------------------------------------------------------------------


def archive_path_problem(path: str) -> str | None:
    """Why `path` is not an archive object path (decisions.md), or None.

    The one statement of the rule: the manifest model and the Corestore routes both use it.
    """
    if not path:
        return "must not be empty"
    if "\x00" in path:
        return "must not contain NUL"
    try:
        size = len(path.encode("utf-8"))
    except UnicodeEncodeError:
        return "must be valid Unicode text"
    if size > MAX_ARCHIVE_PATH_BYTES:
        return f"must be at most {MAX_ARCHIVE_PATH_BYTES} bytes"
    if path.startswith("/"):
        return "must be relative"
    if any(segment in ("", ".", "..") for segment in path.split("/")):
        return "must not have an empty, '.' or '..' segment"
    return None


def _check_archive_path(path: str) -> str:
    problem = archive_path_problem(path)
    if problem is not None:
        raise ValueError(f"archive path {problem}")
    return path


ArchivePath = Annotated[str, AfterValidator(_check_archive_path)]


class BackupArchiveObject(WireModel):
    """`IBackupArchiveObject`: one archive object, `{path, size, sha256}`."""

    path: ArchivePath
    size: NonNegativeSafeInt
    sha256: Sha256Hex


class BackupArchiveManifest(PassThroughDocument):
    """`IBackupArchiveManifest`: `{objects}` with unique paths; other top-level fields kept."""

    objects: list[BackupArchiveObject]

    @model_validator(mode="after")
    def _paths_are_unique(self) -> BackupArchiveManifest:
        seen: set[str] = set()
        for entry in self.objects:
            if entry.path in seen:
                raise ValueError(f"archive manifest lists path {entry.path!r} more than once")
            seen.add(entry.path)
        return self

    def contains(self, entry: BackupArchiveObject) -> bool:
        """Whether `entry` equals one manifest entry exactly (path, size and sha256)."""
        return entry in self.objects


# --- snapshots, replication, retention ----------------------------------------------------------


class BackupSnapshot(PassThroughDocument):
    """`TBackupSnapshot`: its `type` is typed, everything else is Corestore's and kept verbatim."""

    type: BackupResourceType


class BackupReplicationResult(PassThroughDocument):
    """`IBackupReplicationResult` (the seeds show `totalSize` and `completedAt`)."""

    total_size: NonNegativeSafeInt
    completed_at: NonNegativeSafeInt


class ArchiveRetentionPolicy(PassThroughDocument):
    """`IArchiveRetentionPolicy` (the seeds show `keepLast?`)."""

    keep_last: NonNegativeSafeInt | None = None


class ArchivePruneResult(PassThroughDocument):
    """`IArchivePruneResult` (the seeds show `freedBytes` and `dryRun`)."""

    freed_bytes: NonNegativeSafeInt
    dry_run: bool


# --- failures and restore events (seed 002) -----------------------------------------------------


class UncapturedVolume(WireModel):
    """A service volume the backup did not capture."""

    type: Literal["volume"]
    mount_path: str
    reason: Literal["volume-capture-unavailable"]


class UncapturedBinding(WireModel):
    """A database or object-storage binding whose resource the backup holds no snapshot of."""

    type: Literal["database", "objectstorage"]
    binding_id: str
    reason: Literal["binding-not-snapshotted"]


BackupUncapturedResource = Annotated[
    UncapturedVolume | UncapturedBinding, Field(discriminator="type")
]


class IncompleteBackupFailure(WireModel):
    """The backup missed the resources in `uncaptured`."""

    kind: Literal["incomplete"]
    uncaptured: list[BackupUncapturedResource]


class UnreadableArchiveFailure(WireModel):
    """The backup's stored archive is missing or damaged."""

    kind: Literal["archive-unreadable"]


BackupFailure = Annotated[
    IncompleteBackupFailure | UnreadableArchiveFailure, Field(discriminator="kind")
]


class BackupRestoreEvent(WireModel):
    """`IBackupRestoreEvent`."""

    restored_at: NonNegativeSafeInt
    status: Literal["restored", "failed"]
    error_text: str | None = None
    resource_types: list[BackupResourceType] | None = None
    partial: Literal[True] | None = None


# --- the partial-restore rule (seed 002 `readPartialRestoreResourceTypes`) ------------------------


class _SnapshotType(WireModel):
    # The rule only compares `type`, so any string is read; other fields are not the rule's concern.
    model_config = ConfigDict(extra="ignore")

    type: str


class _PartialRestoreSubject(WireModel):
    """`Pick<IBackupRecord, 'status' | 'failure'> & {snapshots}`; other record fields ignored."""

    model_config = ConfigDict(extra="ignore")

    status: str
    failure: BackupFailure | None = None
    snapshots: list[_SnapshotType]


def read_partial_restore_resource_types(
    backup: Mapping[str, Any],
) -> list[PartialRestoreResourceType]:
    """The resource types a confirmed partial restore of `backup` may name.

    For a `failed` backup whose failure is `incomplete`: each of `database`, `objectstorage` (in
    that order) that the backup holds a snapshot of and that no uncaptured resource has as its
    type. Never `volume`. For every other backup: none.

    Args:
        backup: the backup record as it arrives on the wire (`status`, `failure?`, `snapshots`).

    Raises:
        pydantic.ValidationError: `backup` is outside the seed's types (the TypeScript function
            would read garbage or throw).
    """
    # Wire keys only: `by_name=False` refuses snake_case spellings of camelCase fields.
    subject = _PartialRestoreSubject.model_validate(dict(backup), by_name=False)
    failure = subject.failure
    if subject.status != "failed" or not isinstance(failure, IncompleteBackupFailure):
        return []
    uncaptured_types = {resource.type for resource in failure.uncaptured}
    snapshot_types = {snapshot.type for snapshot in subject.snapshots}
    candidates: tuple[PartialRestoreResourceType, ...] = ("database", "objectstorage")
    return [t for t in candidates if t not in uncaptured_types and t in snapshot_types]
