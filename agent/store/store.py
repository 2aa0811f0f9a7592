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
moved aside to `<name>.corrupt-<UTC timestamp>` (with its `-wal`/`-shm`), logged, and reported
by raising `StoreCorrupt` (carrying `movedTo`); it is never reused. The caller decides what
follows: calling `open()` again starts from an empty database, which forgets every restore in
flight — an operator must know, hence the raise rather than a flag that is easy to ignore.

What it stores: the node state (`IsolatedRestoreNodeState`, the frozen contract model) and the
engine's `PreparedPlan`, as JSON written and read only by `codec.py`. Never persisted: a grant.
The store refuses a state or plan that is or holds a `Secret`, or carries a `restoreGrant` field
or key at any depth. Every sqlite3 failure becomes `StoreError`
(chained). One connection writes; an asyncio lock gives each call the connection alone, so
a multi-statement transaction never interleaves with another call's statements. A second,
read-only connection answers `get()` (a status request's read): in WAL mode it sees every
committed write and waits for none, so a status never queues behind staging's chunk records.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, Final

import aiosqlite

from agent.clock import SYSTEM_CLOCK, Clock, epoch_ms
from agent.contracts.isolatedrestore import IsolatedRestoreNodeState
from agent.domain.job_machine import JobOp, JobStatus
from agent.domain.jobs import JobKey, StoredJob
from agent.domain.restore_machine import IN_FLIGHT, RESTORE_TABLE, Op
from agent.domain.restores import PreparedPlan, RestoreKey, StoredState
from agent.errors import (
    AgentError,
    IllegalTransition,
    InvalidState,
    RestoreNotFound,
    RevisionConflict,
    StoreError,
)
from agent.observe import NULL_OBSERVER, StoreObserver
from agent.store import job_table
from agent.store.codec import (
    check_count,
    check_path,
    check_sha256,
    encode_plan,
    encode_state,
    is_sha256,
    to_stored,
)
from agent.store.records import ChunkRecord, ObjectRecord, StatusSummary
from agent.store.startup import open_database, open_reader
from agent.store.transitions import status_moves

__all__ = ["DB_NAME", "RevisionStore"]

DB_NAME: Final = "state.sqlite3"

_FOREIGN_KEY: Final = 787  # SQLITE_CONSTRAINT_FOREIGNKEY

_KEY_WHERE: Final = (
    "cluster_id = :cluster_id AND node_name = :node_name AND restore_id = :restore_id"
)
_COLUMNS: Final = (
    "cluster_id, node_name, restore_id, revision, status, state_json, private_json, "
    "mutation_digest, updated_at"
)
_INSERT: Final = f"""
INSERT INTO restore_state ({_COLUMNS})
VALUES (:cluster_id, :node_name, :restore_id, 1, :to_status, :state_json,
        COALESCE(:private_json, '{{}}'), :digest, :now)
ON CONFLICT (cluster_id, node_name, restore_id) DO NOTHING
RETURNING {_COLUMNS}
"""  # noqa: S608  # placeholders only; column names are constants


def _update_statement(op: Op) -> tuple[str, dict[str, str]] | None:
    """The CAS `UPDATE` for `op`, its status CASE and IN list built from the table."""
    moves = status_moves(RESTORE_TABLE, op)
    if moves is None:
        return None
    sql = f"""
UPDATE restore_state
SET revision = revision + 1,
    status = {moves.case},
    state_json = :state_json,
    private_json = COALESCE(:private_json, private_json),
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
        db = await open_database(path, busy_timeout=busy_timeout, clock=clock)
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
        """The state stored under `key`, or None (revision 0); read on the reader connection,
        waiting for no write."""
        async with self._reading() as db:
            rows = await db.execute_fetchall(
                f"SELECT {_COLUMNS} FROM restore_state WHERE {_KEY_WHERE}",  # noqa: S608
                key.as_params(),
            )
        return next((to_stored(row) for row in rows), None)

    async def mutate(
        self,
        key: RestoreKey,
        *,
        expected_revision: int,
        op: Op,
        state: IsolatedRestoreNodeState,
        plan: PreparedPlan | None = None,
        request_digest: str | None = None,
    ) -> StoredState:
        """Apply `op` at `expected_revision`: one transaction, revision + 1, or nothing at all.

        `state` is the whole node state; the store owns `restoreId`, `clusterId`,
        `targetNodeName` (must match `key`), `revision`, `status` (the table decides it from
        `op`) and `updatedAt`, whatever `state` says. `plan` is the engine's `PreparedPlan`:
        required when the state is created (revision 0), None afterwards keeps it.
        `request_digest` is given for a Cloudly request and None for the engine's own progress,
        which keeps the digest of the request it follows.

        Raises `RevisionConflict` (revision not current), `IllegalTransition` (revision current,
        `op` illegal in its status), `InvalidState` (a bug: a secret, a foreign key, no plan for
        a new state), `StoreError` (SQLite failed).
        """
        if isinstance(expected_revision, bool) or not isinstance(expected_revision, int):
            raise InvalidState("expected_revision must be an int")
        if request_digest is not None and not is_sha256(request_digest):
            raise InvalidState("request_digest must be 64 lower-case hex characters")
        creates = expected_revision == 0 and RESTORE_TABLE.sources(op).get(None) is not None
        if creates and plan is None:
            raise InvalidState("a new node state needs its plan")
        params: dict[str, Any] = {
            **key.as_params(),
            "expected": expected_revision,
            "state_json": encode_state(key, state),
            "private_json": None if plan is None else encode_plan(plan),
            "digest": request_digest,
            "now": self._now_ms(),
        }
        started = self._clock.monotonic()
        try:
            stored = await self._mutate(op, key, params, expected_revision)
        except AgentError as exc:
            self._observe_mutation(op, exc.code, started)
            raise
        self._observe_mutation(op, "ok", started)
        return stored

    def _observe_mutation(self, op: Op, outcome: str, started: float) -> None:
        seconds = self._clock.monotonic() - started
        self._observer.store_mutation(op=op.value, outcome=outcome, seconds=seconds)

    async def _mutate(
        self, op: Op, key: RestoreKey, params: dict[str, Any], expected_revision: int
    ) -> StoredState:
        update = _UPDATES.get(op)
        async with self._connection() as db:
            rows: Iterable[sqlite3.Row] = ()
            insert_to = RESTORE_TABLE.sources(op).get(None)
            if expected_revision == 0 and insert_to is not None:
                rows = await db.execute_fetchall(_INSERT, {**params, "to_status": insert_to})
            elif expected_revision > 0 and update is not None:
                sql, status_params = update
                rows = await db.execute_fetchall(sql, {**params, **status_params})
            for row in rows:
                return to_stored(row)
            current = await db.execute_fetchall(
                f"SELECT revision, status FROM restore_state WHERE {_KEY_WHERE}",  # noqa: S608
                key.as_params(),
            )
        revision, status = next(iter(current), (0, None))
        if revision != expected_revision:
            raise RevisionConflict(expected=expected_revision, current=revision, status=status)
        raise IllegalTransition(operation=op.value, status=status, current=revision)

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
        )

    async def staging_totals(self) -> dict[tuple[str, str, str], tuple[int, int]]:
        """Per key with staging records: (accepted chunk bytes, objects marked written)."""
        async with self._connection() as db:
            rows = await db.execute_fetchall(
                "SELECT cluster_id, node_name, restore_id, SUM(chunk_bytes), SUM(objects) FROM ("
                " SELECT cluster_id, node_name, restore_id, length AS chunk_bytes, 0 AS objects"
                " FROM staged_chunk UNION ALL"
                " SELECT cluster_id, node_name, restore_id, 0, 1 FROM staged_object"
                ") GROUP BY cluster_id, node_name, restore_id"
            )
        return {(str(c), str(n), str(r)): (int(b), int(o)) for c, n, r, b, o in rows}

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
        async with self._connection() as db, _missing_state_is_not_found(key):
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
        async with self._connection() as db, _missing_state_is_not_found(key):
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

    async def move_job(
        self,
        key: JobKey,
        *,
        op: JobOp,
        expected_revision: int,
        digest: str,
        result: dict[str, Any] | None = None,
    ) -> StoredJob:
        """Apply `op` to the relay job at `expected_revision` (one transaction), or raise
        `RevisionConflict`/`IllegalTransition` and change nothing."""
        if not is_sha256(digest):
            raise InvalidState("a job digest must be 64 lower-case hex characters")
        async with self._connection() as db:
            return await job_table.move_job(
                db,
                key,
                op=op,
                expected_revision=expected_revision,
                digest=digest,
                now=self._now_ms(),
                result=result,
            )

    # --- plumbing ---------------------------------------------------------------------------

    def _now_ms(self) -> int:
        return epoch_ms(self._clock)

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[aiosqlite.Connection]:
        """The connection, exclusively; sqlite3 failures become `StoreError`."""
        async with self._lock:
            db = self._db
            if db is None:
                raise StoreError("the revision store is closed")
            try:
                # A call cancelled inside a transaction may have left it open: close it before
                # anything else runs on this connection.
                if db.in_transaction:
                    await db.rollback()
                yield db
            except sqlite3.Error as exc:
                raise StoreError(f"state database operation failed: {exc}") from exc

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
            raise StoreError(f"state database operation failed: {exc}") from exc
        except ValueError as exc:  # aiosqlite's word for a connection closed meanwhile
            if self._reader is None:
                raise StoreError("the revision store is closed") from exc
            raise

    @asynccontextmanager
    async def _transaction(self) -> AsyncIterator[aiosqlite.Connection]:
        """`_connection()` inside `BEGIN IMMEDIATE ... COMMIT`, rolled back on any exception."""
        async with self._connection() as db:
            await db.execute_fetchall("BEGIN IMMEDIATE")
            try:
                yield db
                await db.execute_fetchall("COMMIT")
            except BaseException:
                await db.rollback()
                raise


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
            raise RestoreNotFound(
                f"no isolated-restore state for restore {key.restore_id} on node "
                f"{key.node_name} of cluster {key.cluster_id}"
            ) from exc
        raise
