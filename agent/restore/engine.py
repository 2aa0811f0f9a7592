"""`IsolatedRestoreEngine`: Cloudly's five isolated-restore requests, driven to Corestore.

Every request goes through the same gate, in this order, and a refusal changes nothing:

1. routing: `clusterId` is the session's cluster (`misrouted-cluster`), `targetNodeName` a node
   of it (`unknown-node`) with a valid Corestore endpoint (`node-without-corestore`; also while
   the cluster document is not loaded yet: retryable);
2. the grant's shape (`grants.check_grant`, `grant-invalid`);
3. the revision: `replay.check_expected_revision` — PROCEED, an exact REPLAY of the request
   that produced the current state, or `revision-conflict` {currentRevision, status};
4. the transition table (`RESTORE_TABLE.decide`, `illegal-transition`).

Then (docs/isolated-restore.md has the state machine):

- prepare: writes `preparing` (revision `expectedRevision + 1`, i.e. 1) as a write-ahead intent
  and answers it at once; the engine's task (`work.run_prepare`) asks Corestore and settles
  `prepared` or `failed` (with `lastErrorCode`/`lastErrorMessage`): a refusal by Corestore is a
  state Cloudly reads, not an error reply. What can be refused before anything is stored
  (routing, the grant's shape, `check_preparable`, the contract's id rule) still is, at once.
- stage: moves the object's bytes (`staging.stage_object`), and only once the object is proven
  and committed writes the `stage` mutation. A failed stage changes no revision, so Cloudly's
  retry of the same request proceeds and resumes after the chunks Corestore already verified.
  Its cost does not grow with the manifest: the state row is small (the plan is kept apart),
  whether the object is in the manifest and already written is one keyed lookup
  (`manifest_entry`), and the mutation moves the revision without re-encoding the unchanged
  state.
- execute: writes `restoring` and returns at once; the work (`work.run_execute`) runs in a task
  this engine owns, with the grant of the request that started it held in memory only.
- cleanup: likewise returns at once with `cleaning`; `work.run_cleanup` finishes it
  (`cleaned` or the retryable `cleanup-failed`). Background rather than synchronous because a
  cleanup may delete large resources and Corestore may be slow; Cloudly polls the status.
- status: read-only, never locks, served while a stage of the same restore streams.

Every mutating request answers the state it wrote: the next revision (seed 000). An exact replay
never redoes finished work; it answers the current state. It RESUMES work that is unfinished and
has no running task (after a restart: `preparing`, `restoring`/`verifying`, `cleaning`) with the
replay's fresh grant; while the task runs, it only answers the current state. It also resumes
work that ended `failed` for a reason that may pass (`work.RESUMABLE`: Corestore stayed
unavailable past its tolerance, a credential could not be had, ...): an exact replay of prepare
writes `resume-prepare` (back to `preparing`), one of execute `resume-execute` (back to
`restoring`), and the work runs again from where it stopped. Any other `failed` is answered as it
stands. Nothing is
settled at start-up: unfinished states are logged (`restore_unfinished`) and stay visible in
status until Cloudly repeats the request.

Mutating requests of one restore are serialised by a per-key lock (status takes none). The
engine has its work owner (`owner`, `background.WorkOwner`): the background tasks live in the
TaskGroup of `owner.run()`; `owner.close()` cancels and awaits them, leaving their states in
flight for a later replay. `observe()` hears every mutation the engine writes.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Coroutine, Sequence
from functools import partial
from typing import Any, Final

import structlog

from agent.clock import SYSTEM_CLOCK, Clock, epoch_ms
from agent.contracts.backup import BackupArchiveManifest
from agent.contracts.cluster import ClusterView
from agent.contracts.isolatedrestore import (
    METHOD_CLEANUP,
    METHOD_EXECUTE,
    METHOD_PREPARE,
    METHOD_STAGE,
    CleanupIsolatedRestoreRequest,
    ExecuteIsolatedRestoreRequest,
    GetIsolatedRestoreStatusRequest,
    IsolatedRestoreNodeState,
    IsolatedRestoreRequest,
    IsolatedRestoreStatusResponse,
    PrepareIsolatedRestoreRequest,
    ResourceMapping,
    StageIsolatedRestoreArchiveRequest,
)
from agent.corestore.client import CorestoreClient, CorestoreClients
from agent.domain.replay import Verdict, check_expected_revision, request_digest
from agent.domain.restore_machine import RESTORE_TABLE, Op
from agent.domain.restores import PreparedPlan, RestoreKey, StoredState, plan_of
from agent.errors import ObjectNotInManifest, RestoreNotFound
from agent.protocol.handlers import ByteSource
from agent.restore import state as s
from agent.restore.background import WorkOwner
from agent.restore.grants import check_grant
from agent.restore.routing import check_preparable, locate
from agent.restore.settings import EngineSettings
from agent.restore.staging import StagingWork, stage_object
from agent.restore.work import RESUMABLE, RestoreWork, run_cleanup, run_execute, run_prepare
from agent.secret import Secret
from agent.store import RevisionStore
from agent.transfers import NodeLimits, TransferGate

__all__ = ["IsolatedRestoreEngine", "Observer"]

_log = structlog.get_logger("agent.restore.engine")

Observer = Callable[[StoredState], None]
"""Told every node state the engine (or its background work) wrote, synchronously."""


class IsolatedRestoreEngine:
    """The isolated-restore state of this agent's nodes, and the work that moves it."""

    def __init__(
        self,
        *,
        store: RevisionStore,
        clients: CorestoreClients,
        cluster_view: Callable[[], ClusterView | None],
        settings: EngineSettings | None = None,
        clock: Clock = SYSTEM_CLOCK,
        transfers: TransferGate | None = None,
        rng: Callable[[], float] = random.random,
    ) -> None:
        """`rng` draws the jitter of the waits before a chunk or a commit is sent again.
        `clock` is the engine's one source of time: state timestamps, the pace of the staging
        progress log, the bound of closing (the waits between Corestore's status reads are its
        clients', on the clock they were given). `clients` give each node's Corestore client
        with that node's control credential (fetched, cached and refreshed by their source).
        `transfers`: the per-node transfer slots and byte rate a stage waits for (shared with
        the relay; by default the engine's own, with the default limits)."""
        self.owner: Final = WorkOwner(store, clock=clock)
        """The engine's background work: run it (`owner.run()`) in the caller's TaskGroup,
        stop it with `owner.close()`; requests are refused `shutting-down` outside that."""
        self._store = store
        self._observers: list[Observer] = []
        self._clients = clients
        self._cluster_view = cluster_view
        self._settings = settings or EngineSettings()
        self._clock = clock
        self._rng = rng
        self._transfers = transfers or TransferGate(NodeLimits(), clock=clock)

    @property
    def settings(self) -> EngineSettings:
        """The engine's tunables."""
        return self._settings

    def observe(self, observer: Observer) -> Callable[[], None]:
        """Call `observer(stored)` synchronously after every mutation; returns the remover."""
        self._observers.append(observer)
        return lambda: self._observers.remove(observer)

    # --- the five requests --------------------------------------------------------------------

    async def prepare(self, request: PrepareIsolatedRestoreRequest) -> IsolatedRestoreNodeState:
        """`coreflowPrepareIsolatedRestore`: `preparing` at once; the engine's task goes on."""
        key, client = self._route(request)
        grant = check_grant(request.restore_grant)
        check_preparable(request)
        # The body carries the whole manifest (10,000 objects take ~0.1 s to digest): off the loop.
        digest = await asyncio.to_thread(lambda: request_digest(METHOD_PREPARE, request.to_wire()))
        self.owner.check()
        async with self.owner.hold(key):
            stored = await self._store.get(key)
            if self._verdict(request.expected_revision, stored, digest) is Verdict.REPLAY:
                assert stored is not None
                if self._resumable(stored):
                    stored = await self._resume(stored, Op.RESUME_PREPARE, digest)
                if stored.status == "preparing" and not self.owner.working(key):
                    self._start_prepare(stored, client, grant, await self._store.plan(key))
                return stored.state
            current = (None, 0) if stored is None else (stored.status, stored.revision)
            RESTORE_TABLE.decide(current[0], Op.PREPARE, revision=current[1])
            plan = plan_of(request)
            stored = await self._mutate(
                key,
                request.expected_revision,
                Op.PREPARE,
                s.initial_state(request, epoch_ms(self._clock)),
                plan=plan,
                digest=digest,
            )
            self._start_prepare(stored, client, grant, plan)
            return stored.state

    async def stage(
        self,
        request: StageIsolatedRestoreArchiveRequest,
        open_source: Callable[[], ByteSource],
        *,
        hold_source: Callable[[], None] | None = None,
    ) -> IsolatedRestoreNodeState:
        """`stageIsolatedRestoreArchive`: one manifest object's bytes from `open_source()`.

        The stream is opened only when bytes must move; a replay or an object Corestore already
        holds leaves it unopened (the session discards it). Moving them waits for one of the
        node's transfer slots (`agent.transfers`); while it waits, `hold_source()` tells the
        peer to hold the stream back."""
        key, client = self._route(request)
        grant = check_grant(request.restore_grant)
        digest = request_digest(METHOD_STAGE, request.to_wire())
        async with self.owner.hold(key):
            stored = await self._existing(key)
            verdict = self._verdict(request.expected_revision, stored, digest)
            if verdict is Verdict.PROCEED:
                RESTORE_TABLE.decide(stored.status, Op.STAGE, revision=stored.revision)
            entry = await self._store.manifest_entry(key, request.object.path)
            if entry is None or (entry.size, entry.sha256) != (
                request.object.size,
                request.object.sha256,
            ):
                raise ObjectNotInManifest(
                    f"object {request.object.path} with this size and sha256 is not in the "
                    f"archive manifest of restore {key.restore_id}"
                )
            if not entry.written:
                subject = ("restore", key.cluster_id, key.node_name, key.restore_id)
                async with self._transfers.slot(
                    key.node_name, "stage", subject, on_queued=hold_source
                ) as transfer:
                    outcome = await stage_object(
                        StagingWork(
                            client,
                            self._store,
                            key,
                            stored.state.staging_archive_id,
                            request.object,
                            grant,
                            self._settings,
                            self._clock,
                            transfer.holding,
                            self._rng,
                        ),
                        lambda: transfer.source(open_source()),
                    )
                _log.info(
                    "object_staged",
                    restore_id=key.restore_id,
                    node=key.node_name,
                    path=request.object.path,
                    sent_bytes=outcome.sent_bytes,
                    skipped_bytes=outcome.skipped_bytes,
                )
            if verdict is Verdict.REPLAY:
                return stored.state
            # The state itself does not change: only its revision and status move.
            stored = await self._mutate(key, stored.revision, Op.STAGE, None, digest=digest)
            return stored.state

    def status_now(
        self, request: GetIsolatedRestoreStatusRequest
    ) -> IsolatedRestoreStatusResponse | None:
        """`status` when the store holds the state in memory, without waiting; None when it
        must be read (`status` does)."""
        key, _ = locate(self._cluster_view(), request)
        check_grant(request.restore_grant)
        stored = self._store.kept(key)
        if stored is None:
            return None
        return IsolatedRestoreStatusResponse(found=True, state=stored.state)

    async def status(
        self, request: GetIsolatedRestoreStatusRequest
    ) -> IsolatedRestoreStatusResponse:
        """`coreflowGetIsolatedRestoreStatus`: read-only; `found: false` when there is no state."""
        key, _ = locate(self._cluster_view(), request)
        check_grant(request.restore_grant)
        stored = await self._store.get(key)
        if stored is None:
            return IsolatedRestoreStatusResponse(found=False)
        return IsolatedRestoreStatusResponse(found=True, state=stored.state)

    async def execute(self, request: ExecuteIsolatedRestoreRequest) -> IsolatedRestoreNodeState:
        """`coreflowExecuteIsolatedRestore`: `restoring` at once; the engine's task goes on."""
        key, client = self._route(request)
        grant = check_grant(request.restore_grant)
        digest = request_digest(METHOD_EXECUTE, request.to_wire())
        self.owner.check()
        async with self.owner.hold(key):
            stored = await self._existing(key)
            if self._verdict(request.expected_revision, stored, digest) is Verdict.REPLAY:
                if self._resumable(stored):
                    stored = await self._resume(stored, Op.RESUME_EXECUTE, digest)
                if stored.status in ("restoring", "verifying") and not self.owner.working(key):
                    mappings = await self._store.resource_mappings(key)
                    self._start(run_execute, stored, client, grant, mappings)
                return stored.state
            complete = await self._store.staging_complete(key)
            RESTORE_TABLE.decide(
                stored.status, Op.EXECUTE, revision=stored.revision, guard=complete
            )
            mappings = await self._store.resource_mappings(key)
            stored = await self._mutate(key, stored.revision, Op.EXECUTE, None, digest=digest)
            self._start(run_execute, stored, client, grant, mappings)
            return stored.state

    async def cleanup(self, request: CleanupIsolatedRestoreRequest) -> IsolatedRestoreNodeState:
        """`coreflowCleanupIsolatedRestore`: `cleaning` at once; the engine's task goes on."""
        key, client = self._route(request)
        grant = check_grant(request.restore_grant)
        digest = request_digest(METHOD_CLEANUP, request.to_wire())
        self.owner.check()
        async with self.owner.hold(key):
            stored = await self._existing(key)
            if self._verdict(request.expected_revision, stored, digest) is Verdict.REPLAY:
                if stored.status == "cleaning" and not self.owner.working(key):
                    mappings = await self._store.resource_mappings(key)
                    self._start(run_cleanup, stored, client, grant, mappings)
                return stored.state
            RESTORE_TABLE.decide(stored.status, Op.CLEANUP, revision=stored.revision)
            mappings = await self._store.resource_mappings(key)
            planned = s.with_cleanup_plan(stored.state, mappings)
            stored = await self._mutate(key, stored.revision, Op.CLEANUP, planned, digest=digest)
            self._start(run_cleanup, stored, client, grant, mappings)
            return stored.state

    # --- internals ----------------------------------------------------------------------------

    def _notify(self, stored: StoredState) -> None:
        for observer in list(self._observers):
            observer(stored)

    def _route(self, request: IsolatedRestoreRequest) -> tuple[RestoreKey, CorestoreClient]:
        """The routing key and the Corestore client of the request's node."""
        key, endpoint = locate(self._cluster_view(), request)
        return key, self._clients.client_for(key.node_name, endpoint)

    def _verdict(self, expected: int, stored: StoredState | None, digest: str) -> Verdict:
        return check_expected_revision(
            expected=expected,
            current=0 if stored is None else stored.revision,
            status=None if stored is None else stored.status,
            last_digest=None if stored is None else stored.mutation_digest,
            digest=digest,
        )

    def _resumable(self, stored: StoredState) -> bool:
        """A `failed` state, no work on it, and a failure that may pass."""
        return (
            stored.status == "failed"
            and not self.owner.working(stored.key)
            and stored.state.last_error_code in RESUMABLE
        )

    async def _resume(self, stored: StoredState, op: Op, digest: str) -> StoredState:
        """Move a failed restore back into its work (`op`: a resume); its last error goes."""
        RESTORE_TABLE.decide(stored.status, op, revision=stored.revision, guard=True)
        _log.info(
            "restore_resumed",
            restore_id=stored.key.restore_id,
            node=stored.key.node_name,
            code=stored.state.last_error_code,
        )
        state = s.without_error(stored.state)
        return await self._mutate(stored.key, stored.revision, op, state, digest=digest)

    async def _existing(self, key: RestoreKey) -> StoredState:
        stored = await self._store.get(key)
        if stored is None:
            raise RestoreNotFound(
                f"no isolated restore {key.restore_id} on node {key.node_name} "
                f"of cluster {key.cluster_id}"
            )
        return stored

    async def _mutate(
        self,
        key: RestoreKey,
        expected: int,
        op: Op,
        state: IsolatedRestoreNodeState | None,
        *,
        plan: PreparedPlan | None = None,
        digest: str | None = None,
    ) -> StoredState:
        stored = await self._store.mutate(
            key,
            expected_revision=expected,
            op=op,
            state=state,
            plan=plan,
            request_digest=digest,
        )
        self._notify(stored)
        return stored

    def _start_prepare(
        self, stored: StoredState, client: CorestoreClient, grant: Secret, plan: PreparedPlan
    ) -> None:
        """Start the prepare work, which sends Corestore the whole plan."""
        self._start(
            run_prepare, stored, client, grant, plan.resource_mappings, plan.archive_manifest
        )

    def _start(
        self,
        runner: Callable[[RestoreWork], Coroutine[Any, Any, None]],
        stored: StoredState,
        client: CorestoreClient,
        grant: Secret,
        mappings: Sequence[ResourceMapping],
        manifest: BackupArchiveManifest | None = None,
    ) -> None:
        """Start `runner` on `stored` as the key's background task, holding `grant` for it
        (and the plan's parts it reads: `manifest` only for a prepare)."""
        work = RestoreWork(
            self._store,
            client,
            stored.key,
            grant,
            self._settings,
            self._clock,
            self._notify,
            stored,
            tuple(mappings),
            manifest,
            ended=partial(self.owner.ended, stored.key),
        )
        self.owner.spawn(stored.key, runner(work), work.log_fields())
