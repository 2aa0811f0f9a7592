"""`Database`: the revision store's connections, their lock, and SQLite's failures translated.

Every facet of the store (`node_states.py`, `plans.py`, `staging.py`, `relay_jobs.py`,
`reports.py`, `upkeep.py`) asks its connection here and nowhere else; `RevisionStore`
(`store.py`) makes one and hands it to each.

One connection writes; an asyncio lock gives each call the connection alone
(`connection()`), so a multi-statement transaction (`transaction()`) never interleaves with
another call's statements. A second, read-only connection answers the node state's read
(`reading()`, without the lock): in WAL mode it sees every committed write and waits for none,
so a status never queues behind staging's chunk records. Every sqlite3 failure becomes
`StoreError` (chained); a closed store's calls raise it too.

A disk that refuses a write (full, read-only, failing: `faults.py`) makes the call raise
`StateUnwritable` (wire code `state-unwritable`, retryable) instead of `StoreError`. The
database remembers it (`write_fault`), logs it once at error with its cause
(`state_database_unwritable`) and tells its observer (`state_write_failed`); the next write
that commits, or a `probe_write()` that gets through, clears it (`state_database_writable`,
`state_writable`). Reads go on meanwhile: in WAL mode they need no room.
"""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiosqlite
import structlog

from agent.clock import Clock, epoch_ms
from agent.errors import StateUnwritable, StoreError
from agent.observe import NULL_OBSERVER, StoreObserver
from agent.store.faults import store_error

__all__ = ["Database"]

_log = structlog.get_logger("agent.store")


class Database:
    """The writer and reader connections of one state database, shared by the store's facets."""

    def __init__(
        self,
        db: aiosqlite.Connection,
        path: Path,
        clock: Clock,
        *,
        observer: StoreObserver = NULL_OBSERVER,
        reader: aiosqlite.Connection | None = None,
    ) -> None:
        """`db` writes (and reads); `reader` answers `reading()` (None: `db` does)."""
        self._db: aiosqlite.Connection | None = db
        self._reader = reader
        self._lock = asyncio.Lock()
        self._fault: StateUnwritable | None = None
        self.path = path
        """The database file."""
        self.clock = clock
        """Whose wall time stamps every write (`now_ms()`)."""
        self.observer = observer

    @property
    def is_open(self) -> bool:
        """Whether calls can be made (False once `aclose()` began)."""
        return self._db is not None

    @property
    def write_fault(self) -> StateUnwritable | None:
        """The disk's last refusal of a write, until a write gets through again (None: the
        last write committed)."""
        return self._fault

    def now_ms(self) -> int:
        """The clock's wall time, in epoch milliseconds: what a write stamps."""
        return epoch_ms(self.clock)

    async def probe_write(self) -> bool:
        """One small real write (the header's `user_version`, rewritten as it is, through the
        WAL): True when it committed, which clears `write_fault`."""
        try:
            async with self.connection(write=True) as db:
                rows = list(await db.execute_fetchall("PRAGMA user_version"))
                await db.execute_fetchall(f"PRAGMA user_version = {int(rows[0][0])}")
        except StateUnwritable:
            return False
        self._wrote()
        return True

    async def aclose(self) -> None:
        """Close both connections (idempotent); later calls raise `StoreError`."""
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

    @asynccontextmanager
    async def connection(self, *, write: bool = False) -> AsyncIterator[aiosqlite.Connection]:
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
                error = store_error(exc, "state database operation failed", self.path.parent)
                if isinstance(error, StateUnwritable):
                    self._refused(error)
                raise error from exc
            if write and db.total_changes != before:
                self._wrote()

    @asynccontextmanager
    async def reading(self) -> AsyncIterator[aiosqlite.Connection]:
        """The reader connection (the writer's without one), without the writer's lock: one
        autocommit read sees every committed write; sqlite3 failures become `StoreError`."""
        if self._reader is None:
            async with self.connection() as db:
                yield db
            return
        if self._db is None:
            raise StoreError("the revision store is closed")
        try:
            yield self._reader
        except sqlite3.Error as exc:
            raise store_error(exc, "state database read failed", self.path.parent) from exc
        except ValueError as exc:  # aiosqlite's word for a connection closed meanwhile
            if self._reader is None:
                raise StoreError("the revision store is closed") from exc
            raise

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[aiosqlite.Connection]:
        """`connection()` inside `BEGIN IMMEDIATE ... COMMIT`, rolled back on any exception."""
        async with self.connection(write=True) as db:
            await db.execute_fetchall("BEGIN IMMEDIATE")
            try:
                yield db
                await db.execute_fetchall("COMMIT")
            except BaseException:
                await db.rollback()
                raise

    def _refused(self, exc: StateUnwritable) -> None:
        """Remember and report a write the disk refused (logged at error once per cause)."""
        if self._fault is None or self._fault.cause != exc.cause:
            _log.error(
                "state_database_unwritable",
                path=str(self.path),
                cause=exc.cause,
                error=str(exc),
                free_bytes=_free_bytes(self.path.parent),
                hint="make room on (or remount read-write) the file system of the state "
                "directory; the agent is not ready meanwhile, answers state-unwritable "
                "(retryable) and takes writes again by itself",
            )
        self._fault = exc
        self.observer.state_write_failed(cause=exc.cause)

    def _wrote(self) -> None:
        """A write committed: a remembered refusal is over."""
        if self._fault is not None:
            _log.info("state_database_writable", path=str(self.path), cause=self._fault.cause)
            self._fault = None
            self.observer.state_writable()


def _free_bytes(directory: Path) -> int | None:
    try:
        return shutil.disk_usage(directory).free
    except OSError:
        return None
