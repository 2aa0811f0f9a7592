"""Body shapes of Corestore's service routes: backup, restore, archive, database closures.

Pure pydantic, camelCase on the wire (the `WireModel` conventions), as `models.py` is for the
isolated-restore routes. Request bodies are exact; answers ignore fields a newer Corestore adds,
except where a document passes through (`ServiceSnapshot`: Cloudly receives it verbatim and
sends it back in a restore request, so nothing of it may be dropped). docs/corestore-api.md
shows them as JSON.

What the agent uses of an answer, exactly: a snapshot's `type` and `snapshotId` (the id the
restore route takes), `uncaptured` (logged and recorded), an archive prune's `result`, an
import's `state`/`verifiedBytes`, and a closure descriptor's `size`, `sha256` and `receipt`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, JsonValue, model_validator

from agent.contracts.backup import (
    ArchivePruneResult,
    ArchiveRetentionPolicy,
    BackupReplicationResult,
    BackupResourceType,
    BackupUncapturedResource,
    Sha256Hex,
)
from agent.contracts.base import NonNegativeSafeInt, PassThroughModel, PathSegmentId, WireModel
from agent.contracts.relay import ReplicationOption

__all__ = [
    "ArchiveListing",
    "ArchivePruneBody",
    "ArchivePruned",
    "ArchivedBackup",
    "ClosureChunkAccepted",
    "ClosureImportBody",
    "ClosureImportCommitted",
    "ClosureImportListing",
    "ClosureImportStatus",
    "ListedClosureImport",
    "ServiceBackupBody",
    "ServiceBackupRecord",
    "ServiceRestoreBody",
    "ServiceRestored",
    "ServiceSnapshot",
]


class _Answer(WireModel):
    model_config = ConfigDict(extra="ignore")


# --- request bodies -----------------------------------------------------------------------------


class ServiceBackupBody(WireModel):
    """Body of `PUT /v1/services/{serviceId}/backups/{backupId}`: the `IService` document as
    Cloudly sent it (Corestore reads the resources it declares), tags and replication."""

    service: dict[str, Any]
    tags: dict[str, str] | None = None
    replication: ReplicationOption | None = None


class ServiceRestoreBody(WireModel):
    """Body of `PUT /v1/services/{serviceId}/restores/{restoreKey}`: exactly these snapshots
    of the backup, in this order. The key names this restore: Corestore applies it once."""

    backup_id: PathSegmentId
    snapshot_ids: list[PathSegmentId] = Field(min_length=1)
    clear: bool


class ArchivePruneBody(WireModel):
    """Body of `POST /v1/archive/prune`."""

    retention: ArchiveRetentionPolicy
    dry_run: bool


class ClosureImportBody(WireModel):
    """Body of `PUT /v1/database-closure-imports/{importId}`: the descriptor the bytes must
    match, and whose service database they replace once committed."""

    service_id: PathSegmentId
    backup_id: PathSegmentId
    size: NonNegativeSafeInt
    sha256: Sha256Hex
    receipt: JsonValue


# --- answers ------------------------------------------------------------------------------------


class ServiceSnapshot(PassThroughModel):
    """One `TBackupSnapshot` as Corestore made it: `type` and `snapshotId` read, the rest kept
    verbatim (nulls included)."""

    type: BackupResourceType
    snapshot_id: PathSegmentId


class ServiceBackupRecord(_Answer):
    """Corestore's record of one service backup on its node (also the backup's answer).

    `uncaptured` names each resource the service declares that the backup did not capture
    (seed 002's `TBackupUncapturedResource`): a record with any is an `incomplete` backup.
    """

    service_id: str
    backup_id: str
    created_at: NonNegativeSafeInt
    snapshots: list[ServiceSnapshot]
    uncaptured: list[BackupUncapturedResource] = Field(default_factory=list)
    replication: BackupReplicationResult | None = None


class ServiceRestored(_Answer):
    """The snapshots Corestore restored under `restore_key`, in the order restored (the same
    answer again for the same key: it was applied once)."""

    restore_key: str
    backup_id: str
    restored: list[ServiceSnapshot]


class ArchivedBackup(_Answer):
    """One backup in a node's archive."""

    service_id: str
    backup_id: str
    created_at: NonNegativeSafeInt
    size: NonNegativeSafeInt


class ArchiveListing(_Answer):
    """What the node's archive holds, oldest first."""

    backups: list[ArchivedBackup]


class ArchivePruned(_Answer):
    """A prune's outcome (`dryRun` true: what it would free; nothing was removed)."""

    result: ArchivePruneResult


class ClosureImportStatus(_Answer):
    """An open closure import (a resumed one continues at `verified_bytes`), or a committed
    one: its key was applied once, to these bytes (`sha256`), and is never applied again."""

    import_id: str
    state: Literal["open", "committed"]
    size: NonNegativeSafeInt
    verified_bytes: NonNegativeSafeInt
    sha256: Sha256Hex | None = None

    @model_validator(mode="after")
    def _committed_names_its_bytes(self) -> ClosureImportStatus:
        if self.state == "committed" and self.sha256 is None:
            raise ValueError("a committed import names the sha256 it committed")
        return self


class ClosureChunkAccepted(_Answer):
    """A chunk of an import was verified against its sha256 and counted."""

    offset: NonNegativeSafeInt
    length: NonNegativeSafeInt
    sha256: Sha256Hex
    verified_bytes: NonNegativeSafeInt


class ClosureImportCommitted(_Answer):
    """Corestore re-hashed the whole closure and replaced the service's database with it."""

    import_id: str
    size: NonNegativeSafeInt
    sha256: Sha256Hex


class ListedClosureImport(_Answer):
    """One closure import the node holds (bytes of a database that never replaced it yet)."""

    import_id: PathSegmentId
    service_id: str
    backup_id: str
    state: Literal["open", "committed"]
    size: NonNegativeSafeInt
    verified_bytes: NonNegativeSafeInt


class ClosureImportListing(_Answer):
    """One page of `GET /v1/database-closure-imports`, by importId; `next`: the following
    page's cursor (None: the last)."""

    imports: tuple[ListedClosureImport, ...]
    next: str | None = None
