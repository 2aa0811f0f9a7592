"""`RevisionStore`: durable isolated-restore node states with compare-and-swap revisions.

One SQLite file (WAL, `synchronous=FULL`, foreign keys on) holds one row per
(cluster_id, node_name, restore_id). A missing row is revision 0. `mutate()` is one SQL statement,
hence one transaction: `INSERT ... ON CONFLICT DO NOTHING` from revision 0, otherwise
`UPDATE ... SET revision = revision + 1, status = CASE status ... END WHERE <key> AND
revision = :expected AND status IN (<statuses the operation may leave>)`, both built from the
state machine's table. The compare-and-swap therefore lives in SQL: two agents (or two stores)
on one file cannot both win, and an illegal move cannot be persisted even by a buggy caller.
When the statement changes no row, the store reads the row once to say why: the revision moved
(`RevisionConflict`, with the current revision and status) or, the revision being the expected
one, the operation is illegal in that status (`IllegalTransition`). Revisions only grow, so the
revision being equal means nothing changed in between.

Start-up (`startup.open_database`): the directory is made 0700, the file 0600, and
`PRAGMA integrity_check` runs *before* anything else touches the file. A damaged database is
left where it is and refused (`StoreCorrupt`) at every start until an operator salvages or
resets it (`salvage.py`): an empty database never takes its place by itself.

A disk that refuses a write (full, read-only, failing: `faults.py`) makes the call raise
`StateUnwritable` (wire code `state-unwritable`, retryable) instead of `StoreError`. The store
remembers it (`write_fault`), logs it once at error with its cause (`state_database_unwritable`)
and tells its observer (`state_write_failed`); the next write that commits, or a `probe_write()`
that gets through, clears it (`state_database_writable`, `state_writable`). Reads go on
meanwhile: in WAL mode they need no room.

What it stores: the node state (`IsolatedRestoreNodeState`, the frozen contract model) and the
engine's `PreparedPlan`, as JSON written and read only by `codec.py`. Never persisted: a grant.
The plan is written once, with the state it belongs to (the `prepare` that creates the row, in
the same transaction), and never again: its mappings and manifest live in `restore_plan`, its
manifest's objects are rows of `manifest_object`. A request reads the small state row only;
the manifest is asked by key (`manifest_entry`: in the manifest? written?; `staging_complete`),
the mappings only by the work that needs them (`resource_mappings`), the whole plan only by a
prepare's work (`plan`). A mutation that does not change the state (a stage) passes no state:
the row keeps its JSON and only the revision, status, digest and time move.
The store refuses a state or plan that is or holds a `Secret`, or carries a `restoreGrant` field
or key at any depth. Every sqlite3 failure becomes `StoreError`
(chained). One connection writes; an asyncio lock gives each call the connection alone, so
a multi-statement transaction never interleaves with another call's statements. A second,
read-only connection answers `get()` (a status request's read): in WAL mode it sees every
committed write and waits for none, so a status never queues behind staging's chunk records.

`get()` answers from memory when it can: the store keeps the node states it last read or wrote
(the `CACHED_STATES` most recently used). While the agent runs its store is the file's only
writer (`agent.lock`, `statedir.py`), and every write of a state row goes through `_mutate`
(which keeps the row it returns) or `forget_expired` (which drops them all), so what it keeps is
what the file holds. Measured under sixteen stages at once (docs/benchmarks.md, "One byte
budget"): the reader connection's hop to its thread and back was 2 ms at the median and 27 ms at
the 99th percentile, most of a status call's time in the agent.
"""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, Final

import aiosqlite
import structlog

from agent.clock import SYSTEM_CLOCK, Clock, epoch_ms
from agent.contracts.isolatedrestore import IsolatedRestoreNodeState, ResourceMapping
from agent.domain.job_machine import JobOp, JobStatus
from agent.domain.jobs import JobKey, StoredJob
from agent.domain.outcomes import JobResult, RunPlan
from agent.domain.restore_machine import IN_FLIGHT, RESTORE_TABLE, Op
from agent.domain.restores import PreparedPlan, RestoreKey, StoredState
from agent.errors import (
    AgentError,
    IllegalTransition,
    InvalidState,
    RestoreNotFound,
    RevisionConflict,
    StateUnwritable,
    StoreError,
)
from agent.observe import NULL_OBSERVER, StoreObserver
from agent.statedir import DATABASE_FILE
from agent.store import forgetting, job_table
from agent.store.codec import (
    EncodedPlan,
    check_count,
    check_path,
    check_sha256,
    encode_plan,
    encode_state,
    is_sha256,
    read_mappings,
    read_plan,
    to_stored,
)
from agent.store.faults import store_error
from agent.store.files import database_bytes
from agent.store.records import ChunkRecord, ManifestEntry, ObjectRecord, StatusSummary
from agent.store.startup import open_database, open_reader
from agent.store.transitions import status_moves

__all__ = ["DB_NAME", "RevisionStore"]

DB_NAME: Final = DATABASE_FILE

_log = structlog.get_logger("agent.store")

_FOREIGN_KEY: Final = 787  # SQLITE_CONSTRAINT_FOREIGNKEY

CACHED_STATES: Final = 1024
"""How many node states `get()` keeps in memory (a few KiB each: the small state row)."""

_KEY_WHERE: Final = (
    "cluster_id = :cluster_id AND node_name = :node_name AND restore_id = :restore_id"
)
# The same key condition on the rows of a table aliased `t`, from the state row `s`.
_SAME_KEY: Final = (
    "{t}.cluster_id = s.cluster_id AND {t}.node_name = s.node_name "
    "AND {t}.restore_id = s.restore_id"
)
_COLUMNS: Final = (
    "cluster_id, node_name, restore_id, revision, status, state_json, mutation_digest, updated_at"
)
_INSERT: Final = f"""
INSERT INTO restore_state ({_COLUMNS})
VALUES (:cluster_id, :node_name, :restore_id, 1, :to_status, :state_json, :digest, :now)
ON CONFLICT (cluster_id, node_name, restore_id) DO NOTHING
RETURNING {_COLUMNS}
"""  # noqa: S608  # placeholders only; column names are constants
_INSERT_PLAN: Final = """
INSERT INTO restore_plan (cluster_id, node_name, restore_id, mappings_json, manifest_json,
                          mapping_count, object_count, manifest_bytes)
VALUES (:cluster_id, :node_name, :restore_id, :mappings_json, :manifest_json,
        :mapping_count, :object_count, :manifest_bytes)
"""
_INSERT_OBJECT: Final = """
INSERT INTO manifest_object (cluster_id, node_name, restore_id, object_path, size, sha256)
VALUES (?, ?, ?, ?, ?, ?)
"""


def _update_statement(op: Op) -> tuple[str, dict[str, str]] | None:
    """The CAS `UPDATE` for `op`, its status CASE and IN list built from the table."""
    moves = status_moves(RESTORE_TABLE, op)
    if moves is None:
        return None
    sql = f"""
UPDATE restore_state
SET revision = revision + 1,
    status = {moves.case},
    state_json = COALESCE(:state_json, state_json),
    mutation_digest = COALESCE(:digest, mutation_digest),
    updated_at = :now
WHERE {_KEY_WHERE} AND revision = :expected AND status IN ({moves.allowed})
RETURNING {_COLUMNS}
"""  # noqa: S608  # placeholders only; the shape comes from the transition table
    return sql, moves.params


_UPDATES: Final = {op: statement for op in Op if (statement := _update_statement(op)) is not None}


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
        self._db: aiosqlite.Connection | None = db
        self._reader = reader
        self._path = path
        self._clock = clock
        self._lock = asyncio.Lock()
        self._observer = observer
        self.integrity = integrity
        """What the start-up check found: `ok` (an existing file passed `integrity_check`) or
        `new` (no database yet, an empty one was made)."""
        self._fault: StateUnwritable | None = None
        self._states: OrderedDict[RestoreKey, StoredState] = OrderedDict()
        # Counts the writes of state rows: a read that saw one happen meanwhile is not kept
        # (it may be older than what the write left).
        self._state_writes = 0

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

    @property
    def path(self) -> Path:
        """The database file."""
        return self._path

    @property
    def write_fault(self) -> StateUnwritable | None:
        """The disk's last refusal of a write, until a write gets through again (None: the
        last write committed)."""
        return self._fault

    async def probe_write(self) -> bool:
        """One small real write (the header's `user_version`, rewritten as it is, through the
        WAL): True when it committed, which clears `write_fault`."""
        try:
            async with self._connection(write=True) as db:
                rows = list(await db.execute_fetchall("PRAGMA user_version"))
                await db.execute_fetchall(f"PRAGMA user_version = {int(rows[0][0])}")
        except StateUnwritable:
            return False
        self._wrote()
        return True

    def _refused(self, exc: StateUnwritable) -> None:
        """Remember and report a write the disk refused (logged at error once per cause)."""
        if self._fault is None or self._fault.cause != exc.cause:
            _log.error(
                "state_database_unwritable",
                path=str(self._path),
                cause=exc.cause,
                error=str(exc),
                free_bytes=_free_bytes(self._path.parent),
                hint="make room on (or remount read-write) the file system of the state "
                "directory; the agent is not ready meanwhile, answers state-unwritable "
                "(retryable) and takes writes again by itself",
            )
        self._fault = exc
        self._observer.state_write_failed(cause=exc.cause)

    def _wrote(self) -> None:
        """A write committed: a remembered refusal is over."""
        if self._fault is not None:
            _log.info("state_database_writable", path=str(self._path), cause=self._fault.cause)
            self._fault = None
            self._observer.state_writable()

    @property
    def is_open(self) -> bool:
        """Whether calls can be made (False once `aclose()` began)."""
        return self._db is not None

    async def aclose(self) -> None:
        """Close the connection (idempotent); later calls raise `StoreError`."""
        async with self._lock:
            db, self._db = self._db, None
            reader, self._reader = self._reader, None
            try:
                if reader is not None:
                    await reader.close()
                if db is not None:
                    await db.close()
            except sqlite3.Error as exc:
                raise StoreError(f"closing the state database failed: {exc}") from exc

    async def __aenter__(self) -> RevisionStore:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # --- node states ------------------------------------------------------------------------

    async def get(self, key: RestoreKey) -> StoredState | None:
        """The state stored under `key`, or None (revision 0): from memory when the store read
        or wrote it lately, else read on the reader connection, waiting for no write."""
        if self._db is None:
            raise StoreError("the revision store is closed")
        kept = self.kept(key)
        if kept is not None:
            return kept
        writes = self._state_writes
        async with self._reading() as db:
            rows = await db.execute_fetchall(
                f"SELECT {_COLUMNS} FROM restore_state WHERE {_KEY_WHERE}",  # noqa: S608
                key.as_params(),
            )
        stored = next((to_stored(row) for row in rows), None)
        if stored is not None and writes == self._state_writes:
            self._keep(key, stored)
        return stored

    def kept(self, key: RestoreKey) -> StoredState | None:
        """The state of `key` as `get()` would answer it from memory, without waiting; None
        when it is not in memory (`get()` reads it) or the store is closed."""
        kept = self._states.get(key) if self._db is not None else None
        if kept is not None:
            self._states.move_to_end(key)
        return kept

    def _keep(self, key: RestoreKey, stored: StoredState) -> None:
        self._states[key] = stored
        self._states.move_to_end(key)
        while len(self._states) > CACHED_STATES:
            self._states.popitem(last=False)

    @contextmanager
    def _writing_state(
        self, key: RestoreKey | None
    ) -> Iterator[Callable[[StoredState], StoredState]]:
        """Around a write of state rows (`key`'s, or any: None): once it ends, what is kept
        for them is the row the write returned (`keep`) or nothing, and a read that began
        before the end is not kept (it may be older than what the write left). A write that
        fails, or is cancelled after SQLite committed it, leaves nothing behind to answer
        from."""
        kept: list[StoredState] = []

        def keep(stored: StoredState) -> StoredState:
            kept.append(stored)
            return stored

        self._state_writes += 1
        try:
            yield keep
        finally:
            self._state_writes += 1
            if key is None:
                self._states.clear()
            elif kept:
                self._keep(key, kept[-1])
            else:
                self._states.pop(key, None)

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
        """Apply `op` at `expected_revision`: one transaction, revision + 1, or nothing at all.

        `state` is the whole node state, or None to keep the stored one as it is (a stage moves
        only the revision and status); the store owns `restoreId`, `clusterId`,
        `targetNodeName` (must match `key`), `revision`, `status` (the table decides it from
        `op`) and `updatedAt`, whatever `state` says. `plan` is the engine's `PreparedPlan`,
        given exactly when the state is created (revision 0, with its state) and never after:
        it is fixed at prepare. `request_digest` is given for a Cloudly request and None for the
        engine's own progress, which keeps the digest of the request it follows.

        Raises `RevisionConflict` (revision not current), `IllegalTransition` (revision current,
        `op` illegal in its status), `InvalidState` (a bug: a secret, a foreign key, no state or
        plan for a new state, a plan for an existing one), `StoreError` (SQLite failed).
        """
        if isinstance(expected_revision, bool) or not isinstance(expected_revision, int):
            raise InvalidState("expected_revision must be an int")
        if request_digest is not None and not is_sha256(request_digest):
            raise InvalidState("request_digest must be 64 lower-case hex characters")
        creates = expected_revision == 0 and RESTORE_TABLE.sources(op).get(None) is not None
        if creates and (plan is None or state is None):
            raise InvalidState("a new node state needs its state and its plan")
        if not creates and plan is not None:
            raise InvalidState("the plan is written with the state it belongs to, and never after")
        params: dict[str, Any] = {
            **key.as_params(),
            "expected": expected_revision,
            "state_json": None if state is None else encode_state(key, state),
            "digest": request_digest,
            "now": self._now_ms(),
        }
        # A plan holds the whole manifest (10,000 objects take ~40 ms to check and encode):
        # off the loop, once per restore.
        encoded = None if plan is None else await asyncio.to_thread(encode_plan, plan)
        started = self._clock.monotonic()
        try:
            stored = await self._mutate(op, key, params, expected_revision, encoded)
        except AgentError as exc:
            self._observe_mutation(op, exc.code, started)
            raise
        self._observe_mutation(op, "ok", started)
        return stored

    def _observe_mutation(self, op: Op, outcome: str, started: float) -> None:
        seconds = self._clock.monotonic() - started
        self._observer.store_mutation(op=op.value, outcome=outcome, seconds=seconds)

    async def _mutate(
        self,
        op: Op,
        key: RestoreKey,
        params: dict[str, Any],
        expected_revision: int,
        plan: EncodedPlan | None,
    ) -> StoredState:
        update = _UPDATES.get(op)
        with self._writing_state(key) as keep:
            async with self._connection(write=True) as db:
                rows: Iterable[sqlite3.Row] = ()
                insert_to = RESTORE_TABLE.sources(op).get(None)
                if expected_revision == 0 and insert_to is not None and plan is not None:
                    rows = await _create(db, key, {**params, "to_status": insert_to}, plan)
                elif expected_revision > 0 and update is not None:
                    sql, status_params = update
                    rows = await db.execute_fetchall(sql, {**params, **status_params})
                for row in rows:
                    return keep(to_stored(row))
                current = await db.execute_fetchall(
                    f"SELECT revision, status FROM restore_state WHERE {_KEY_WHERE}",  # noqa: S608
                    key.as_params(),
                )
        revision, status = next(iter(current), (0, None))
        if revision != expected_revision:
            raise RevisionConflict(expected=expected_revision, current=revision, status=status)
        raise IllegalTransition(operation=op.value, status=status, current=revision)

    # --- the plan (written once, with its state) --------------------------------------------

    async def plan(self, key: RestoreKey) -> PreparedPlan:
        """The whole plan of `key` (its manifest included); `RestoreNotFound` without one."""
        async with self._connection() as db:
            rows = await db.execute_fetchall(
                "SELECT mappings_json, manifest_json FROM restore_plan "  # noqa: S608
                f"WHERE {_KEY_WHERE}",
                key.as_params(),
            )
        for mappings_json, manifest_json in rows:
            # The whole manifest (10,000 objects take ~40 ms to validate): off the loop.
            return await asyncio.to_thread(read_plan, mappings_json, manifest_json)
        raise _not_found(key)

    async def resource_mappings(self, key: RestoreKey) -> list[ResourceMapping]:
        """The plan's resource mappings of `key` (its manifest left unread)."""
        async with self._connection() as db:
            rows = await db.execute_fetchall(
                f"SELECT mappings_json FROM restore_plan WHERE {_KEY_WHERE}",  # noqa: S608
                key.as_params(),
            )
        for (mappings_json,) in rows:
            return read_mappings(mappings_json)
        raise _not_found(key)

    async def manifest_entry(self, key: RestoreKey, object_path: str) -> ManifestEntry | None:
        """The manifest's object at `object_path` and whether it is written, or None when the
        manifest of `key` lists no such path (one keyed lookup, whatever the manifest's size)."""
        async with self._connection() as db:
            rows = await db.execute_fetchall(
                "SELECT m.size, m.sha256, EXISTS (SELECT 1 FROM staged_object AS o "
                "WHERE o.cluster_id = m.cluster_id AND o.node_name = m.node_name "
                "AND o.restore_id = m.restore_id AND o.object_path = m.object_path) "
                "FROM manifest_object AS m WHERE m.cluster_id = :cluster_id "
                "AND m.node_name = :node_name AND m.restore_id = :restore_id "
                "AND m.object_path = :path",
                {**key.as_params(), "path": object_path},
            )
        return next((ManifestEntry(size, sha256, bool(w)) for size, sha256, w in rows), None)

    async def staging_complete(self, key: RestoreKey) -> bool:
        """Whether every manifest object of `key` is written with its manifest size and sha256
        (true for an empty manifest)."""
        async with self._connection() as db:
            rows = await db.execute_fetchall(
                "SELECT NOT EXISTS (SELECT 1 FROM manifest_object AS m "
                "WHERE m.cluster_id = :cluster_id AND m.node_name = :node_name "
                "AND m.restore_id = :restore_id AND NOT EXISTS (SELECT 1 FROM staged_object AS o "
                "WHERE o.cluster_id = m.cluster_id AND o.node_name = m.node_name "
                "AND o.restore_id = m.restore_id AND o.object_path = m.object_path "
                "AND o.size = m.size AND o.sha256 = m.sha256))",
                key.as_params(),
            )
        return bool(next(iter(rows))[0])

    async def list_unfinished(self) -> list[StoredState]:
        """States in an in-flight status (`restore_machine.IN_FLIGHT`), oldest change first."""
        marks = ", ".join("?" for _ in IN_FLIGHT)
        async with self._connection() as db:
            rows = await db.execute_fetchall(
                f"SELECT {_COLUMNS} FROM restore_state WHERE status IN ({marks}) "  # noqa: S608
                "ORDER BY updated_at, cluster_id, node_name, restore_id",
                sorted(IN_FLIGHT),
            )
        return [to_stored(row) for row in rows]

    # --- what an operator sees (agent/overview.py) ------------------------------------------

    async def list_states(self, limit: int = 500) -> list[StoredState]:
        """Up to `limit` node states, the most recently changed first."""
        async with self._connection() as db:
            rows = await db.execute_fetchall(
                f"SELECT {_COLUMNS} FROM restore_state "  # noqa: S608
                "ORDER BY updated_at DESC, cluster_id, node_name, restore_id LIMIT ?",
                (limit,),
            )
        return [to_stored(row) for row in rows]

    async def count_by_status(self) -> dict[str, int]:
        """How many node states each status has (statuses without any are left out)."""
        async with self._connection() as db:
            rows = await db.execute_fetchall(
                "SELECT status, COUNT(*) FROM restore_state GROUP BY status"
            )
        return {str(status): int(count) for status, count in rows}

    async def status_summary(self) -> StatusSummary:
        """Per status the row count and the oldest `updated_at`, of node states and relay jobs
        (the metrics' gauges: how many, and how long the oldest has not moved)."""
        async with self._connection() as db:
            restores = await db.execute_fetchall(
                "SELECT status, COUNT(*), MIN(updated_at) FROM restore_state GROUP BY status"
            )
            jobs = await db.execute_fetchall(
                "SELECT kind, status, COUNT(*), MIN(updated_at) FROM relay_job"
                " GROUP BY kind, status"
            )
        return StatusSummary(
            restores={str(status): (int(n), int(oldest)) for status, n, oldest in restores},
            jobs={(str(k), str(status)): (int(n), int(oldest)) for k, status, n, oldest in jobs},
            database_bytes=self.file_bytes(),
        )

    async def restore_facts(
        self, limit: int = 500, *, counted: Collection[str] = ()
    ) -> dict[tuple[str, str, str], tuple[int, int, int, int, int]]:
        """For the `limit` most recently changed node states (`list_states`' rows): (resource
        mappings, manifest objects, manifest bytes) of the plan and, for states in a `counted`
        status only, (accepted chunk bytes, objects marked written) of the staging, else 0s:
        counting staging rows costs a pass over them, worth it only while they grow."""
        marks = ", ".join("?" for _ in counted) or "NULL"
        chunks, objects = _SAME_KEY.format(t="c"), _SAME_KEY.format(t="o")
        async with self._connection() as db:
            rows = await db.execute_fetchall(
                "SELECT s.cluster_id, s.node_name, s.restore_id, "  # noqa: S608
                "COALESCE(p.mapping_count, 0), COALESCE(p.object_count, 0), "
                "COALESCE(p.manifest_bytes, 0), "
                f"CASE WHEN s.status IN ({marks}) THEN (SELECT COALESCE(SUM(c.length), 0) "
                f"FROM staged_chunk AS c WHERE {chunks}) ELSE 0 END, "
                f"CASE WHEN s.status IN ({marks}) THEN (SELECT COUNT(*) "
                f"FROM staged_object AS o WHERE {objects}) ELSE 0 END "
                "FROM restore_state AS s LEFT JOIN restore_plan AS p "
                f"ON {_SAME_KEY.format(t='p')} "
                "ORDER BY s.updated_at DESC, s.cluster_id, s.node_name, s.restore_id LIMIT ?",
                [*counted, *counted, limit],
            )
        return {
            (str(c), str(n), str(r)): (int(maps), int(objs), int(total), int(staged), int(done))
            for c, n, r, maps, objs, total, staged, done in rows
        }

    # --- resumable staging (private progress: no revision change) ----------------------------

    async def record_chunk(
        self, key: RestoreKey, object_path: str, offset: int, length: int, sha256: str
    ) -> None:
        """Remember that Corestore accepted `length` bytes of `object_path` at `offset`.

        Recording the same offset again replaces the record (the later write is what Corestore
        holds). `RestoreNotFound` when no state exists under `key`.
        """
        check_path(object_path)
        check_count("offset", offset, minimum=0)
        check_count("length", length, minimum=1)
        check_sha256(sha256)
        async with self._connection(write=True) as db, _missing_state_is_not_found(key):
            await db.execute_fetchall(
                "INSERT INTO staged_chunk (cluster_id, node_name, restore_id, object_path, "
                "chunk_offset, length, sha256) VALUES (:cluster_id, :node_name, :restore_id, "
                ":path, :offset, :length, :sha256) "
                "ON CONFLICT (cluster_id, node_name, restore_id, object_path, chunk_offset) "
                "DO UPDATE SET length = excluded.length, sha256 = excluded.sha256",
                {
                    **key.as_params(),
                    "path": object_path,
                    "offset": offset,
                    "length": length,
                    "sha256": sha256,
                },
            )
        self._observer.chunk_recorded(length=length)

    async def verified_chunks(self, key: RestoreKey, object_path: str) -> list[ChunkRecord]:
        """The recorded chunks of `object_path`, by offset."""
        async with self._connection() as db:
            rows = await db.execute_fetchall(
                "SELECT object_path, chunk_offset, length, sha256 FROM staged_chunk "  # noqa: S608
                f"WHERE {_KEY_WHERE} AND object_path = :path ORDER BY chunk_offset",
                {**key.as_params(), "path": object_path},
            )
        return [ChunkRecord(*row) for row in rows]

    async def mark_object_written(
        self, key: RestoreKey, object_path: str, size: int, sha256: str
    ) -> None:
        """Remember that `object_path` is complete with `size` bytes hashing to `sha256`."""
        check_path(object_path)
        check_count("size", size, minimum=0)
        check_sha256(sha256)
        async with self._connection(write=True) as db, _missing_state_is_not_found(key):
            await db.execute_fetchall(
                "INSERT INTO staged_object (cluster_id, node_name, restore_id, object_path, "
                "size, sha256, written_at) VALUES (:cluster_id, :node_name, :restore_id, :path, "
                ":size, :sha256, :now) "
                "ON CONFLICT (cluster_id, node_name, restore_id, object_path) DO UPDATE SET "
                "size = excluded.size, sha256 = excluded.sha256, written_at = excluded.written_at",
                {
                    **key.as_params(),
                    "path": object_path,
                    "size": size,
                    "sha256": sha256,
                    "now": self._now_ms(),
                },
            )
        self._observer.object_written(size=size)

    async def written_objects(self, key: RestoreKey) -> list[ObjectRecord]:
        """The objects marked written under `key`, by path."""
        async with self._connection() as db:
            rows = await db.execute_fetchall(
                "SELECT object_path, size, sha256, written_at FROM staged_object "  # noqa: S608
                f"WHERE {_KEY_WHERE} ORDER BY object_path",
                key.as_params(),
            )
        return [ObjectRecord(*row) for row in rows]

    async def forget_object(self, key: RestoreKey, object_path: str) -> None:
        """Drop the chunks and the written mark of `object_path` (one transaction)."""
        params = {**key.as_params(), "path": object_path}
        async with self._transaction() as db:
            await db.execute_fetchall(
                f"DELETE FROM staged_object WHERE {_KEY_WHERE} AND object_path = :path",  # noqa: S608
                params,
            )
            await db.execute_fetchall(
                f"DELETE FROM staged_chunk WHERE {_KEY_WHERE} AND object_path = :path",  # noqa: S608
                params,
            )

    # --- relay jobs (agent.relay; the SQL lives in job_table.py) --------------------------------

    async def get_job(self, key: JobKey) -> StoredJob | None:
        """The relay job stored under `key`, or None."""
        async with self._connection() as db:
            return await job_table.get_job(db, key)

    async def list_jobs(self, status: JobStatus | None = None) -> list[StoredJob]:
        """Every relay job (or those in `status`), oldest change first."""
        async with self._connection() as db:
            return await job_table.list_jobs(db, status)

    async def running_restore(
        self, cluster_id: str, node_id: str, service_id: str
    ) -> StoredJob | None:
        """The restore of `service_id` on `node_id` the store holds as `running`, or None."""
        async with self._connection() as db:
            return await job_table.running_restore(db, cluster_id, node_id, service_id)

    async def last_restore(
        self, cluster_id: str, node_id: str, service_id: str
    ) -> StoredJob | None:
        """The last restore run of `service_id` on `node_id` (the highest run), or None."""
        async with self._connection() as db:
            return await job_table.last_restore(db, cluster_id, node_id, service_id)

    async def mark_delivered(self, key: JobKey, *, revision: int) -> bool:
        """Record that the answer of the job at `revision` reached Cloudly (False: the job
        moved on since, or it was recorded already)."""
        async with self._connection(write=True) as db:
            return await job_table.mark_delivered(db, key, revision=revision, now=self._now_ms())

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
        if not is_sha256(digest):
            raise InvalidState("a job digest must be 64 lower-case hex characters")
        async with self._connection(write=True) as db:
            return await job_table.move_job(
                db,
                key,
                op=op,
                expected_revision=expected_revision,
                digest=digest,
                now=self._now_ms(),
                result=result,
                plan=plan,
            )

    # --- retention (agent/store/retention.py runs it; the SQL is forgetting.py's) ------------

    async def forget_expired(self, cutoff_ms: int, *, rows: int) -> forgetting.ForgetStep:
        """One bounded step of forgetting what finished before `cutoff_ms` (at most about
        `rows` rows, one transaction): `forgetting.forget_step`."""
        check_count("rows", rows, minimum=1)
        with self._writing_state(None):
            async with self._connection(write=True) as db:
                return await forgetting.forget_step(db, cutoff_ms=cutoff_ms, rows=rows)

    async def vacuum(self, *, pages: int) -> int:
        """Give up to `pages` free pages back to the file system; the bytes freed."""
        check_count("pages", pages, minimum=1)
        async with self._connection() as db:
            freed = await forgetting.vacuum_step(db, pages=pages)
            return freed * await forgetting.page_size(db) if freed else 0

    async def checkpoint(self) -> None:
        """Move the WAL into the database file; truncate the WAL."""
        async with self._connection() as db:
            await forgetting.checkpoint(db)

    def file_bytes(self) -> int:
        """The database's files on disk now: the database and its WAL, in bytes."""
        return database_bytes(self._path)

    # --- plumbing ---------------------------------------------------------------------------

    def _now_ms(self) -> int:
        return epoch_ms(self._clock)

    @asynccontextmanager
    async def _connection(self, *, write: bool = False) -> AsyncIterator[aiosqlite.Connection]:
        """The connection, exclusively; sqlite3 failures become `StoreError` (a write the disk
        refused: `StateUnwritable`, remembered). `write`: the block writes, so a block that
        changed rows proves the disk takes writes again."""
        async with self._lock:
            db = self._db
            if db is None:
                raise StoreError("the revision store is closed")
            before = db.total_changes
            try:
                # A call cancelled inside a transaction may have left it open: close it before
                # anything else runs on this connection.
                if db.in_transaction:
                    await db.rollback()
                yield db
            except sqlite3.Error as exc:
                error = store_error(exc, "state database operation failed", self._path.parent)
                if isinstance(error, StateUnwritable):
                    self._refused(error)
                raise error from exc
            if write and db.total_changes != before:
                self._wrote()

    @asynccontextmanager
    async def _reading(self) -> AsyncIterator[aiosqlite.Connection]:
        """The reader connection (the writer's without one), without the writer's lock: one
        autocommit read sees every committed write; sqlite3 failures become `StoreError`."""
        if self._reader is None:
            async with self._connection() as db:
                yield db
            return
        if self._db is None:
            raise StoreError("the revision store is closed")
        try:
            yield self._reader
        except sqlite3.Error as exc:
            raise store_error(exc, "state database read failed", self._path.parent) from exc
        except ValueError as exc:  # aiosqlite's word for a connection closed meanwhile
            if self._reader is None:
                raise StoreError("the revision store is closed") from exc
            raise

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[aiosqlite.Connection]:
        """`_connection()` inside `BEGIN IMMEDIATE ... COMMIT`, rolled back on any exception."""
        async with self._connection(write=True) as db:
            await db.execute_fetchall("BEGIN IMMEDIATE")
            try:
                yield db
                await db.execute_fetchall("COMMIT")
            except BaseException:
                await db.rollback()
                raise


async def _create(
    db: aiosqlite.Connection, key: RestoreKey, params: dict[str, Any], plan: EncodedPlan
) -> list[sqlite3.Row]:
    """The new state row with its plan and manifest rows, in one transaction; no row when the
    key exists already (nothing is written then)."""
    await db.execute_fetchall("BEGIN IMMEDIATE")
    try:
        rows = list(await db.execute_fetchall(_INSERT, params))
        if rows:
            await db.execute_fetchall(
                _INSERT_PLAN,
                {
                    **key.as_params(),
                    "mappings_json": plan.mappings_json,
                    "manifest_json": plan.manifest_json,
                    "mapping_count": plan.mapping_count,
                    "object_count": plan.object_count,
                    "manifest_bytes": plan.manifest_bytes,
                },
            )
            routing = (key.cluster_id, key.node_name, key.restore_id)
            cursor = await db.executemany(_INSERT_OBJECT, [(*routing, *o) for o in plan.objects])
            await cursor.close()
        await db.execute_fetchall("COMMIT")
    except BaseException:
        await db.rollback()
        raise
    return rows


def _not_found(key: RestoreKey) -> RestoreNotFound:
    return RestoreNotFound(
        f"no isolated-restore state for restore {key.restore_id} on node {key.node_name} of "
        f"cluster {key.cluster_id}"
    )


def _free_bytes(directory: Path) -> int | None:
    try:
        return shutil.disk_usage(directory).free
    except OSError:
        return None


def _has_content(path: Path) -> bool:
    try:
        return path.stat().st_size > 0
    except OSError:
        return False


@asynccontextmanager
async def _missing_state_is_not_found(key: RestoreKey) -> AsyncIterator[None]:
    """Turn the foreign-key failure of a progress row without a state into `RestoreNotFound`."""
    try:
        yield
    except sqlite3.IntegrityError as exc:
        if exc.sqlite_errorcode == _FOREIGN_KEY:
            raise _not_found(key) from exc
        raise
