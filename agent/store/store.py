"""`RevisionStore`: durable isolated-restore node states with compare-and-swap revisions, the
plan fixed at prepare, resumable staging progress and the relay's jobs, in one SQLite file.

This module opens the file and composes the store; each concern lives in its own module, as a
small object over the shared connections, and `RevisionStore` answers every call by handing it
to the one that owns it:

    database.py    Database          the writer and reader connections, their lock, sqlite3's
                                     failures as `StoreError`, a write the disk refused
                                     (`StateUnwritable`, `write_fault`, `probe_write`), close
    node_states.py NodeStates        `get` (from memory: `StateMemory`), `kept`, `mutate` (the
                                     CAS in SQL, the plan written with a new state),
                                     `list_unfinished`
    plans.py       Plans             the plan read back: `plan`, `resource_mappings`,
                                     `manifest_entry`, `staging_complete`
    staging.py     StagingProgress   `record_chunk`, `verified_chunks`, `mark_object_written`,
                                     `written_objects`, `forget_object`
    relay_jobs.py  RelayJobs         `get_job`, `list_jobs`, `running_restore`, `last_restore`,
                                     `mark_delivered`, `move_job` (the SQL in `job_table.py`)
    reports.py     Reports           `list_states`, `count_by_status`, `status_summary`,
                                     `restore_facts`
    upkeep.py      Upkeep            retention's `forget_expired`, `vacuum`, `checkpoint`;
                                     `file_bytes`

The file (WAL, `synchronous=FULL`, foreign keys on) holds one state row per (cluster_id,
node_name, restore_id), a missing row being revision 0. Start-up (`startup.open_database`): the
directory is made 0700, the file 0600, and `PRAGMA integrity_check` runs *before* anything else
touches the file. A damaged database is left where it is and refused (`StoreCorrupt`) at every
start until an operator salvages or resets it (`salvage.py`): an empty database never takes its
place by itself.

Never persisted: a grant. The store refuses a state or plan that is or holds a `Secret`, or
carries a `restoreGrant` field or key at any depth (`codec.py`).
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from types import TracebackType
from typing import Final

import aiosqlite

from agent.clock import SYSTEM_CLOCK, Clock
from agent.contracts.isolatedrestore import IsolatedRestoreNodeState, ResourceMapping
from agent.domain.job_machine import JobOp, JobStatus
from agent.domain.jobs import JobKey, StoredJob
from agent.domain.outcomes import JobResult, RunPlan
from agent.domain.restore_machine import Op
from agent.domain.restores import PreparedPlan, RestoreKey, StoredState
from agent.errors import StateUnwritable
from agent.observe import NULL_OBSERVER, StoreObserver
from agent.store import forgetting
from agent.store.database import Database
from agent.store.node_states import NodeStates, StateMemory
from agent.store.plans import Plans
from agent.store.records import ChunkRecord, ManifestEntry, ObjectRecord, StatusSummary
from agent.store.relay_jobs import RelayJobs
from agent.store.reports import Reports
from agent.store.staging import StagingProgress
from agent.store.startup import open_database, open_reader
from agent.store.statedir import DATABASE_FILE
from agent.store.upkeep import Upkeep

__all__ = ["DB_NAME", "RevisionStore"]

DB_NAME: Final = DATABASE_FILE


class RevisionStore:
    """The durable node states, their revisions and resumable staging progress."""

    def __init__(
        self,
        db: aiosqlite.Connection,
        path: Path,
        clock: Clock,
        *,
        integrity: str = "ok",
        observer: StoreObserver = NULL_OBSERVER,
        reader: aiosqlite.Connection | None = None,
    ) -> None:
        """Use `await RevisionStore.open(directory)`. `reader` answers `get()` (None: `db`)."""
        self._database = Database(db, path, clock, observer=observer, reader=reader)
        self.integrity = integrity
        """What the start-up check found: `ok` (an existing file passed `integrity_check`) or
        `new` (no database yet, an empty one was made)."""
        # The node states `get()` answers from: kept by the writes of state rows, dropped by
        # retention's forgetting.
        memory = StateMemory()
        self._states = NodeStates(self._database, memory)
        self._plans = Plans(self._database)
        self._staging = StagingProgress(self._database)
        self._jobs = RelayJobs(self._database)
        self._reports = Reports(self._database)
        self._upkeep = Upkeep(self._database, memory)

    @classmethod
    async def open(
        cls,
        directory: Path,
        *,
        name: str = DB_NAME,
        busy_timeout: float = 5.0,
        clock: Clock = SYSTEM_CLOCK,
        observer: StoreObserver = NULL_OBSERVER,
    ) -> RevisionStore:
        """Open (creating, checking and migrating) `directory/name`.

        Raises `StoreCorrupt` after moving a damaged file aside, `StoreError` for anything else
        (unwritable directory, a schema newer than this agent, SQLite older than 3.35).
        `busy_timeout` is how long a call waits for another connection's write lock. `clock`'s
        wall time stamps every mutation (`updated_at`) and a moved-aside file. `observer`
        hears every mutation (with its latency) and the staging progress.
        """
        path = directory / name
        existed = _has_content(path)
        db = await open_database(path, busy_timeout=busy_timeout, clock=clock, observer=observer)
        try:
            reader = await open_reader(path, busy_timeout=busy_timeout)
        except BaseException:
            await db.close()
            raise
        integrity = "ok" if existed else "new"
        return cls(db, path, clock, integrity=integrity, observer=observer, reader=reader)

    # --- the database (database.py) ---------------------------------------------------------

    @property
    def path(self) -> Path:
        """The database file."""
        return self._database.path

    @property
    def write_fault(self) -> StateUnwritable | None:
        """The disk's last refusal of a write, until a write gets through again (None: the
        last write committed)."""
        return self._database.write_fault

    async def probe_write(self) -> bool:
        """One small real write: True when it committed, which clears `write_fault`."""
        return await self._database.probe_write()

    @property
    def is_open(self) -> bool:
        """Whether calls can be made (False once `aclose()` began)."""
        return self._database.is_open

    async def aclose(self) -> None:
        """Close the connections (idempotent); later calls raise `StoreError`."""
        await self._database.aclose()

    async def __aenter__(self) -> RevisionStore:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # --- node states (node_states.py) -------------------------------------------------------

    async def get(self, key: RestoreKey) -> StoredState | None:
        """The state stored under `key`, or None (revision 0): from memory when the store read
        or wrote it lately, else read on the reader connection, waiting for no write."""
        return await self._states.get(key)

    def kept(self, key: RestoreKey) -> StoredState | None:
        """The state of `key` as `get()` would answer it from memory, without waiting; None
        when it is not in memory (`get()` reads it) or the store is closed."""
        return self._states.kept(key)

    async def mutate(
        self,
        key: RestoreKey,
        *,
        expected_revision: int,
        op: Op,
        state: IsolatedRestoreNodeState | None = None,
        plan: PreparedPlan | None = None,
        request_digest: str | None = None,
    ) -> StoredState:
        """Apply `op` at `expected_revision`: one transaction, revision + 1, or nothing at all
        (`NodeStates.mutate` says what each argument is and what it raises)."""
        return await self._states.mutate(
            key,
            expected_revision=expected_revision,
            op=op,
            state=state,
            plan=plan,
            request_digest=request_digest,
        )

    async def list_unfinished(self) -> list[StoredState]:
        """States in an in-flight status (`restore_machine.IN_FLIGHT`), oldest change first."""
        return await self._states.list_unfinished()

    # --- the plan, written once with its state (plans.py) -----------------------------------

    async def plan(self, key: RestoreKey) -> PreparedPlan:
        """The whole plan of `key` (its manifest included); `RestoreNotFound` without one."""
        return await self._plans.plan(key)

    async def resource_mappings(self, key: RestoreKey) -> list[ResourceMapping]:
        """The plan's resource mappings of `key` (its manifest left unread)."""
        return await self._plans.resource_mappings(key)

    async def manifest_entry(self, key: RestoreKey, object_path: str) -> ManifestEntry | None:
        """The manifest's object at `object_path` and whether it is written, or None when the
        manifest of `key` lists no such path."""
        return await self._plans.manifest_entry(key, object_path)

    async def staging_complete(self, key: RestoreKey) -> bool:
        """Whether every manifest object of `key` is written with its manifest size and sha256
        (true for an empty manifest)."""
        return await self._plans.staging_complete(key)

    # --- what an operator sees (reports.py, for agent/watch/overview.py and the metrics) ----------

    async def list_states(self, limit: int = 500) -> list[StoredState]:
        """Up to `limit` node states, the most recently changed first."""
        return await self._reports.list_states(limit)

    async def count_by_status(self) -> dict[str, int]:
        """How many node states each status has (statuses without any are left out)."""
        return await self._reports.count_by_status()

    async def status_summary(self) -> StatusSummary:
        """Per status the row count and the oldest `updated_at`, of node states and relay jobs,
        and the file's size (the metrics' gauges)."""
        return await self._reports.status_summary()

    async def restore_facts(
        self, limit: int = 500, *, counted: Collection[str] = ()
    ) -> dict[tuple[str, str, str], tuple[int, int, int, int, int]]:
        """For the `limit` most recently changed node states, the sizes of their plan and (in
        a `counted` status) of their staging: `Reports.restore_facts`."""
        return await self._reports.restore_facts(limit, counted=counted)

    # --- resumable staging: private progress, no revision change (staging.py) ---------------

    async def record_chunk(
        self, key: RestoreKey, object_path: str, offset: int, length: int, sha256: str
    ) -> None:
        """Remember that Corestore accepted `length` bytes of `object_path` at `offset` (the
        same offset again replaces it); `RestoreNotFound` when no state exists under `key`."""
        await self._staging.record_chunk(key, object_path, offset, length, sha256)

    async def verified_chunks(self, key: RestoreKey, object_path: str) -> list[ChunkRecord]:
        """The recorded chunks of `object_path`, by offset."""
        return await self._staging.verified_chunks(key, object_path)

    async def mark_object_written(
        self, key: RestoreKey, object_path: str, size: int, sha256: str
    ) -> None:
        """Remember that `object_path` is complete with `size` bytes hashing to `sha256`."""
        await self._staging.mark_object_written(key, object_path, size, sha256)

    async def written_objects(self, key: RestoreKey) -> list[ObjectRecord]:
        """The objects marked written under `key`, by path."""
        return await self._staging.written_objects(key)

    async def forget_object(self, key: RestoreKey, object_path: str) -> None:
        """Drop the chunks and the written mark of `object_path` (one transaction)."""
        await self._staging.forget_object(key, object_path)

    # --- relay jobs (relay_jobs.py; the SQL lives in job_table.py) --------------------------

    async def get_job(self, key: JobKey) -> StoredJob | None:
        """The relay job stored under `key`, or None."""
        return await self._jobs.get_job(key)

    async def list_jobs(self, status: JobStatus | None = None) -> list[StoredJob]:
        """Every relay job (or those in `status`), oldest change first."""
        return await self._jobs.list_jobs(status)

    async def running_restore(
        self, cluster_id: str, node_id: str, service_id: str
    ) -> StoredJob | None:
        """The restore of `service_id` on `node_id` the store holds as `running`, or None."""
        return await self._jobs.running_restore(cluster_id, node_id, service_id)

    async def last_restore(
        self, cluster_id: str, node_id: str, service_id: str
    ) -> StoredJob | None:
        """The last restore run of `service_id` on `node_id` (the highest run), or None."""
        return await self._jobs.last_restore(cluster_id, node_id, service_id)

    async def mark_delivered(self, key: JobKey, *, revision: int) -> bool:
        """Record that the answer of the job at `revision` reached Cloudly (False: the job
        moved on since, or it was recorded already)."""
        return await self._jobs.mark_delivered(key, revision=revision)

    async def move_job(
        self,
        key: JobKey,
        *,
        op: JobOp,
        expected_revision: int,
        digest: str,
        result: JobResult | None = None,
        plan: RunPlan | None = None,
    ) -> StoredJob:
        """Apply `op` to the relay job at `expected_revision` (one transaction), or raise
        `RevisionConflict`/`IllegalTransition` and change nothing. `plan`: a restore run's, when
        it starts (kept by every later move)."""
        return await self._jobs.move_job(
            key, op=op, expected_revision=expected_revision, digest=digest, result=result, plan=plan
        )

    # --- retention (retention.py runs it; upkeep.py, the SQL in forgetting.py) ---------------

    async def forget_expired(self, cutoff_ms: int, *, rows: int) -> forgetting.ForgetStep:
        """One bounded step of forgetting what finished before `cutoff_ms` (at most about
        `rows` rows, one transaction): `forgetting.forget_step`."""
        return await self._upkeep.forget_expired(cutoff_ms, rows=rows)

    async def vacuum(self, *, pages: int) -> int:
        """Give up to `pages` free pages back to the file system; the bytes freed."""
        return await self._upkeep.vacuum(pages=pages)

    async def checkpoint(self) -> None:
        """Move the WAL into the database file; truncate the WAL."""
        await self._upkeep.checkpoint()

    def file_bytes(self) -> int:
        """The database's files on disk now: the database and its WAL, in bytes."""
        return self._upkeep.file_bytes()


def _has_content(path: Path) -> bool:
    try:
        return path.stat().st_size > 0
    except OSError:
        return False
