"""`ServiceRoutes`: the relay's service routes and the reconciliation listings of one node's
Corestore (the bearer only, no restore grant), as methods `CorestoreClient` inherits.
"""

from __future__ import annotations

from typing import Any

from agent.contracts.backup import ArchiveRetentionPolicy
from agent.contracts.relay import DatabaseClosureDescriptor, ReplicationOption
from agent.corestore import service_builders
from agent.corestore.edge import CorestoreEdge
from agent.corestore.models import (
    DeleteOutcome,
    RestoreListing,
)
from agent.corestore.routes import AnswerKind
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
from agent.errors import (
    IntegrityError,
)

__all__ = ["ServiceRoutes"]


class ServiceRoutes(CorestoreEdge):
    """Service backup and restore, the node archive, the database closure's export and
    import, and the pages of what the node holds."""

    # --- the relay's service routes (bearer only) -------------------------------------------

    async def service_backup(
        self,
        service_id: str,
        backup_id: str,
        *,
        service: dict[str, Any],
        tags: dict[str, str] | None = None,
        replication: ReplicationOption | None = None,
    ) -> ServiceBackupRecord:
        """Back the service's resources up; the same body again answers the same record."""
        request = service_builders.build_service_backup(
            service_id, backup_id, service=service, tags=tags, replication=replication
        )
        return await self._ok(request, ServiceBackupRecord)

    async def backup_record(self, service_id: str, backup_id: str) -> ServiceBackupRecord:
        """Corestore's record of one backup of the service on this node."""
        return await self._ok(
            service_builders.build_backup_record(service_id, backup_id), ServiceBackupRecord
        )

    async def service_restore(
        self,
        service_id: str,
        restore_key: str,
        backup_id: str,
        snapshot_ids: list[str],
        *,
        clear: bool,
    ) -> ServiceRestored:
        """Restore exactly these snapshots of the backup from the node's archive, once for
        `restore_key`: the same key again answers the restore it made, restoring nothing."""
        request = service_builders.build_service_restore(
            service_id, restore_key, backup_id, snapshot_ids, clear=clear
        )
        return await self._ok(request, ServiceRestored)

    async def service_restore_status(
        self, service_id: str, restore_key: str
    ) -> ServiceRestored | None:
        """The restore applied under `restore_key`, or None when none was."""
        request = service_builders.build_service_restore_status(service_id, restore_key)
        return await self._ok_or_none(request, ServiceRestored)

    async def archive_list(self) -> ArchiveListing | None:
        """What the node's archive holds; None when the node has no archive."""
        return await self._ok_or_none(service_builders.build_archive_list(), ArchiveListing)

    async def archive_prune(
        self, retention: ArchiveRetentionPolicy, *, dry_run: bool
    ) -> ArchivePruned | None:
        """Prune the node's archive (`dry_run`: only say what would go); None: no archive."""
        request = service_builders.build_archive_prune(retention, dry_run=dry_run)
        return await self._ok_or_none(request, ArchivePruned)

    async def closure_descriptor(
        self, service_id: str, backup_id: str
    ) -> DatabaseClosureDescriptor:
        """The descriptor of the backup's database closure: `{size, sha256, receipt, ...}`."""
        request = service_builders.build_closure_descriptor(service_id, backup_id)
        return await self._ok(request, DatabaseClosureDescriptor)

    async def read_closure(
        self, service_id: str, backup_id: str, offset: int, length: int
    ) -> bytes:
        """At most `length` bytes of the closure from `offset` (Corestore's bytes as sent: the
        caller checks how many came and what they hash to)."""
        request = service_builders.build_closure_read(service_id, backup_id, offset, length)
        reply, credential = await self._send(request)
        if self._judge(request, reply, credential) is not AnswerKind.OK:
            raise self._refused(request, reply, credential)
        return reply.body

    async def open_closure_import(
        self,
        import_id: str,
        *,
        service_id: str,
        backup_id: str,
        descriptor: DatabaseClosureDescriptor,
    ) -> ClosureImportStatus:
        """Open an import for exactly the bytes `descriptor` names (Corestore checks the
        receipt); an identical replay answers the import as it stands."""
        request = service_builders.build_closure_import(
            import_id, service_id=service_id, backup_id=backup_id, descriptor=descriptor
        )
        return await self._ok(request, ClosureImportStatus)

    async def put_closure_chunk(
        self, import_id: str, offset: int, data: bytes | bytearray | memoryview, sha256: str
    ) -> ClosureChunkAccepted:
        """Write one verified chunk of an import; `IntegrityError` if Corestore acknowledges
        other bytes than these."""
        request = service_builders.build_closure_import_chunk(import_id, offset, data, sha256)
        answer = await self._ok(request, ClosureChunkAccepted)
        if (answer.offset, answer.length, answer.sha256) != (offset, len(data), sha256):
            raise IntegrityError(
                f"Corestore acknowledged other bytes than the closure chunk at offset {offset}"
            )
        return answer

    async def commit_closure_import(
        self, import_id: str, size: int, sha256: str
    ) -> ClosureImportCommitted:
        """Re-hash the import and replace the service's database with it; `IntegrityError`
        (the import is removed, the database unchanged) on a mismatch."""
        request = service_builders.build_closure_import_commit(import_id, size, sha256)
        answer = await self._ok(request, ClosureImportCommitted)
        if (answer.size, answer.sha256) != (size, sha256):
            raise IntegrityError("Corestore committed other bytes than the closure's")
        return answer

    async def closure_import_status(self, import_id: str) -> ClosureImportStatus | None:
        """The import as it stands (`open`, or `committed`: applied once, never again), or None
        when Corestore holds none under `import_id`."""
        request = service_builders.build_closure_import_status(import_id)
        return await self._ok_or_none(request, ClosureImportStatus)

    async def abort_closure_import(self, import_id: str) -> DeleteOutcome:
        """Drop an import (its bytes never touched the database)."""
        return await self._delete(service_builders.build_closure_import_abort(import_id))

    # --- reconciliation (bearer only): what the node holds, one page at a time ------------------

    async def list_restores(self, after: str | None = None) -> RestoreListing:
        """One page of the prepared restores the node holds, by restoreId after `after`."""
        return await self._ok(service_builders.build_restore_list(after), RestoreListing)

    async def list_closure_imports(self, after: str | None = None) -> ClosureImportListing:
        """One page of the closure imports the node holds, by importId after `after`."""
        return await self._ok(
            service_builders.build_closure_import_list(after), ClosureImportListing
        )
