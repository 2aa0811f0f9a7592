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
- `restoreClusterService`: a backup may be restored many times, so a request is a restore of
  its own unless it repeats the service's last run while that run's answer may not have
  reached Cloudly (then the run's recorded answer: `JobRunner`, the ping rule); while one
  restore of the service runs on that node the identical request joins it and any other is
  refused `restore-in-progress` (retryable). A run that starts reads Corestore's record of the
  backup on that node and decides the plan before anything is stored (`plan.plan_restore`:
  which snapshots, in which order, the partial-restore rule) and fixes its idempotency keys
  (`RunPlan`: random, one per effect, kept with the run); then it restores in order: the
  database from Cloudly through a closure import under its key (`closures.receive_closure`;
  one Corestore already committed under the key is not imported again), object storage and
  volumes from the node's archive under the archive restore's key. `clear` reaches only the
  snapshots restored. It answers `{restored}`: exactly the snapshots it restored, in order. The
  job's recorded report, and its log line, say which types it restored and whether the restore
  was partial. A run a stopped agent left is reconciled by its keys (`reconcile_restore`)
  before anything of the service runs again.
- `pruneClusterNodeArchive`: one idempotent Corestore call, no job; `found: false` when the node
  has no archive. `dryRun` is passed to Corestore, which removes nothing then.

The service has its job runner (`runner`, a `JobRunner`): the jobs belong to it
(`runner.run()` in the composition root's TaskGroup, `runner.close()` in its ordered
shutdown). docs/relay.md has the details and the decisions.
"""

from __future__ import annotations

import secrets
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
from agent.domain.jobs import JobKey, StoredJob
from agent.domain.outcomes import ClosureFacts, JobReport, RestoreEffects, RunPlan, Succeeded
from agent.domain.replay import request_digest
from agent.errors import CorestoreRefused, SessionClosed, StreamBroken
from agent.observe import NULL_OBSERVER, RelayObserver
from agent.protocol.handlers import ByteSink, ByteSource
from agent.relay.closures import (
    CloudlyCalls,
    Progress,
    committed_import,
    receive_closure,
    send_closure,
)
from agent.relay.plan import RestorePlan, locate_node, plan_restore
from agent.relay.runner import JobRunner, Requester, Started
from agent.relay.settings import RelaySettings
from agent.store import RevisionStore
from agent.transfers import NodeLimits, Transfer, TransferGate
from agent.transfers.progress import ProgressPace

__all__ = ["RelayService", "reconcile_restore"]

_log = structlog.get_logger("agent.relay")


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
        new_key: Callable[[str], str] | None = None,
        observer: RelayObserver = NULL_OBSERVER,
    ) -> None:
        """`cloudly()` is the connection of the moment (read when a closure starts; its call and
        its stream go on it; `SessionClosed` when there is none); `settings`: `chunk_size`
        bounds every closure chunk, `answer_timeout` Cloudly's answer to each closure call
        (the backup's once its stream is over: the stream itself is bounded by its progress),
        `progress_interval` the pace of the progress log. `transfers`: the per-node transfer
        slots and byte rate a closure waits for before it asks Cloudly (shared with the engine;
        by default the relay's own, with the default limits)."""
        self.runner: Final = JobRunner(store, clock=clock, observer=observer)
        """The relay's jobs: run them (`runner.run()`) in the caller's TaskGroup, stop them with
        `runner.close()`; requests are refused `shutting-down` outside that."""
        self._clients = clients
        self._cluster_view = cluster_view
        self._cloudly = cloudly
        self._settings = settings or RelaySettings()
        self._clock = clock
        self._transfers = transfers or TransferGate(NodeLimits(), clock=clock)
        self._new_key = new_key or _random_key

    # --- the three requests -------------------------------------------------------------------

    async def backup(
        self, request: BackupClusterServiceRequest, *, requester: Requester
    ) -> BackupClusterServiceResponse:
        """`backupClusterService`: the backup, once Cloudly holds its database closure."""
        key, client = self._route(request.node_id, "backup", request.backup_id, request.service.id)
        digest = request_digest(METHOD_BACKUP_CLUSTER_SERVICE, request.to_wire())

        async def start(resumed: RunPlan | None) -> Started:
            async def work(job: JobKey, plan: RunPlan | None) -> Succeeded:
                return await self._run_backup(job, client, request)

            return Started(work)

        response = await self.runner.submit(key, digest, start, requester=requester)
        return BackupClusterServiceResponse.from_wire(response)

    async def restore(
        self, request: RestoreClusterServiceRequest, *, requester: Requester
    ) -> RestoreClusterServiceResponse:
        """`restoreClusterService`: exactly the planned snapshots, in order, each effect on the
        node under the run's idempotency key (module docstring)."""
        key, client = self._route(request.node_id, "restore", request.backup_id, request.service.id)
        digest = request_digest(METHOD_RESTORE_CLUSTER_SERVICE, request.to_wire())

        async def start(resumed: RunPlan | None) -> Started:
            record = await client.backup_record(key.service_id, key.backup_id)
            plan = plan_restore(request, record)
            run = resumed if resumed is not None else self._run_plan(plan)

            async def work(job: JobKey, stored: RunPlan | None) -> Succeeded:
                return await self._run_restore(job, client, plan, stored or run)

            return Started(work, run)

        async def reconcile(stored: StoredJob) -> Succeeded | None:
            return await reconcile_restore(client, stored)

        response = await self.runner.submit(
            key, digest, start, requester=requester, reconcile=reconcile
        )
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
    ) -> Succeeded:
        record = await client.service_backup(
            key.service_id,
            key.backup_id,
            service=request.service.to_wire(),
            tags=request.tags,
            replication=request.replication,
        )
        report = JobReport(
            snapshots=len(record.snapshots),
            uncaptured=tuple(resource.to_wire() for resource in record.uncaptured),
        )
        if any(snapshot.type == "database" for snapshot in record.snapshots):
            async with self._transfers.slot(
                key.node_id, "closure-export", _subject(key)
            ) as transfer:
                descriptor = await send_closure(
                    client=client,
                    cloudly=_PacedCalls(self._connection(), transfer),
                    service_id=key.service_id,
                    backup_id=key.backup_id,
                    node_id=key.node_id,
                    chunk_size=self._settings.chunk_size,
                    answer_timeout=self._settings.answer_timeout,
                    clock=self._clock,
                    progress=self._progress(key, "closure_sent"),
                    draws=transfer.holding,
                )
            report = report.with_closure(ClosureFacts(descriptor.size, descriptor.sha256))
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
        return Succeeded(response.to_wire(), report)

    def _run_plan(self, plan: RestorePlan) -> RunPlan:
        """A new run's plan: a fresh idempotency key for each effect it has, its outcome."""
        types = {snapshot.type for snapshot in plan.snapshots}
        effects = RestoreEffects(
            closure_import=self._new_key("closure") if "database" in types else None,
            archive_restore=self._new_key("restore") if types - {"database"} else None,
        )
        response = RestoreClusterServiceResponse.from_wire(
            {"restored": [snapshot.to_wire() for snapshot in plan.snapshots]}
        )
        return RunPlan(effects, Succeeded(response.to_wire(), plan.report()))

    async def _run_restore(
        self, key: JobKey, client: CorestoreClient, plan: RestorePlan, run: RunPlan
    ) -> Succeeded:
        """Restore the plan's snapshots in order, each effect under the run's key: an effect
        Corestore already applied under it (a resumed run) is not applied again."""
        report = run.planned.report
        _log.info("relay_restore_planned", **_key_fields(key), **report.log_fields())
        archive_ids: list[str] = []
        for snapshot in plan.snapshots:
            if snapshot.type != "database":
                archive_ids.append(snapshot.snapshot_id)
                continue
            import_id = run.effects.closure_import
            assert import_id is not None  # a plan with a database has its import's key
            applied = await committed_import(client, import_id)
            if applied is None:
                async with self._transfers.slot(
                    key.node_id, "closure-import", _subject(key)
                ) as transfer:
                    descriptor = await receive_closure(
                        client=client,
                        cloudly=_PacedCalls(self._connection(), transfer),
                        service_id=key.service_id,
                        backup_id=key.backup_id,
                        node_id=key.node_id,
                        import_id=import_id,
                        chunk_size=self._settings.chunk_size,
                        answer_timeout=self._settings.answer_timeout,
                        progress=self._progress(key, "closure_received"),
                        draws=transfer.holding,
                    )
                applied = ClosureFacts(descriptor.size, descriptor.sha256)
            else:
                _log.info("relay_closure_already_imported", **_key_fields(key), size=applied.size)
            report = report.with_closure(applied)
        if archive_ids:
            restore_key = run.effects.archive_restore
            assert restore_key is not None  # a plan with archive snapshots has its key
            await client.service_restore(
                key.service_id, restore_key, key.backup_id, archive_ids, clear=plan.clear
            )
        return Succeeded(run.planned.response, report)

    # --- helpers ------------------------------------------------------------------------------

    def _route(
        self, node_id: str, kind: JobKind, backup_id: str, service_id: str
    ) -> tuple[JobKey, CorestoreClient]:
        cluster_id, endpoint = locate_node(self._cluster_view(), node_id)
        client = self._clients.client_for(node_id, endpoint)
        return JobKey(cluster_id, node_id, kind, backup_id, service_id), client

    def _connection(self) -> CloudlyCalls:
        """The connection a closure calls and streams on (both on one: `agent.relay.closures`);
        no connection is a transfer that cannot go on now (retryable)."""
        try:
            return self._cloudly()
        except SessionClosed as exc:
            raise StreamBroken(f"no database closure moves while {exc}") from exc

    def _progress(self, key: JobKey, event: str) -> Progress:
        """A progress callback that logs at most once per `progress_interval` (and at the end)."""
        interval = self._settings.progress_interval
        pace = ProgressPace(interval, last=self._clock.monotonic() - interval)

        def report(done: int, total: int) -> None:
            if pace.due(self._clock.monotonic(), final=done >= total):
                _log.info(event, **_key_fields(key), bytes=done, total=total)

        return report


async def _dropped(client: CorestoreClient, import_id: str) -> bool:
    """Drop the import the run left open; False when Corestore says it is committed (its
    commit ended after the state was read: the key is kept, not aborted)."""
    try:
        await client.abort_closure_import(import_id)
    except CorestoreRefused as exc:
        if exc.data.get("corestoreCode") != "import-committed":
            raise
        return False
    return True


async def reconcile_restore(client: CorestoreClient, stored: StoredJob) -> Succeeded | None:
    """A restore run a stopped agent left `running`, asked of Corestore by its keys: its
    outcome when every effect was applied (the closure's facts as Corestore committed them),
    else None, after dropping the import it left open (it restarts whole on a resume)."""
    plan = stored.plan
    if plan is None:
        return None
    report = plan.planned.report
    import_id = plan.effects.closure_import
    if import_id is not None:
        applied = await committed_import(client, import_id)
        if applied is None and not await _dropped(client, import_id):
            applied = await committed_import(client, import_id)  # committed meanwhile
        if applied is None:
            return None
        report = report.with_closure(applied)
    restore_key = plan.effects.archive_restore
    if (
        restore_key is not None
        and await client.service_restore_status(stored.key.service_id, restore_key) is None
    ):
        return None
    return Succeeded(plan.planned.response, report)


def _subject(key: JobKey) -> tuple[str, ...]:
    """What a closure transfer names in the transfer view: its job (`agent.watch.overview`)."""
    return (
        "job",
        key.cluster_id,
        key.node_id,
        key.kind,
        key.backup_id,
        key.service_id,
        str(key.run),
    )


def _random_key(kind: str) -> str:
    """A fresh idempotency key (128 random bits): never one an earlier run, or the run of an
    agent whose state was reset, used."""
    return f"{kind}-{secrets.token_hex(16)}"


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
