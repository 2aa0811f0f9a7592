"""`RevisionStore`: durable isolated-restore node states with compare-and-swap revisions, the
plan fixed at prepare, resumable staging progress and the relay's jobs, in one SQLite file.

This module opens the file and composes the store; each concern lives in its own module, as a
small object over the shared connections, and each call of `RevisionStore` is the method of
the object that owns it, bound to that object (`_answered_by`: its signature and its docstring
are written once, there):

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

from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Concatenate, Final, Generic, ParamSpec, Self, TypeVar, overload

import aiosqlite

from agent.clock import SYSTEM_CLOCK, Clock
from agent.errors import StateUnwritable
from agent.observe import NULL_OBSERVER, StoreObserver
from agent.store.database import Database
from agent.store.node_states import NodeStates, StateMemory
from agent.store.plans import Plans
from agent.store.relay_jobs import RelayJobs
from agent.store.reports import Reports
from agent.store.staging import StagingProgress
from agent.store.startup import open_database, open_reader
from agent.store.statedir import DATABASE_FILE
from agent.store.upkeep import Upkeep

__all__ = ["DB_NAME", "RevisionStore"]

DB_NAME: Final = DATABASE_FILE

_Part = TypeVar("_Part")
_P = ParamSpec("_P")
_R = TypeVar("_R")


class _answered_by(Generic[_Part, _P, _R]):
    """A method of the store that the part in attribute `part` owns: looked up on a store, it
    is the part's own bound method (its signature, its docstring); a subclass may override it
    and reach it with `super()`."""

    def __init__(self, part: str, method: Callable[Concatenate[_Part, _P], _R]) -> None:
        self._part = part
        self._name = method.__name__
        self.__doc__ = method.__doc__

    @overload
    def __get__(self, store: None, owner: type[object]) -> Self: ...

    @overload
    def __get__(self, store: object, owner: type[object] | None = None) -> Callable[_P, _R]: ...

    def __get__(
        self, store: object | None, owner: type[object] | None = None
    ) -> Self | Callable[_P, _R]:
        if store is None:
            return self
        method: Callable[_P, _R] = getattr(getattr(store, self._part), self._name)
        return method


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

    # The parts' own methods, bound to the part (their signatures and docstrings are there).

    # the database (database.py)
    probe_write = _answered_by("_database", Database.probe_write)
    aclose = _answered_by("_database", Database.aclose)

    @property
    def path(self) -> Path:
        return self._database.path

    @property
    def write_fault(self) -> StateUnwritable | None:
        return self._database.write_fault

    @property
    def is_open(self) -> bool:
        return self._database.is_open

    async def __aenter__(self) -> RevisionStore:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # node states (node_states.py)
    get = _answered_by("_states", NodeStates.get)
    kept = _answered_by("_states", NodeStates.kept)
    mutate = _answered_by("_states", NodeStates.mutate)
    list_unfinished = _answered_by("_states", NodeStates.list_unfinished)

    # the plan, written once with its state (plans.py)
    plan = _answered_by("_plans", Plans.plan)
    resource_mappings = _answered_by("_plans", Plans.resource_mappings)
    manifest_entry = _answered_by("_plans", Plans.manifest_entry)
    staging_complete = _answered_by("_plans", Plans.staging_complete)

    # what an operator sees (reports.py, for agent/watch/overview.py and the metrics)
    list_states = _answered_by("_reports", Reports.list_states)
    count_by_status = _answered_by("_reports", Reports.count_by_status)
    status_summary = _answered_by("_reports", Reports.status_summary)
    restore_facts = _answered_by("_reports", Reports.restore_facts)

    # resumable staging: private progress, no revision change (staging.py)
    record_chunk = _answered_by("_staging", StagingProgress.record_chunk)
    verified_chunks = _answered_by("_staging", StagingProgress.verified_chunks)
    mark_object_written = _answered_by("_staging", StagingProgress.mark_object_written)
    written_objects = _answered_by("_staging", StagingProgress.written_objects)
    forget_object = _answered_by("_staging", StagingProgress.forget_object)

    # relay jobs (relay_jobs.py; the SQL lives in job_table.py)
    get_job = _answered_by("_jobs", RelayJobs.get_job)
    list_jobs = _answered_by("_jobs", RelayJobs.list_jobs)
    running_restore = _answered_by("_jobs", RelayJobs.running_restore)
    last_restore = _answered_by("_jobs", RelayJobs.last_restore)
    mark_delivered = _answered_by("_jobs", RelayJobs.mark_delivered)
    move_job = _answered_by("_jobs", RelayJobs.move_job)

    # retention (retention.py runs it; upkeep.py, the SQL in forgetting.py)
    forget_expired = _answered_by("_upkeep", Upkeep.forget_expired)
    vacuum = _answered_by("_upkeep", Upkeep.vacuum)
    checkpoint = _answered_by("_upkeep", Upkeep.checkpoint)
    file_bytes = _answered_by("_upkeep", Upkeep.file_bytes)


def _has_content(path: Path) -> bool:
    try:
        return path.stat().st_size > 0
    except OSError:
        return False
