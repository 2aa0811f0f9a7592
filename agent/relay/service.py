"""`RelayService`: Cloudly's three relay requests, driven to the node's Corestore and to Cloudly.

Every request is routed by node first (`plan.locate_node`: `unknown-node`,
`node-without-corestore`); a refusal changes nothing. Then:

- `backupClusterService`: a durable job (`JobRunner`) keyed by (cluster, node, `backup`,
  backupId, service id): one backupId is one backup, so a repeat gets its recorded answer.
  Its work asks Corestore to back the service up (an idempotent PUT: a resumed job gets the
  same record, never a second backup), then, when the backup holds a database snapshot,
  streams its closure to Cloudly (`closures.send_closure`). It answers
  `{snapshots, replication?}` only once Cloudly holds the closure: a backup whose closure did not
  arrive intact is a failed job, never a reported backup.
- `restoreClusterService`: every request is a restore of its own (a backup may be restored
  many times): while one restore of the service runs on that node the identical request joins
  it and any other is refused `restore-in-progress` (retryable); otherwise, before anything is
  stored, Corestore's record of the backup on that node is read and the plan decided
  (`plan.plan_restore`: which snapshots, in which order, the partial-restore rule); then a
  durable job, the service's next run, restores them in order: the database from Cloudly
  through a closure import (`closures.receive_closure`), object storage and volumes from the
  node's archive. `clear` reaches only the snapshots restored. It answers `{restored}`: exactly
  the snapshots it restored, in order. The job's recorded report, and its log line, say which
  types it restored and whether the restore was partial.
- `pruneClusterNodeArchive`: one idempotent Corestore call, no job; `found: false` when the node
  has no archive. `dryRun` is passed to Corestore, which removes nothing then.

The service has its job runner (`runner`, a `JobRunner`): the jobs belong to it
(`runner.run()` in the composition root's TaskGroup, `runner.close()` in its ordered
shutdown). docs/relay.md has the details and the decisions.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from typing import Any, Final

import structlog

from agent.clock import SYSTEM_CLOCK, Clock
from agent.contracts.base import StreamMarker
from agent.contracts.cluster import ClusterView
from agent.contracts.relay import (
    METHOD_BACKUP_CLUSTER_SERVICE,
    METHOD_RESTORE_CLUSTER_SERVICE,
    BackupClusterServiceRequest,
    BackupClusterServiceResponse,
    PruneClusterNodeArchiveRequest,
    PruneClusterNodeArchiveResponse,
    RestoreClusterServiceRequest,
    RestoreClusterServiceResponse,
)
from agent.corestore.client import CorestoreClient, CorestoreClients
from agent.domain.job_machine import JobKind
from agent.domain.jobs import JobKey
from agent.domain.replay import request_digest
from agent.progress import ProgressPace
from agent.protocol.handlers import ByteSink, ByteSource
from agent.relay.closures import CloudlyCalls, Progress, receive_closure, send_closure
from agent.relay.plan import RestorePlan, locate_node, plan_restore
from agent.relay.runner import JobRunner, Outcome, Work
from agent.relay.settings import RelaySettings
from agent.store import RevisionStore
from agent.transfers import NodeLimits, Transfer, TransferGate

__all__ = ["RelayService", "import_id_for"]

_log = structlog.get_logger("agent.relay")


def import_id_for(key: JobKey) -> str:
    """The Corestore closure-import id of a restore: one per service on its node (one restore
    of a service runs at a time), so every run first drops what an interrupted one left."""
    text = "\n".join(("restore", key.cluster_id, key.node_id, key.service_id))
    return "closure-" + hashlib.sha256(text.encode()).hexdigest()[:40]


class RelayService:
    """Backup, restore and prune on the nodes of this agent's cluster."""

    def __init__(
        self,
        *,
        store: RevisionStore,
        clients: CorestoreClients,
        cluster_view: Callable[[], ClusterView | None],
        cloudly: Callable[[], CloudlyCalls],
        settings: RelaySettings | None = None,
        clock: Clock = SYSTEM_CLOCK,
        transfers: TransferGate | None = None,
    ) -> None:
        """`cloudly()` is the live session (read when a job needs it); `settings`: `chunk_size`
        bounds every closure chunk, `answer_timeout` Cloudly's answer to each closure call
        (the backup's once its stream is over: the stream itself is bounded by its progress),
        `progress_interval` the pace of the progress log. `transfers`: the per-node transfer
        slots and byte rate a closure waits for before it asks Cloudly (shared with the engine;
        by default the relay's own, with the default limits)."""
        self.runner: Final = JobRunner(store, clock=clock)
        """The relay's jobs: run them (`runner.run()`) in the caller's TaskGroup, stop them with
        `runner.close()`; requests are refused `shutting-down` outside that."""
        self._clients = clients
        self._cluster_view = cluster_view
        self._cloudly = cloudly
        self._settings = settings or RelaySettings()
        self._clock = clock
        self._transfers = transfers or TransferGate(NodeLimits(), clock=clock)

    # --- the three requests -------------------------------------------------------------------

    async def backup(self, request: BackupClusterServiceRequest) -> BackupClusterServiceResponse:
        """`backupClusterService`: the backup, once Cloudly holds its database closure."""
        key, client = self._route(request.node_id, "backup", request.backup_id, request.service.id)
        digest = request_digest(METHOD_BACKUP_CLUSTER_SERVICE, request.to_wire())

        async def start() -> Work:
            return lambda job: self._run_backup(job, client, request)

        response = await self.runner.submit(key, digest, start)
        return BackupClusterServiceResponse.from_wire(response)

    async def restore(self, request: RestoreClusterServiceRequest) -> RestoreClusterServiceResponse:
        """`restoreClusterService`: exactly the planned snapshots, in order."""
        key, client = self._route(request.node_id, "restore", request.backup_id, request.service.id)
        digest = request_digest(METHOD_RESTORE_CLUSTER_SERVICE, request.to_wire())

        async def start() -> Work:
            record = await client.backup_record(key.service_id, key.backup_id)
            plan = plan_restore(request, record)
            return lambda job: self._run_restore(job, client, plan)

        response = await self.runner.submit(key, digest, start)
        return RestoreClusterServiceResponse.from_wire(response)

    async def prune(
        self, request: PruneClusterNodeArchiveRequest
    ) -> PruneClusterNodeArchiveResponse:
        """`pruneClusterNodeArchive`: `found: false` when the node has no archive."""
        _, endpoint = locate_node(self._cluster_view(), request.node_id)
        client = self._clients.client_for(request.node_id, endpoint)
        dry_run = bool(request.dry_run)
        pruned = await client.archive_prune(request.retention, dry_run=dry_run)
        if pruned is None:
            _log.info("relay_prune_no_archive", node=request.node_id)
            return PruneClusterNodeArchiveResponse(found=False)
        _log.info(
            "relay_pruned",
            node=request.node_id,
            dry_run=dry_run,
            freed_bytes=pruned.result.freed_bytes,
        )
        return PruneClusterNodeArchiveResponse(found=True, result=pruned.result)

    # --- the work -----------------------------------------------------------------------------

    async def _run_backup(
        self, key: JobKey, client: CorestoreClient, request: BackupClusterServiceRequest
    ) -> Outcome:
        record = await client.service_backup(
            key.service_id,
            key.backup_id,
            service=request.service.to_wire(),
            tags=request.tags,
            replication=request.replication,
        )
        report: dict[str, Any] = {
            "snapshots": len(record.snapshots),
            "uncaptured": [resource.to_wire() for resource in record.uncaptured],
        }
        if any(snapshot.type == "database" for snapshot in record.snapshots):
            async with self._transfers.slot(
                key.node_id, "closure-export", _subject(key)
            ) as transfer:
                descriptor = await send_closure(
                    client=client,
                    cloudly=_PacedCalls(self._cloudly(), transfer),
                    service_id=key.service_id,
                    backup_id=key.backup_id,
                    node_id=key.node_id,
                    chunk_size=self._settings.chunk_size,
                    answer_timeout=self._settings.answer_timeout,
                    clock=self._clock,
                    progress=self._progress(key, "closure_sent"),
                )
            report["closure"] = {"size": descriptor.size, "sha256": descriptor.sha256}
        response = BackupClusterServiceResponse.from_wire(
            {
                "snapshots": [snapshot.to_wire() for snapshot in record.snapshots],
                **(
                    {}
                    if record.replication is None
                    else {"replication": record.replication.to_wire()}
                ),
            }
        )
        return response.to_wire(), report

    async def _run_restore(
        self, key: JobKey, client: CorestoreClient, plan: RestorePlan
    ) -> Outcome:
        restored: list[dict[str, Any]] = []
        report = plan.report()
        _log.info("relay_restore_planned", **_key_fields(key), **report)
        archive_ids: list[str] = []
        for snapshot in plan.snapshots:
            if snapshot.type == "database":
                async with self._transfers.slot(
                    key.node_id, "closure-import", _subject(key)
                ) as transfer:
                    descriptor = await receive_closure(
                        client=client,
                        cloudly=_PacedCalls(self._cloudly(), transfer),
                        service_id=key.service_id,
                        backup_id=key.backup_id,
                        node_id=key.node_id,
                        import_id=import_id_for(key),
                        chunk_size=self._settings.chunk_size,
                        answer_timeout=self._settings.answer_timeout,
                        progress=self._progress(key, "closure_received"),
                    )
                report["closure"] = {"size": descriptor.size, "sha256": descriptor.sha256}
            else:
                archive_ids.append(snapshot.snapshot_id)
            restored.append(snapshot.to_wire())
        if archive_ids:
            await client.service_restore(
                key.service_id, key.backup_id, archive_ids, clear=plan.clear
            )
        response = RestoreClusterServiceResponse.from_wire({"restored": restored})
        return response.to_wire(), report

    # --- helpers ------------------------------------------------------------------------------

    def _route(
        self, node_id: str, kind: JobKind, backup_id: str, service_id: str
    ) -> tuple[JobKey, CorestoreClient]:
        cluster_id, endpoint = locate_node(self._cluster_view(), node_id)
        client = self._clients.client_for(node_id, endpoint)
        return JobKey(cluster_id, node_id, kind, backup_id, service_id), client

    def _progress(self, key: JobKey, event: str) -> Progress:
        """A progress callback that logs at most once per `progress_interval` (and at the end)."""
        interval = self._settings.progress_interval
        pace = ProgressPace(interval, last=self._clock.monotonic() - interval)

        def report(done: int, total: int) -> None:
            if pace.due(self._clock.monotonic(), final=done >= total):
                _log.info(event, **_key_fields(key), bytes=done, total=total)

        return report


def _subject(key: JobKey) -> tuple[str, ...]:
    """What a closure transfer names in the transfer view: its job (`agent.overview`)."""
    return (
        "job",
        key.cluster_id,
        key.node_id,
        key.kind,
        key.backup_id,
        key.service_id,
        str(key.run),
    )


class _PacedCalls:
    """The session as the closures see it, with the transfer's byte rate on its streams (the
    call itself goes out only once the transfer holds its slot: nothing waits on the wire)."""

    def __init__(self, cloudly: CloudlyCalls, transfer: Transfer) -> None:
        self._cloudly = cloudly
        self._transfer = transfer

    async def call(
        self,
        method: str,
        request: Mapping[str, Any],
        *,
        timeout: float | None,  # noqa: ASYNC109  # a per-call deadline, passed on
    ) -> dict[str, Any]:
        return await self._cloudly.call(method, request, timeout=timeout)

    def open_send_stream(self) -> tuple[StreamMarker, ByteSink]:
        marker, sink = self._cloudly.open_send_stream()
        return marker, self._transfer.sink(sink)

    def receive_stream(self, marker: StreamMarker) -> ByteSource:
        return self._transfer.source(self._cloudly.receive_stream(marker))


def _key_fields(key: JobKey) -> dict[str, str | int]:
    fields: dict[str, str | int] = {
        "node": key.node_id,
        "backup_id": key.backup_id,
        "service_id": key.service_id,
    }
    if key.kind == "restore":
        fields["run"] = key.run
    return fields
