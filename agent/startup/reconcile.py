"""Reconciliation after a salvaged or reset state: nothing on a node's Corestore is orphaned.

A state database that was salvaged (some rows lost) or reset (all of them) no longer knows
everything Corestore holds for it: the scratch resources and staging archive of an isolated
restore, a closure import a relay restore left open. `Reconciler.run()` (a task of the app's
TaskGroup) does, when `<state>/state-recovery.json` says reconciliation is due
(`agent/store/recovery.py`), once the Cloudly session is connected with a cluster document (a
node's Corestore bearer comes from Cloudly): for each node of the cluster with a Corestore
endpoint, it lists, page by page (`GET /v1/isolated-restores`, `GET
/v1/database-closure-imports`; each walk bounded), what the node holds, and

- an isolated restore the state has no row for is adopted (`Op.ADOPT`): a `cleanup-failed`
  state with its cleanup planned over every mapping and the staging archive
  (`restore.state.adopted_state`), so Cloudly's next cleanup of it removes everything (the
  agent cannot itself: the isolated-restore routes need Cloudly's grant, which is never
  stored). Cloudly's cleanup at its own stale revision is answered `revision-conflict` with
  the adopted state's `currentRevision`; it cleans up at that one.
- an open closure import no `running` relay restore of its service owns is aborted (the service
  routes need only the bearer): its bytes never touched the service's database.

Each node is noted in the record once it is done; a node that fails (Corestore unavailable, no
credential yet) is tried again after a backoff on the clock; a node without a valid endpoint
waits for a cluster document that gives it one. Once every node is done the record says so
(`reconciledAt`). The observer hears the recovery (`state_recovered`), whether reconciliation is
due (`reconcile_pending`) and what it took over (`orphans_adopted`).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from pathlib import Path
from typing import Final

import structlog

from agent.clock import Clock, epoch_ms
from agent.contracts.backup import BackupArchiveManifest
from agent.contracts.cluster import ClusterView
from agent.contracts.isolatedrestore import RESOURCE_MAPPING_ADAPTER, ResourceMapping
from agent.corestore.client import CorestoreClient, CorestoreClients
from agent.corestore.models import ListedRestore
from agent.domain.restore_machine import Op
from agent.domain.restores import PreparedPlan, RestoreKey
from agent.errors import AgentError, RevisionConflict
from agent.observe import NULL_OBSERVER, ReconcileObserver
from agent.restore.state import adopted_state
from agent.retry import Backoff
from agent.store import RevisionStore
from agent.store.recovery import RecoveryRecord, read_recovery, write_recovery
from agent.watch.status import AgentStatus, SessionState, StatusSnapshot

__all__ = ["MAX_PAGES", "Reconciler"]

_log = structlog.get_logger("agent.startup.reconcile")

MAX_PAGES: Final = 10_000
"""The most listing pages one walk reads (100 entries each): a bound on a peer's answers."""
_BACKOFF: Final = Backoff(base=5.0, cap=300.0)


def _connected(snapshot: StatusSnapshot) -> bool:
    return snapshot.state is SessionState.CONNECTED and snapshot.cluster is not None


class Reconciler:
    """Reconciles a salvaged or reset state with each node's Corestore (module docstring)."""

    def __init__(
        self,
        *,
        store: RevisionStore,
        clients: CorestoreClients,
        directory: Path,
        cluster_view: Callable[[], ClusterView | None],
        status: AgentStatus,
        clock: Clock,
        observer: ReconcileObserver = NULL_OBSERVER,
        backoff: Backoff = _BACKOFF,
        rng: Callable[[], float] = random.random,
    ) -> None:
        self._store = store
        self._clients = clients
        self._directory = directory
        self._cluster_view = cluster_view
        self._status = status
        self._clock = clock
        self._observer = observer
        self._backoff = backoff
        self._rng = rng

    async def run(self) -> None:
        """Reconcile every node while the record says it is due; return once done (at once
        when there is no record, or it is done)."""
        record = await asyncio.to_thread(read_recovery, self._directory)
        if record is None:
            return
        self._observer.state_recovered(how=record.how, at=record.at)
        if not record.pending:
            return
        self._observer.reconcile_pending(pending=True)
        _log.warning(
            "state_reconcile_pending",
            how=record.how,
            reconciled_nodes=list(record.reconciled_nodes),
            hint="the state was salvaged or reset: once connected the agent lists what each "
            "node's Corestore holds and takes what the state does not know into cleanup",
        )
        failures = 0
        while True:
            await self._status.wait_until(_connected)
            record, waiting = await self._round(record)
            if not waiting:
                break
            failures += 1
            await self._clock.sleep(self._backoff.delay(failures, self._rng()))
        record = record.done(self._clock.time())
        await self._save(record)
        self._observer.reconcile_pending(pending=False)
        _log.info("state_reconciled", how=record.how, nodes=list(record.reconciled_nodes))

    async def _round(self, record: RecoveryRecord) -> tuple[RecoveryRecord, list[str]]:
        """Reconcile every node not done yet; the record and the nodes still waiting."""
        view = self._cluster_view()
        if view is None:
            return record, ["(no cluster document)"]
        waiting: list[str] = []
        for node_id, node in sorted(view.nodes.items()):
            if node_id in record.reconciled_nodes:
                continue
            if node.corestore_endpoint is None:
                waiting.append(node_id)
                continue
            try:
                client = self._clients.client_for(node_id, node.corestore_endpoint)
                await self._reconcile_node(view.cluster_id, node_id, client, record.how)
            except AgentError as exc:
                _log.warning(
                    "state_reconcile_node_failed", node=node_id, code=exc.code, error=str(exc)
                )
                waiting.append(node_id)
                continue
            record = record.with_node(node_id)
            await self._save(record)
        return record, waiting

    async def _save(self, record: RecoveryRecord) -> None:
        try:
            await asyncio.to_thread(write_recovery, self._directory, record)
        except OSError as exc:  # the next start reconciles again: harmless, it is idempotent
            _log.warning("state_recovery_record_unwritten", error=exc.strerror or str(exc))

    async def _reconcile_node(
        self, cluster_id: str, node_id: str, client: CorestoreClient, how: str
    ) -> None:
        restores = await self._adopt_restores(cluster_id, node_id, client, how)
        imports = await self._abort_imports(cluster_id, node_id, client)
        self._observer.orphans_adopted(what="restore", count=restores)
        self._observer.orphans_adopted(what="import", count=imports)
        _log.info(
            "state_reconciled_node",
            node=node_id,
            restores_adopted=restores,
            imports_aborted=imports,
        )

    async def _adopt_restores(
        self, cluster_id: str, node_id: str, client: CorestoreClient, how: str
    ) -> int:
        adopted, after = 0, None
        for _ in range(MAX_PAGES):
            page = await client.list_restores(after)
            for listed in page.restores:
                key = RestoreKey(cluster_id, node_id, listed.restore_id)
                if await self._store.get(key) is None and await self._adopt(key, listed, how):
                    adopted += 1
            if page.next is None or (after is not None and page.next <= after):
                break
            after = page.next
        return adopted

    async def _adopt(self, key: RestoreKey, listed: ListedRestore, how: str) -> bool:
        mappings: list[ResourceMapping] = []
        for mapping in listed.resource_mappings:
            try:
                mappings.append(RESOURCE_MAPPING_ADAPTER.validate_python(mapping.to_wire()))
            except ValueError:
                _log.warning(
                    "state_reconcile_mapping_unreadable",
                    restore_id=key.restore_id,
                    mapping=mapping.id,
                )
        state = adopted_state(
            restore_id=key.restore_id,
            cluster_id=key.cluster_id,
            node_id=key.node_name,
            scratch_namespace_id=listed.scratch_namespace_id,
            staging_archive_id=listed.staging_archive_id,
            mappings=mappings,
            how=how,
            now=epoch_ms(self._clock),
        )
        plan = PreparedPlan(
            resource_mappings=mappings, archive_manifest=BackupArchiveManifest(objects=[])
        )
        try:
            await self._store.mutate(key, expected_revision=0, op=Op.ADOPT, state=state, plan=plan)
        except RevisionConflict:
            return False  # a row appeared meanwhile: the state knows it now
        _log.warning(
            "orphan_restore_adopted",
            node=key.node_name,
            restore_id=key.restore_id,
            resources=len(listed.resources),
            staging_archive=listed.staging_archive,
            hint="cleanup-failed until Cloudly's next cleanup of it removes what it holds",
        )
        return True

    async def _abort_imports(self, cluster_id: str, node_id: str, client: CorestoreClient) -> int:
        aborted, after = 0, None
        for _ in range(MAX_PAGES):
            page = await client.list_closure_imports(after)
            for listed in page.imports:
                if listed.state != "open":
                    continue
                if await self._store.running_restore(cluster_id, node_id, listed.service_id):
                    continue
                await client.abort_closure_import(listed.import_id)
                aborted += 1
                _log.warning(
                    "orphan_import_aborted",
                    node=node_id,
                    import_id=listed.import_id,
                    service_id=listed.service_id,
                    backup_id=listed.backup_id,
                )
            if page.next is None or (after is not None and page.next <= after):
                break
            after = page.next
        return aborted
