"""What a state database file holds, read with the standard library's `sqlite3` by the state
commands, which run with the agent stopped (`salvage.py`, `damaged_reads.py`, `rollback.py`):

    tables(db)            its tables (not SQLite's own)
    recorded_version(db)  the schema version its `schema_version` table records
    schema_version(db)    the same, or, when that table was lost or does not read, the version
                          the tables and columns a migration added say
    parents_first(db, t)  tables `t` in an order that inserts a parent before its children
"""

from __future__ import annotations

import contextlib
import sqlite3

__all__ = ["parents_first", "recorded_version", "schema_version", "tables"]


def tables(db: sqlite3.Connection) -> list[str]:
    """The names of the database's tables, SQLite's own left out."""
    rows = db.execute(
        "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
    ).fetchall()
    return [str(row[0]) for row in rows]


def recorded_version(db: sqlite3.Connection) -> int | None:
    """The highest version `schema_version` records, None when it records none; raises
    `sqlite3.Error` when the table is missing or does not read."""
    row = db.execute("SELECT MAX(version) FROM schema_version").fetchone()
    if row is not None and isinstance(row[0], int):
        return int(row[0])
    return None


def schema_version(db: sqlite3.Connection) -> int:
    """The recorded version, else the one the tables and columns say (0: no table of ours)."""
    present = set(tables(db))
    if "schema_version" in present:
        with contextlib.suppress(sqlite3.DatabaseError):
            recorded = recorded_version(db)
            if recorded is not None:
                return recorded
    if "relay_job" in present:
        columns = {str(row[1]) for row in db.execute("PRAGMA table_info(relay_job)")}
        if "plan_json" in columns:
            return 5
        if "restore_plan" in present:
            return 4
        return 3 if "run" in columns else 2
    return 1 if "restore_state" in present else 0


def parents_first(db: sqlite3.Connection, names: list[str]) -> list[str]:
    """`names` ordered so that a table comes after every table its foreign keys name."""
    parents = {
        table: {str(row[2]) for row in db.execute(f'PRAGMA foreign_key_list("{table}")')}
        for table in names
    }
    ordered: list[str] = []
    while len(ordered) < len(names):
        ready = [t for t in names if t not in ordered and parents[t] <= {*ordered, t}]
        if not ready:  # a cycle: the schema has none, but never loop
            ready = [t for t in names if t not in ordered]
        ordered.extend(sorted(ready))
    return ordered
