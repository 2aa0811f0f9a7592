"""What a state database file holds, read by the state commands (agent/store/file_schema.py)."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.store.file_schema import parents_first, recorded_version, schema_version, tables
from agent.store.schema import MIGRATIONS, VERSION_TABLE, split_statements


@contextlib.contextmanager
def _database(path: Path, version: int) -> Iterator[sqlite3.Connection]:
    """A file at `path` migrated to `version`, its version recorded."""
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute(VERSION_TABLE)
        for number in range(1, version + 1):
            for statement in split_statements(MIGRATIONS[number - 1]):
                db.execute(statement)
            db.execute("INSERT INTO schema_version (version, applied_at) VALUES (?, 0)", (number,))
        yield db


def test_tables_leave_sqlites_own_out(tmp_path: Path) -> None:
    with _database(tmp_path / "db", len(MIGRATIONS)) as db:
        db.execute("CREATE TABLE t (x INTEGER PRIMARY KEY AUTOINCREMENT)")  # makes sqlite_sequence
        names = tables(db)
    assert "t" in names
    assert "schema_version" in names
    assert not [name for name in names if name.startswith("sqlite_")]


def test_the_recorded_version_is_the_highest_row(tmp_path: Path) -> None:
    with _database(tmp_path / "db", 2) as db:
        assert recorded_version(db) == 2


def test_an_empty_version_table_records_no_version(tmp_path: Path) -> None:
    with _database(tmp_path / "db", 0) as db:
        assert recorded_version(db) is None


def test_a_file_without_a_version_table_cannot_say_its_recorded_version(tmp_path: Path) -> None:
    with contextlib.closing(sqlite3.connect(tmp_path / "db")) as db, pytest.raises(sqlite3.Error):
        recorded_version(db)


def test_the_schema_version_is_the_recorded_one_when_it_reads(tmp_path: Path) -> None:
    with _database(tmp_path / "db", 3) as db:
        assert schema_version(db) == 3


def test_without_its_version_table_the_schema_version_is_read_off_the_tables(
    tmp_path: Path,
) -> None:
    with _database(tmp_path / "db", 3) as db:
        db.execute("DROP TABLE schema_version")
        assert schema_version(db) == 3


def test_a_file_without_tables_of_ours_is_schema_version_zero(tmp_path: Path) -> None:
    with contextlib.closing(sqlite3.connect(tmp_path / "db")) as db:
        assert schema_version(db) == 0


def test_parents_come_before_their_children(tmp_path: Path) -> None:
    with contextlib.closing(sqlite3.connect(tmp_path / "db")) as db:
        db.execute("CREATE TABLE child (id INTEGER, parent INTEGER REFERENCES parent (id))")
        db.execute("CREATE TABLE parent (id INTEGER PRIMARY KEY)")
        db.execute("CREATE TABLE alone (id INTEGER)")
        assert parents_first(db, ["child", "parent", "alone"]) == ["alone", "parent", "child"]
