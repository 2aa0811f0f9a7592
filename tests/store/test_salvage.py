"""Specification of the way out of a damaged state: `restore-agent state salvage` recovers
every row SQLite can still read into a new database (the damaged file kept, counts per table,
the record that makes the next start reconcile), `state reset --start-empty` starts empty on
purpose; neither runs beside an agent."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from agent.domain.restore_machine import Op
from agent.domain.restores import RestoreKey
from agent.errors import StoreCorrupt, StoreError
from agent.store import DB_NAME, RevisionStore
from agent.store.damaged_reads import recovering_shell
from agent.store.recovery import RECOVERY_FILE, RecoveryRecord, read_recovery, write_recovery
from agent.store.salvage import reset, salvage
from agent.store.schema import MIGRATIONS
from tests.processes import agent_environ, run_agent
from tests.store.states import node_state, plan

REPO = Path(__file__).resolve().parents[2]
NOW = 1_700_000_000.0
COUNT = 300


def _key(n: int) -> RestoreKey:
    return RestoreKey("cluster-1", "node-1", f"restore-{n:04}")


def _filled(state: Path) -> Path:
    """A database of COUNT restores (each with its plan), checkpointed into its file."""

    async def make() -> None:
        async with await RevisionStore.open(state) as store:
            for n in range(COUNT):
                key = _key(n)
                await store.mutate(
                    key,
                    expected_revision=0,
                    op=Op.PREPARE,
                    state=node_state(key, last_error_message="x" * 200),
                    plan=plan(),
                )
            await store.checkpoint()

    asyncio.run(make())
    return state / DB_NAME


def _damage(path: Path) -> None:
    """2 KiB overwritten in the middle of the file (the issue's trial)."""
    with path.open("r+b") as raw:
        raw.seek(path.stat().st_size // 2)
        raw.write(b"\xa5" * 2048)


async def _open(state: Path) -> RevisionStore:
    return await RevisionStore.open(state)


def test_salvage_recovers_every_readable_row_into_a_working_database(tmp_path: Path) -> None:
    """Around the damaged page every row is read (forward, backward, by index and by parent):
    the new database passes its integrity check, the agent opens it, and the counts say what
    was recovered and kept per table."""
    state = tmp_path / "state"
    path = _filled(state)
    _damage(path)
    with pytest.raises(StoreCorrupt):
        asyncio.run(_open(state))
    report = salvage(state, name=DB_NAME, now=NOW, sqlite3_cli="no-such-sqlite3-shell")
    tables = report.tables
    assert report.tool.startswith("SQL reads")
    assert tables["restore_state"].kept + tables["restore_plan"].kept < 2 * COUNT  # one page lost
    assert tables["restore_state"].kept + tables["restore_plan"].kept >= 2 * COUNT - 40
    assert all(count.dropped == 0 for count in tables.values())

    async def reopened() -> tuple[str, int]:
        async with await RevisionStore.open(state) as store:
            return store.integrity, len(await store.list_states(limit=1000))

    assert asyncio.run(reopened()) == ("ok", tables["restore_state"].kept)


def test_salvage_keeps_the_damaged_file_and_records_the_recovery(tmp_path: Path) -> None:
    """The damaged file moves aside as `.salvaged-<stamp>` byte for byte; the record says
    salvaged, when, which file, the counts, and that reconciliation is due."""
    state = tmp_path / "state"
    path = _filled(state)
    _damage(path)
    damaged = path.read_bytes()
    report = salvage(state, name=DB_NAME, now=NOW, sqlite3_cli="no-such-sqlite3-shell")
    assert report.kept == state / f"{DB_NAME}.salvaged-20231114T221320Z"
    assert report.kept.read_bytes() == damaged
    record = read_recovery(state)
    assert record is not None
    assert (record.how, record.at, record.kept, record.pending) == (
        "salvaged",
        NOW,
        report.kept.name,
        True,
    )
    assert record.counts["restore_state"]["kept"] == report.tables["restore_state"].kept


def test_a_healthy_database_is_not_salvaged(tmp_path: Path) -> None:
    """Nothing to salvage: refused, the file untouched, no record."""
    state = tmp_path / "state"
    path = _filled(state)
    before = path.read_bytes()
    with pytest.raises(StoreError, match="passed its integrity check"):
        salvage(state, name=DB_NAME, now=NOW, sqlite3_cli="no-such-sqlite3-shell")
    assert path.read_bytes() == before
    assert read_recovery(state) is None


def test_salvage_takes_what_an_earlier_agent_moved_aside(tmp_path: Path) -> None:
    """An earlier agent version moved the damaged file to `.corrupt-<stamp>` and left nothing:
    salvage reads that one, and the directory no longer refuses start-up."""
    state = tmp_path / "state"
    path = _filled(state)
    _damage(path)
    aside = state / f"{DB_NAME}.corrupt-20231101T000000Z"
    path.rename(aside)
    report = salvage(state, name=DB_NAME, now=NOW, sqlite3_cli="no-such-sqlite3-shell")
    assert report.kept == state / f"{DB_NAME}.salvaged-20231101T000000Z"
    assert report.tables["restore_state"].kept > 0

    async def reopened() -> str:
        async with await RevisionStore.open(state) as store:
            return store.integrity

    assert asyncio.run(reopened()) == "ok"


def test_reset_starts_empty_on_purpose_and_keeps_the_old_file(tmp_path: Path) -> None:
    """The file moves aside as `.reset-<stamp>`, the next start makes an empty database, and
    the record says reset."""
    state = tmp_path / "state"
    path = _filled(state)
    _damage(path)
    damaged = path.read_bytes()
    kept = reset(state, name=DB_NAME, now=NOW)
    assert kept == state / f"{DB_NAME}.reset-20231114T221320Z"
    assert kept.read_bytes() == damaged

    async def reopened() -> tuple[str, int]:
        async with await RevisionStore.open(state) as store:
            return store.integrity, len(await store.list_states())

    assert asyncio.run(reopened()) == ("new", 0)
    record = read_recovery(state)
    assert record is not None
    assert (record.how, record.pending) == ("reset", True)


def test_a_shell_without_recover_is_not_used(tmp_path: Path) -> None:
    """A sqlite3 shell that cannot run `.recover` (as Debian's and Ubuntu's cannot: their
    library has no sqlite_dbpage) is asked first and passed over."""
    fake = tmp_path / "sqlite3"
    fake.write_text("#!/bin/sh\necho 'sql error: SQL logic error (1)' >&2\nexit 1\n")
    fake.chmod(0o755)
    assert recovering_shell(str(fake)) is None
    assert recovering_shell(str(tmp_path / "absent")) is None


def _config(tmp_path: Path, state: Path) -> Path:
    token = tmp_path / "machine-token"
    token.write_text("salvage-token-9a8b\n")
    token.chmod(0o600)
    config = tmp_path / "agent.toml"
    config.write_text(
        f'[cloudly]\nurl = "wss://cloudly.invalid"\ntoken_file = "{token}"\n'
        f'[state]\ndirectory = "{state}"\n'
    )
    return config


def test_the_salvage_command_prints_counts_per_table(tmp_path: Path) -> None:
    """`restore-agent state salvage`: exit 0, the kept file, a line per table with what was
    recovered, kept and dropped; then `run` no longer refuses the state."""
    state = tmp_path / "state"
    _damage(_filled(state))
    config = _config(tmp_path, state)
    done = run_agent("state", "salvage", "--config", str(config), "--sqlite3", "no-such-shell")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"state salvaged: {state / DB_NAME} (schema version {len(MIGRATIONS)})"
    assert lines[2].startswith("  damaged copy: state.sqlite3.salvaged-")
    assert lines[3].split() == ["TABLE", "RECOVERED", "KEPT", "DROPPED"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[4:10]}
    assert set(rows) == {
        "manifest_object", "relay_job", "restore_plan", "restore_state", "staged_chunk",
        "staged_object",
    }  # fmt: skip
    assert int(rows["restore_state"][1]) > 0


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can own a file for another user")
def test_the_salvage_command_run_as_root_hands_what_it_wrote_to_the_directorys_owner(
    tmp_path: Path,
) -> None:
    """Run as root, the new database and the recovery record are the unit's user's (the owner of
    the state directory), who could not open a root-owned 0600 file."""
    state = tmp_path / "state"
    _damage(_filled(state))
    os.chown(state, 4321, 4321)
    config = _config(tmp_path, state)
    done = run_agent("state", "salvage", "--config", str(config), "--sqlite3", "no-such-shell")
    assert done.returncode == 0, done.stderr
    for written in (state / DB_NAME, state / RECOVERY_FILE):
        assert (written.stat().st_uid, written.stat().st_gid) == (4321, 4321), written.name


def test_reset_needs_its_explicit_flag(tmp_path: Path) -> None:
    """Without `--start-empty` nothing happens (a usage error, exit 2)."""
    state = tmp_path / "state"
    path = _filled(state)
    before = path.read_bytes()
    refused = run_agent("state", "reset", "--config", str(_config(tmp_path, state)))
    assert refused.returncode == 2
    assert "--start-empty" in refused.stderr
    assert path.read_bytes() == before
    done = run_agent("state", "reset", "--config", str(_config(tmp_path, state)), "--start-empty")
    assert done.returncode == 0, done.stderr
    assert not path.exists()


def test_neither_runs_beside_an_agent(tmp_path: Path) -> None:
    """While an agent holds the state directory's lock: one line, exit 75, nothing changed."""
    state = tmp_path / "state"
    path = _filled(state)
    _damage(path)
    damaged = path.read_bytes()
    config = _config(tmp_path, state)
    holder = subprocess.Popen(  # holds agent.lock as a running agent does
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom pathlib import Path\nfrom agent.store import statedir\n"
            "held = statedir.lock(Path(sys.argv[1]))\nprint('held', flush=True)\n"
            "sys.stdin.read()\n",
            str(state),
        ],
        cwd=REPO,
        env=agent_environ(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "held\n"
        salvaged = run_agent("state", "salvage", "--config", str(config))
        reset_done = run_agent("state", "reset", "--config", str(config), "--start-empty")
    finally:
        holder.communicate("", timeout=30)
    for done in (salvaged, reset_done):
        assert done.returncode == 75
        [line] = done.stderr.splitlines()
        assert "a restore-agent runs on this state directory: stop it first" in line
    assert path.read_bytes() == damaged


def test_a_file_that_lost_its_version_table_is_read_as_the_newest_schema_it_has(
    tmp_path: Path,
) -> None:
    """The version is read off the tables and columns a migration added: a damaged file of the
    current schema without `schema_version` salvages as the current version."""
    state = tmp_path / "state"
    path = _filled(state)
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE schema_version")
    _damage(path)
    report = salvage(state, name=DB_NAME, now=NOW, sqlite3_cli="no-such-sqlite3-shell")
    assert report.schema_version == len(MIGRATIONS)


def test_the_recovery_record_is_whole_even_when_writes_are_short(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that takes fewer bytes than it was given is followed by another: the record the
    next start reconciles by reads back as written."""
    write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: write(fd, bytes(data)[:7]))
    record = RecoveryRecord(how="salvaged", at=NOW, kept="state.sqlite3.salvaged-x")
    write_recovery(tmp_path, record.with_node("node-1"))
    assert read_recovery(tmp_path) == record.with_node("node-1")
