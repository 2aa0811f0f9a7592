"""Opening the state database: private files, integrity check, pragmas, migrations.

`open_database()` is the only way a connection is made. It runs `PRAGMA integrity_check`
*before* anything else touches the file. A damaged database (integrity problems, or SQLite
calling it corrupt / not a database) is closed and left exactly where it is, and
`StoreCorrupt` is raised: start-up is refused (exit 65) at every start until an operator
salvages or resets the state (`restore-agent state salvage|reset`, `agent/store/salvage.py`),
so the agent never starts on an empty state because the old one was damaged. A database an
earlier agent version moved aside (`<name>.corrupt-<UTC timestamp>`) with nothing in its place
is refused the same way. A database a newer agent migrated is refused with `StoreNewer` (exit
2) naming both schema versions. A disk that refuses the writes of opening (full, read-only,
failing) raises `StateUnwritable` (`faults.py`); the composition root waits for it and tries
again. Any other lock or I/O error is `StoreError`, and the file stays where it is.

Before a migration changes an existing database, a copy of it is taken beside it
(`<name>.schema-<version>-<UTC timestamp>`, `VACUUM INTO`: one consistent file, 0600): the way
back to the agent that wrote it, which refuses the migrated file (docs/operations.md,
"Upgrading and rolling back"). A copy the disk has no room for is `StateUnwritable` and nothing
is migrated (the agent waits, not ready, as for any full disk): the first start of an upgrade
that migrates needs the database's size free, and its `VACUUM` below as much again.

The file gives freed pages back (`auto_vacuum = INCREMENTAL`; retention then runs `PRAGMA
incremental_vacuum`, `forgetting.py`). A new database is made so from its first page. A database
an older agent made is not (the mode of an existing file changes only by rewriting it): it is
rewritten once by `VACUUM`, right after the migrations committed and before anything else uses
the connection, so no transaction is open and nothing of the agent waits on it. `VACUUM` is one
atomic write (killed half-way, the file is the old one, still in the old mode), but it needs
room for a second copy of the database: with less than twice the files' size free beside it,
it is not tried (`state_database_vacuum_skipped`), and when it fails
(`state_database_vacuum_failed`) the agent starts all the same. Either way the file works as
before: SQLite reuses the pages retention frees, so the file stops growing, it only does not
shrink; the next start tries again.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Final

import aiosqlite
import structlog

from agent.clock import Clock, epoch_ms
from agent.errors import StoreCorrupt, StoreError, StoreNewer
from agent.observe import NULL_OBSERVER, StoreObserver
from agent.store.faults import store_error
from agent.store.files import (
    database_bytes,
    ensure_private_directory,
    ensure_private_file,
    moved_aside,
)
from agent.store.schema import MIGRATIONS, VERSION_TABLE, split_statements

__all__ = ["SALVAGE_HINT", "copy_name", "open_database"]

SALVAGE_HINT: Final = (
    "stop the agent and run `restore-agent state salvage --config PATH` (recovers every row "
    "SQLite can still read into a new database, keeps the damaged file) or, to start empty on "
    "purpose, `restore-agent state reset --config PATH --start-empty`"
)

_log = structlog.get_logger(__name__)

_MIN_SQLITE: Final = (3, 35, 0)  # RETURNING
_CORRUPT_CODES: Final = frozenset({11, 26})  # SQLITE_CORRUPT, SQLITE_NOTADB (primary codes)
_INCREMENTAL: Final = 2  # PRAGMA auto_vacuum's INCREMENTAL


def _free_bytes(directory: Path) -> int:
    return shutil.disk_usage(directory).free


def quiet_sqlite_logger() -> logging.Logger:
    """aiosqlite's stdlib logger, kept at INFO or above: at DEBUG it logs every call with its
    SQL and parameters, which carry whole node states and manifests (up to kilobytes a line)."""
    logger = logging.getLogger("aiosqlite")
    if logger.level < logging.INFO:  # NOTSET (0) would inherit a DEBUG root
        logger.setLevel(logging.INFO)
    return logger


async def open_database(
    path: Path,
    *,
    busy_timeout: float,
    clock: Clock,
    migrations: Sequence[str] = MIGRATIONS,
    free_bytes: Callable[[Path], int] = _free_bytes,
    observer: StoreObserver = NULL_OBSERVER,
) -> aiosqlite.Connection:
    """A checked, configured, migrated autocommit connection to `path` (created if missing),
    in `auto_vacuum = INCREMENTAL` unless the one `VACUUM` that switches an older file could
    not run (module docstring).

    `migrations` is injectable so tests can prove the upgrade path; production uses
    `schema.MIGRATIONS`. `free_bytes(directory)` is the room left beside the file.
    `observer` hears a `VACUUM` that was skipped or failed.
    """
    directory = path.parent
    if sqlite3.sqlite_version_info < _MIN_SQLITE:
        raise StoreError(f"SQLite {sqlite3.sqlite_version} is older than 3.35 (RETURNING)")
    _refuse_a_replaced_database(path)
    try:
        ensure_private_directory(directory)
        ensure_private_file(path)
    except OSError as exc:
        raise store_error(exc, f"cannot prepare the state database {path}", directory) from exc
    quiet_sqlite_logger()
    db = await _connect(path, busy_timeout)
    async with _closed_on_failure(db, path):
        problem = await _integrity_problem(db)
        if problem is not None:
            await db.close()
            raise _damaged(path, problem)
        await _configure(db, path)
        await _migrate(db, path, migrations, epoch_ms(clock))
        vacuum = await _switch_to_incremental_vacuum(db, path, free_bytes, clock)
        if vacuum is not None:
            observer.vacuum_failed(reason=vacuum)
    return db


async def open_reader(path: Path, *, busy_timeout: float) -> aiosqlite.Connection:
    """A second, read-only connection to the checked and migrated database at `path`: in WAL
    mode its reads wait for no write, so the store answers them without queueing behind the
    writer's (staging records one row per chunk, each fsync'd)."""
    db = await _connect(path, busy_timeout)
    async with _closed_on_failure(db, path):
        await db.execute_fetchall("PRAGMA query_only = ON")
    return db


async def _connect(path: Path, busy_timeout: float) -> aiosqlite.Connection:
    """An autocommit connection to `path` that waits up to `busy_timeout` s for a lock."""
    try:
        db = await aiosqlite.connect(path, isolation_level=None)
    except sqlite3.Error as exc:
        raise store_error(exc, f"cannot open the state database {path}", path.parent) from exc
    async with _closed_on_failure(db, path):
        await db.execute_fetchall(f"PRAGMA busy_timeout = {round(busy_timeout * 1000)}")
    return db


@contextlib.asynccontextmanager
async def _closed_on_failure(db: aiosqlite.Connection, path: Path) -> AsyncIterator[None]:
    """Close `db` if the block fails (cancellation too); SQLite's errors become `StoreError`
    (`StateUnwritable` for a disk that refused a write)."""
    try:
        yield
    except sqlite3.Error as exc:
        await db.close()
        raise store_error(exc, f"cannot open the state database {path}", path.parent) from exc
    except BaseException:
        await db.close()
        raise


async def _integrity_problem(db: aiosqlite.Connection) -> str | None:
    """None when `PRAGMA integrity_check` says ok, else what it (or SQLite) reported."""
    try:
        rows = [str(row[0]) for row in await db.execute_fetchall("PRAGMA integrity_check")]
    except sqlite3.DatabaseError as exc:
        if exc.sqlite_errorcode & 0xFF in _CORRUPT_CODES:
            return exc.sqlite_errorname
        raise
    return None if rows == ["ok"] else "; ".join(rows[:3])


def _damaged(path: Path, problem: str) -> StoreCorrupt:
    """The refusal of a damaged `path`, which stays where it is."""
    return StoreCorrupt(
        f"the state database {path} is damaged ({problem}); the agent does not start on an "
        f"empty state in its place: {SALVAGE_HINT}",
        path=str(path),
        problem=problem,
    )


def _refuse_a_replaced_database(path: Path) -> None:
    """`StoreCorrupt` when `path` holds nothing but an earlier agent moved a damaged database
    aside beside it (it then started empty; this one does not)."""
    try:
        empty = path.stat().st_size == 0
    except FileNotFoundError:
        empty = True
    except OSError:
        return  # open_database's own steps report it
    aside = moved_aside(path) if empty else []
    if aside:
        raise StoreCorrupt(
            f"the state database {path} was moved aside as damaged to {aside[-1].name} by an "
            f"earlier start, and nothing replaced it on purpose: {SALVAGE_HINT}",
            path=str(aside[-1]),
            problem="moved aside by an earlier start",
        )


async def _configure(db: aiosqlite.Connection, path: Path) -> None:
    """Incremental vacuum (takes effect on a new file, before its first table), WAL
    (persistent in the file), FULL sync and foreign keys (per connection)."""
    await db.execute_fetchall("PRAGMA auto_vacuum = INCREMENTAL")
    rows = list(await db.execute_fetchall("PRAGMA journal_mode = WAL"))
    if rows[0][0] != "wal":
        raise StoreError(f"the state database {path} cannot use WAL mode ({rows[0][0]})")
    await db.execute_fetchall("PRAGMA synchronous = FULL")
    await db.execute_fetchall("PRAGMA foreign_keys = ON")


async def _switch_to_incremental_vacuum(
    db: aiosqlite.Connection, path: Path, free_bytes: Callable[[Path], int], clock: Clock
) -> str | None:
    """Rewrite an older file once into `auto_vacuum = INCREMENTAL` (module docstring); None
    when it is so, else `skipped` or `failed`."""
    rows = list(await db.execute_fetchall("PRAGMA auto_vacuum"))
    if int(rows[0][0]) == _INCREMENTAL:
        return None
    before = database_bytes(path)
    free = free_bytes(path.parent)
    if free < 2 * before:
        _log.warning(
            "state_database_vacuum_skipped",
            path=str(path),
            database_bytes=before,
            free_bytes=free,
            hint="the file keeps its size (freed pages are reused); the next start tries again",
        )
        return "skipped"
    started = clock.monotonic()
    try:
        await db.execute_fetchall("PRAGMA auto_vacuum = INCREMENTAL")
        await db.execute_fetchall("VACUUM")
    except sqlite3.Error as exc:
        _log.warning(
            "state_database_vacuum_failed",
            path=str(path),
            error=str(exc),
            hint="the file keeps its size (freed pages are reused); the next start tries again",
        )
        return "failed"
    _log.info(
        "state_database_vacuumed",
        path=str(path),
        bytes_before=before,
        bytes_after=database_bytes(path),
        seconds=round(clock.monotonic() - started, 3),
    )
    return None


def _check_schema_version(current: int, known: int) -> None:
    if current > known:
        raise StoreNewer(
            f"the state database has schema version {current}, newer than this agent's "
            f"{known}: a newer agent migrated it; install that newer agent again (the version "
            "that wrote it) rather than this one, the database is left as it is",
            found=current,
            known=known,
        )


def copy_name(name: str, version: int, now_ms: int) -> str:
    """The name of the copy taken of database `name` at schema `version` before a migration."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now_ms / 1000))
    return f"{name}.schema-{version}-{stamp}"


async def _copy_before_migrating(
    db: aiosqlite.Connection, path: Path, current: int, latest: int, now_ms: int
) -> Path | None:
    """A copy of an existing database at schema `current` that the migrations up to `latest`
    are about to change (None: nothing to migrate, or a new database). One agent holds the
    directory's lock: nothing writes between the copy and the migration."""
    if current == 0 or current >= latest:
        return None
    copy = path.with_name(copy_name(path.name, current, now_ms))
    try:
        await db.execute_fetchall("VACUUM INTO ?", (str(copy),))
        copy.chmod(0o600)
    except (sqlite3.Error, OSError) as exc:
        with contextlib.suppress(OSError):
            copy.unlink()
        raise store_error(
            exc, f"cannot copy the state database {path} before migrating it", path.parent
        ) from exc
    _log.info(
        "state_database_copied_before_migration",
        path=str(path),
        copy=str(copy),
        schema_version=current,
        migrating_to=latest,
        hint="the way back to the agent that wrote it (docs/operations.md, 'Upgrading and "
        "rolling back'); remove it once the upgrade is kept",
    )
    return copy


async def _schema_version(db: aiosqlite.Connection) -> int:
    """The database's schema version (0: a new database; its version table is made)."""
    await db.execute_fetchall(VERSION_TABLE)
    rows = list(await db.execute_fetchall("SELECT COALESCE(MAX(version), 0) FROM schema_version"))
    return int(rows[0][0])


async def _migrate(
    db: aiosqlite.Connection, path: Path, migrations: Sequence[str], now_ms: int
) -> None:
    """Run the missing migrations in one transaction, after a copy of the database they
    change; refuse a newer schema. The version is read once: one agent holds the directory's
    lock, so nothing else writes it between the read and the migration."""
    current = await _schema_version(db)
    _check_schema_version(current, len(migrations))
    await _copy_before_migrating(db, path, current, len(migrations), now_ms)
    await db.execute_fetchall("BEGIN IMMEDIATE")
    try:
        for version in range(current + 1, len(migrations) + 1):
            for statement in split_statements(migrations[version - 1]):
                await db.execute_fetchall(statement)
            await db.execute_fetchall(
                "INSERT INTO schema_version (version, applied_at) VALUES (?, ?)",
                (version, now_ms),
            )
        await db.execute_fetchall("COMMIT")
    except BaseException:
        await db.rollback()
        raise
