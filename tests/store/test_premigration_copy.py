"""A copy of the state database before a migration changes it: the way back to the agent that
wrote it (docs/operations.md, "Upgrading and rolling back"), which refuses the migrated file."""

from __future__ import annotations

import sqlite3
import stat
from pathlib import Path

import pytest

from agent.entry.cli import main
from agent.errors import StoreNewer
from agent.store import DB_NAME
from agent.store.recovery import read_recovery
from agent.store.schema import MIGRATIONS, SCHEMA_VERSION
from agent.store.startup import copy_name, open_database
from tests.clock import ManualClock

NOW = 1_764_971_172.0  # 2025-12-05 21:46:12 UTC


def _schema(path: Path) -> int:
    with sqlite3.connect(path) as db:
        return int(db.execute("SELECT MAX(version) FROM schema_version").fetchone()[0])


def _copies(state: Path) -> list[Path]:
    return sorted(state.glob(f"{DB_NAME}.schema-*"))


async def _open(state: Path, migrations: tuple[str, ...] | list[str]) -> None:
    db = await open_database(
        state / DB_NAME, busy_timeout=1, clock=ManualClock(start=NOW), migrations=migrations
    )
    await db.close()


async def test_an_older_database_is_copied_before_it_is_migrated(tmp_path: Path) -> None:
    """Schema N-1 opened by an agent of schema N: the copy beside it is the N-1 file, private,
    named after its schema and the time; the database itself is N."""
    older = SCHEMA_VERSION - 1
    await _open(tmp_path, MIGRATIONS[:older])
    await _open(tmp_path, MIGRATIONS)
    [copy] = _copies(tmp_path)
    assert copy.name == copy_name(DB_NAME, older, int(NOW * 1000))
    assert copy.name == f"{DB_NAME}.schema-{older}-20251205T214612Z"
    assert _schema(copy) == older
    assert _schema(tmp_path / DB_NAME) == SCHEMA_VERSION
    assert stat.S_IMODE(copy.stat().st_mode) == 0o600


async def test_the_copy_is_what_the_older_agent_opens_again(tmp_path: Path) -> None:
    """Rolling back: the older agent refuses the migrated file and opens the copy put back."""
    older = SCHEMA_VERSION - 1
    await _open(tmp_path, MIGRATIONS[:older])
    await _open(tmp_path, MIGRATIONS)
    with pytest.raises(StoreNewer):
        await _open(tmp_path, MIGRATIONS[:older])
    [copy] = _copies(tmp_path)
    for sidecar in ("-wal", "-shm"):
        (tmp_path / f"{DB_NAME}{sidecar}").unlink(missing_ok=True)
    copy.replace(tmp_path / DB_NAME)
    await _open(tmp_path, MIGRATIONS[:older])
    assert _schema(tmp_path / DB_NAME) == older


async def test_a_new_database_is_not_copied(tmp_path: Path) -> None:
    await _open(tmp_path, MIGRATIONS)
    assert _copies(tmp_path) == []


async def test_a_database_at_the_agents_schema_is_not_copied(tmp_path: Path) -> None:
    await _open(tmp_path, MIGRATIONS)
    await _open(tmp_path, MIGRATIONS)
    assert _copies(tmp_path) == []


def _config(tmp_path: Path) -> Path:
    token = tmp_path / "machine-token"
    token.write_text("token\n")
    token.chmod(0o600)
    path = tmp_path / "agent.toml"
    path.write_text(
        '[cloudly]\nurl = "https://cloudly.example.com"\ntoken_file = "machine-token"\n'
        '[state]\ndirectory = "state"\n'
    )
    return path


async def test_state_rollback_puts_the_copy_back_and_keeps_the_migrated_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`restore-agent state rollback` (the agent stopped): the database is the copy again, at
    the older schema; the migrated file is kept aside; the next start reconciles with each
    node's Corestore (a recovery record every agent version reads)."""
    state, older = tmp_path / "state", SCHEMA_VERSION - 1
    await _open(state, MIGRATIONS[:older])
    await _open(state, MIGRATIONS)
    [copy] = _copies(state)
    capsys.readouterr()  # the start-ups' log lines
    assert main(["state", "rollback", "--config", str(_config(tmp_path))]) == 0
    assert _schema(state / DB_NAME) == older
    assert copy.exists()  # kept for another try
    [migrated] = state.glob(f"{DB_NAME}.rolled-back-*")
    assert _schema(migrated) == SCHEMA_VERSION
    record = read_recovery(state)
    assert record is not None
    assert (record.how, record.kept, record.pending) == ("salvaged", migrated.name, True)
    out = capsys.readouterr().out
    assert out.startswith(f"state rolled back: {state / DB_NAME} is {copy.name} (schema ")


def test_state_rollback_without_a_copy_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No migration ever ran here: one line saying there is nothing to roll back to, exit 1;
    nothing but the lock it took is in the directory."""
    (tmp_path / "state").mkdir()
    assert main(["state", "rollback", "--config", str(_config(tmp_path))]) == 1
    assert "there is nothing to roll back to" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "state").iterdir()) == ["agent.lock"]


def test_state_rollback_refuses_a_copy_that_is_no_database_and_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A copy SQLite cannot read: one line naming it, exit 1; the database stays in place."""
    state = tmp_path / "state"
    state.mkdir()
    (state / DB_NAME).write_bytes(b"the database")
    broken = state / f"{DB_NAME}.schema-1-20251205T214612Z"
    broken.write_bytes(b"no database at all" * 100)
    assert main(["state", "rollback", "--config", str(_config(tmp_path))]) == 1
    assert f"the copy {broken} cannot be read as a state database" in capsys.readouterr().err
    assert (state / DB_NAME).read_bytes() == b"the database"
