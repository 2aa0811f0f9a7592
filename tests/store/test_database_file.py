"""The database file: private modes, pragmas, migrations, and what happens to a damaged file."""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.domain.restore_machine import NODE_STATUSES, Op
from agent.domain.restores import RestoreKey
from agent.errors import StoreCorrupt, StoreError
from agent.store import DB_NAME, RevisionStore
from agent.store.schema import MIGRATIONS, SCHEMA_VERSION, split_statements
from agent.store.startup import open_database
from tests.clock import ManualClock
from tests.store.states import node_state, plan

KEY = RestoreKey("cluster-1", "node-1", "restore-1")
STAMP = "20231114T221320Z"  # conftest NOW in UTC


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def _make_dir(directory: Path, mode: int = 0o700) -> None:
    directory.mkdir(mode=mode)
    directory.chmod(mode)


def _write(path: Path, data: bytes) -> None:
    path.write_bytes(data)


@pytest.fixture
def open_umask() -> Iterator[None]:
    """Run the test with umask 000, the worst case for file modes."""
    previous = os.umask(0)
    try:
        yield
    finally:
        os.umask(previous)


@pytest.mark.usefixtures("open_umask")
async def test_directory_is_0700_and_database_files_0600(state_dir: Path) -> None:
    """Whatever the umask, the directory and every database file are private."""
    async with await RevisionStore.open(state_dir) as store:
        await store.mutate(KEY, expected_revision=0, op=Op.PREPARE, state=node_state(), plan=plan())
        assert _mode(state_dir) == 0o700
        files = _names(state_dir)
        assert files == [DB_NAME, f"{DB_NAME}-shm", f"{DB_NAME}-wal"]
        assert {_mode(state_dir / name) for name in files} == {0o600}


async def test_an_existing_open_directory_and_file_are_tightened(state_dir: Path) -> None:
    """A pre-existing 0755 directory and 0644 file are made private, not reused as they are."""
    _make_dir(state_dir, 0o755)
    _write(state_dir / DB_NAME, b"")
    os.chmod(state_dir / DB_NAME, 0o644)
    async with await RevisionStore.open(state_dir):
        assert (_mode(state_dir), _mode(state_dir / DB_NAME)) == (0o700, 0o600)


async def test_connection_uses_wal_full_sync_foreign_keys_and_busy_timeout(
    state_dir: Path, clock: ManualClock
) -> None:
    """The pragmas durability and integrity rely on are set on every connection."""
    _make_dir(state_dir)
    db = await open_database(state_dir / DB_NAME, busy_timeout=1.5, clock=clock)
    try:
        pragmas = {
            name: next(iter(await db.execute_fetchall(f"PRAGMA {name}")))[0]
            for name in ("journal_mode", "synchronous", "foreign_keys", "busy_timeout")
        }
    finally:
        await db.close()
    assert pragmas == {
        "journal_mode": "wal",
        "synchronous": 2,
        "foreign_keys": 1,
        "busy_timeout": 1500,
    }


async def test_reopening_keeps_data_and_applies_no_migration_twice(state_dir: Path) -> None:
    """Migrations run once; a reopened store sees the same rows and the same version."""
    async with await RevisionStore.open(state_dir) as store:
        created = await store.mutate(
            KEY,
            expected_revision=0,
            op=Op.PREPARE,
            state=node_state(last_error_code="x"),
            plan=plan(x=1),
        )
    for _ in range(2):
        async with await RevisionStore.open(state_dir) as store:
            assert await store.get(KEY) == created
    with sqlite3.connect(state_dir / DB_NAME) as raw:
        versions = raw.execute("SELECT version FROM schema_version ORDER BY version").fetchall()
    raw.close()
    assert versions == [(v,) for v in range(1, SCHEMA_VERSION + 1)]


async def test_a_later_migration_is_applied_on_top_of_an_existing_database(
    state_dir: Path, clock: ManualClock
) -> None:
    """Only the missing migrations run, in order, on an older database."""
    async with await RevisionStore.open(state_dir) as store:
        await store.mutate(KEY, expected_revision=0, op=Op.PREPARE, state=node_state(), plan=plan())
    newer = (*MIGRATIONS, "CREATE TABLE extra (x INTEGER); INSERT INTO extra VALUES (7);")
    db = await open_database(state_dir / DB_NAME, busy_timeout=1, clock=clock, migrations=newer)
    try:
        extra = list(await db.execute_fetchall("SELECT x FROM extra"))
        versions = list(await db.execute_fetchall("SELECT version FROM schema_version"))
    finally:
        await db.close()
    assert extra == [(7,)]
    assert versions == [(v,) for v in range(1, len(newer) + 1)]


async def test_a_failing_migration_leaves_the_database_as_it_was(
    state_dir: Path, clock: ManualClock
) -> None:
    """All pending migrations are one transaction: a failure applies none of them."""
    async with await RevisionStore.open(state_dir):
        pass
    broken = (*MIGRATIONS, "CREATE TABLE half (x INTEGER);", "SELECT * FROM no_such_table;")
    with pytest.raises(StoreError):
        _ = await open_database(state_dir / DB_NAME, busy_timeout=1, clock=clock, migrations=broken)
    with sqlite3.connect(state_dir / DB_NAME) as raw:
        tables = {row[0] for row in raw.execute("SELECT name FROM sqlite_schema")}
        version = raw.execute("SELECT MAX(version) FROM schema_version").fetchone()
    raw.close()
    assert "half" not in tables
    assert version == (SCHEMA_VERSION,)


async def test_a_database_from_a_newer_agent_is_refused_and_left_alone(state_dir: Path) -> None:
    """A schema version beyond this agent's is not corruption: refuse, keep the file."""
    async with await RevisionStore.open(state_dir):
        pass
    with sqlite3.connect(state_dir / DB_NAME) as raw:
        raw.execute("INSERT INTO schema_version VALUES (?, 0)", (SCHEMA_VERSION + 1,))
    raw.close()
    with pytest.raises(StoreError, match="schema version") as raised:
        await RevisionStore.open(state_dir)
    assert not isinstance(raised.value, StoreCorrupt)
    assert (state_dir / DB_NAME).exists()


async def test_the_schema_admits_exactly_the_node_statuses(state_dir: Path) -> None:
    """The status CHECK takes every TIsolatedRestoreNodeStatus and nothing else."""
    async with await RevisionStore.open(state_dir) as store:
        path = store.path
    insert = "INSERT INTO restore_state VALUES ('c', 'n', ?, 1, ?, '{}', NULL, 0)"
    raw = sqlite3.connect(path, isolation_level=None)
    try:
        for status in NODE_STATUSES:
            raw.execute(insert, (status, status))
        with pytest.raises(sqlite3.IntegrityError):
            raw.execute(insert, ("bogus", "bogus"))
    finally:
        raw.close()


def test_migrations_split_into_complete_statements() -> None:
    """Semicolons inside literals do not split a statement."""
    assert split_statements(
        "CREATE TABLE a (x TEXT DEFAULT ';'); INSERT INTO a VALUES ('b;c');"
    ) == [
        "CREATE TABLE a (x TEXT DEFAULT ';');",
        "INSERT INTO a VALUES ('b;c');",
    ]


async def test_a_file_that_is_no_database_is_refused_and_left_in_place(
    state_dir: Path, clock: ManualClock
) -> None:
    """Garbage is never replaced by an empty database: StoreCorrupt names the file and the
    way out, and the file stays exactly where and what it was."""
    _make_dir(state_dir)
    garbage = b"this is not a database " * 400
    _write(state_dir / DB_NAME, garbage)
    with pytest.raises(StoreCorrupt) as raised:
        await RevisionStore.open(state_dir, clock=clock)
    assert raised.value.path == str(state_dir / DB_NAME)
    assert not raised.value.retryable
    assert "restore-agent state salvage" in str(raised.value)
    assert (state_dir / DB_NAME).read_bytes() == garbage
    assert not [name for name in os.listdir(state_dir) if name.startswith(f"{DB_NAME}.")]


async def test_a_database_with_a_damaged_page_is_refused(
    state_dir: Path, clock: ManualClock
) -> None:
    """SQLite reporting the image malformed during the check counts as corrupt."""
    async with await RevisionStore.open(state_dir) as store:
        for n in range(300):
            key = RestoreKey("cluster-1", "node-1", f"restore-{n:04}")
            await store.mutate(
                key,
                expected_revision=0,
                op=Op.PREPARE,
                state=node_state(key, last_error_message="x" * 200),
                plan=plan(),
            )
    path = state_dir / DB_NAME
    with path.open("r+b") as raw:
        raw.seek(4096 * 4)
        raw.write(b"\xff" * 64)
    damaged = path.read_bytes()
    with pytest.raises(StoreCorrupt):
        await RevisionStore.open(state_dir, clock=clock)
    assert path.read_bytes() == damaged


async def test_integrity_errors_in_a_readable_database_are_corruption(
    state_dir: Path, clock: ManualClock
) -> None:
    """An index that disagrees with its table fails integrity_check and is moved aside."""
    async with await RevisionStore.open(state_dir) as store:
        for n in range(3):
            key = RestoreKey("cluster-1", "node-1", f"restore-{n}")
            await store.mutate(
                key, expected_revision=0, op=Op.PREPARE, state=node_state(key), plan=plan()
            )
    raw = sqlite3.connect(state_dir / DB_NAME, isolation_level=None)
    raw.execute("PRAGMA writable_schema = ON")
    raw.execute(
        "UPDATE sqlite_schema SET sql = 'CREATE INDEX restore_state_by_status "
        "ON restore_state (restore_id)' WHERE name = 'restore_state_by_status'"
    )
    raw.close()
    with pytest.raises(StoreCorrupt, match="missing from index"):
        await RevisionStore.open(state_dir, clock=clock)


async def test_a_damaged_database_keeps_refusing_at_every_start(
    state_dir: Path, clock: ManualClock
) -> None:
    """The next start does not start empty: it refuses the same way until an operator acts
    (before, the first start moved the file aside and the second made an empty database)."""
    _make_dir(state_dir)
    _write(state_dir / DB_NAME, b"garbage" * 1000)
    for _ in range(3):
        with pytest.raises(StoreCorrupt):
            await RevisionStore.open(state_dir, clock=clock)
    assert (state_dir / DB_NAME).read_bytes() == b"garbage" * 1000


async def test_a_database_an_earlier_agent_moved_aside_keeps_refusing(
    state_dir: Path, clock: ManualClock
) -> None:
    """An earlier agent version moved a damaged database aside (`.corrupt-<stamp>`) and left
    nothing in its place: this one does not make an empty database there either."""
    _make_dir(state_dir)
    _write(state_dir / f"{DB_NAME}.corrupt-{STAMP}", b"garbage" * 1000)
    with pytest.raises(StoreCorrupt, match=f"{DB_NAME}.corrupt-{STAMP}") as raised:
        await RevisionStore.open(state_dir, clock=clock)
    assert raised.value.problem == "moved aside by an earlier start"
    assert not (state_dir / DB_NAME).exists()


async def test_a_database_moved_aside_and_acknowledged_no_longer_refuses(
    state_dir: Path, clock: ManualClock
) -> None:
    """A file salvage or reset kept aside (`damaged-`, `salvaged-`, `reset-`) is no reason to
    refuse: an operator acted."""
    _make_dir(state_dir)
    for label in ("damaged", "salvaged", "reset"):
        _write(state_dir / f"{DB_NAME}.{label}-{STAMP}", b"garbage" * 1000)
    async with await RevisionStore.open(state_dir, clock=clock) as fresh:
        assert fresh.integrity == "new"
