"""`restore-agent state salvage` and `state reset`: an operator's way out of a damaged state.

The agent refuses to start on a damaged state database (`startup.py`, exit 65) rather than
start empty. These two put a database in its place on purpose, with the agent stopped (the
caller holds the state directory's lock), and keep the damaged file:

`salvage(directory)` recovers every row SQLite can still read:

1. the damaged file (`state.sqlite3`, or the newest `state.sqlite3.corrupt-*` an earlier agent
   version moved aside) is copied, with its WAL, into a scratch directory beside it;
2. SQLite reads the copy (`damaged_reads.py`), by one of two ways:
   - `recover`: SQLite's own recovery, the `sqlite3` shell's `.recover` (its recovery
     extension, `sqlite3_recover`), when a shell that has it is found (`--sqlite3 PATH`, else
     `sqlite3` on the PATH; each is asked first). It reads the pages themselves, so it also
     gets rows out of a damaged schema or a damaged interior page. Neither Python's `sqlite3`
     nor APSW exposes that API, and the shells the distributions ship cannot run it: Debian
     12's and Ubuntu 24.04's `sqlite3` are linked against a libsqlite3 built without
     `sqlite_dbpage`, so `.recover` fails there ("SQL logic error"), and the shell APSW's
     wheels carry has no `.recover` at all (checked with APSW 3.54.1);
   - `sql` (the fallback, no extra program): each table read through SQLite's own SQL, every
     way that reaches its rows without touching the damaged page: a scan in key order until
     the first damaged page, one in reverse order until it, each of the table's indexes for
     keys to look up one by one, and a range per parent row for a child table. A damaged page
     loses its own rows; the rest are read (tests/store/test_salvage.py). It needs a readable
     schema (page 1); when that is what broke, only `.recover` can help, and the command says
     so;
3. a new database is made with this agent's migrations up to the damaged file's schema version
   (`schema_version`, or which tables it has when that table was lost; a newer one is refused:
   `StoreNewer`), and every recovered row of each table is inserted, parents before children,
   with the schema's checks and foreign keys on: a row that breaks them (its parent was lost,
   a column came back damaged, a JSON column no longer parses) is dropped and counted;
4. the damaged file moves aside to `state.sqlite3.salvaged-<UTC timestamp>` (with its sidecars),
   the new database takes its place, `state-recovery.json` records how and when
   (`recovery.py`: the agent reconciles with each node's Corestore at its next start); the
   command that runs it as root hands what it wrote to the state directory's owner, the unit's
   user (`statedir.give_back`, agent/entry/statecommands.py).

`reset(directory)` keeps the current file aside (`state.sqlite3.reset-<timestamp>`), leaves no
database (the next start makes an empty one) and writes the same record. Either acknowledges
every `state.sqlite3.corrupt-*` an earlier agent moved aside (renamed `...damaged-*`), which
otherwise keeps start-up refused.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from agent.errors import StoreError, StoreNewer
from agent.store import file_schema
from agent.store.damaged_reads import read_damaged
from agent.store.files import SIDECAR_SUFFIXES, move_aside, moved_aside
from agent.store.recovery import RecoveryRecord, write_recovery
from agent.store.schema import MIGRATIONS, VERSION_TABLE, split_statements

__all__ = ["SalvageReport", "TableCount", "reset", "salvage"]

_SCRATCH: Final = ".salvage"
_JSON_COLUMNS: Final = frozenset(
    {"state_json", "result_json", "mappings_json", "manifest_json", "private_json", "plan_json"}
)


@dataclass(frozen=True, slots=True)
class TableCount:
    """One table's rows: how many SQLite recovered, how many the new database kept."""

    recovered: int = 0
    kept: int = 0

    @property
    def dropped(self) -> int:
        """Recovered rows the schema refused (a lost parent, a damaged column)."""
        return self.recovered - self.kept


@dataclass(frozen=True, slots=True)
class SalvageReport:
    """What a salvage did: the database it made, the damaged copy it kept, the rows."""

    database: Path
    kept: Path
    schema_version: int
    tables: dict[str, TableCount] = field(default_factory=dict)
    unattributed: int = 0
    """Rows SQLite found that no table claims any more (`lost_and_found`): not restored."""
    tool: str = ""


def _damaged_source(path: Path) -> Path:
    """The file to salvage: the database, or the newest one an earlier start moved aside."""
    try:
        if path.stat().st_size > 0:
            return path
    except FileNotFoundError:
        pass
    aside = moved_aside(path)
    if not aside:
        raise StoreError(f"there is no state database to salvage at {path}")
    return aside[-1]


def _integrity_ok(path: Path) -> bool:
    try:
        with contextlib.closing(sqlite3.connect(path)) as db:
            rows = db.execute("PRAGMA integrity_check").fetchall()
    except sqlite3.DatabaseError:
        return False
    return [str(row[0]) for row in rows] == ["ok"]


def _readable_json(values: dict[str, object]) -> bool:
    for column, value in values.items():
        if column in _JSON_COLUMNS and value is not None:
            try:
                json.loads(str(value))
            except ValueError:
                return False
    return True


def _copy_rows(target: sqlite3.Connection, recovered: sqlite3.Connection) -> dict[str, TableCount]:
    """Every recovered row the target's schema takes, table by table (parents first)."""
    present = set(file_schema.tables(recovered))
    tables = [t for t in file_schema.tables(target) if t != "schema_version"]
    counts: dict[str, TableCount] = {}
    for table in file_schema.parents_first(target, tables):
        if table not in present:
            counts[table] = TableCount()
            continue
        wanted = [str(row[1]) for row in target.execute(f'PRAGMA table_info("{table}")')]
        have = {str(row[1]) for row in recovered.execute(f'PRAGMA table_info("{table}")')}
        columns = [c for c in wanted if c in have]
        names = ", ".join(f'"{c}"' for c in columns)
        marks = ", ".join("?" for _ in columns)
        insert = f'INSERT INTO "{table}" ({names}) VALUES ({marks})'  # noqa: S608
        recovered_rows = kept = 0
        for row in recovered.execute(f'SELECT {names} FROM "{table}"'):  # noqa: S608
            recovered_rows += 1
            if not _readable_json(dict(zip(columns, row, strict=True))):
                continue
            try:
                target.execute(insert, row)
            except sqlite3.IntegrityError:
                continue
            kept += 1
        counts[table] = TableCount(recovered_rows, kept)
    return counts


def _new_database(path: Path, version: int) -> sqlite3.Connection:
    """An empty database at `path` with this agent's migrations up to `version`."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA auto_vacuum = INCREMENTAL")
    db.execute("PRAGMA foreign_keys = ON")
    db.execute("BEGIN IMMEDIATE")
    db.execute(VERSION_TABLE)
    for number in range(1, version + 1):
        for statement in split_statements(MIGRATIONS[number - 1]):
            db.execute(statement)
        db.execute("INSERT INTO schema_version (version, applied_at) VALUES (?, 0)", (number,))
    return db


def _acknowledge_moved_aside(path: Path) -> None:
    """Every `corrupt-*` an earlier start moved aside is acknowledged (`damaged-*`): kept, but
    no longer a reason to refuse start-up."""
    for aside in moved_aside(path):
        for suffix in ("", *SIDECAR_SUFFIXES):
            source = aside.with_name(aside.name + suffix)
            if source.exists():
                source.rename(source.with_name(source.name.replace(".corrupt-", ".damaged-", 1)))


def salvage(
    directory: Path, *, name: str, now: float, sqlite3_cli: str | None = None
) -> SalvageReport:
    """Recover what SQLite can still read of the damaged database `directory/name` into a new
    one in its place (module docstring); the damaged file is kept aside."""
    path = directory / name
    source = _damaged_source(path)
    scratch = directory / _SCRATCH
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(mode=0o700)
    try:
        copy = scratch / "damaged.sqlite3"
        shutil.copyfile(source, copy)
        wal = source.with_name(source.name + "-wal")
        if wal.exists():
            shutil.copyfile(wal, copy.with_name(copy.name + "-wal"))
        if source == path and _integrity_ok(copy):
            raise StoreError(
                f"the state database {path} passed its integrity check: there is nothing to "
                "salvage (to start empty on purpose: `restore-agent state reset --start-empty`)"
            )
        recovered_path = scratch / "recovered.sqlite3"
        tool = read_damaged(copy, recovered_path, sqlite3_cli=sqlite3_cli)
        with contextlib.closing(sqlite3.connect(recovered_path)) as recovered:
            version = file_schema.schema_version(recovered)
            if version > len(MIGRATIONS):
                raise StoreNewer(
                    f"the damaged state database has schema version {version}, newer than "
                    f"this agent's {len(MIGRATIONS)}: salvage it with the agent that wrote it",
                    found=version,
                    known=len(MIGRATIONS),
                )
            unattributed = 0
            if "lost_and_found" in file_schema.tables(recovered):
                row = recovered.execute("SELECT COUNT(*) FROM lost_and_found").fetchone()
                unattributed = int(row[0])
            fresh = scratch / "salvaged.sqlite3"
            target = _new_database(fresh, version)
            try:
                counts = _copy_rows(target, recovered)
                target.execute("COMMIT")
            finally:
                target.close()
        kept = (
            move_aside(path, now, label="salvaged")
            if source == path
            else source.rename(source.with_name(source.name.replace(".corrupt-", ".salvaged-")))
        )
        _acknowledge_moved_aside(path)
        for suffix in SIDECAR_SUFFIXES:  # a WAL of the damaged file must never meet the new one
            path.with_name(path.name + suffix).unlink(missing_ok=True)
        os.replace(fresh, path)
        record = RecoveryRecord(
            how="salvaged",
            at=now,
            kept=kept.name,
            counts={
                table: {"recovered": c.recovered, "kept": c.kept, "dropped": c.dropped}
                for table, c in counts.items()
            },
        )
        # Its write ends with the directory's fsync: the swap above lasts with it.
        write_recovery(directory, record)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return SalvageReport(
        database=path,
        kept=kept,
        schema_version=version,
        tables=counts,
        unattributed=unattributed,
        tool=tool,
    )


def reset(directory: Path, *, name: str, now: float) -> Path | None:
    """Keep the database `directory/name` aside (`<name>.reset-<timestamp>`) so the next start
    makes an empty one; acknowledge what earlier starts moved aside; record it. The kept
    file, or None when there was none."""
    path = directory / name
    kept: Path | None = None
    if path.exists():
        kept = move_aside(path, now, label="reset")
    else:
        for suffix in SIDECAR_SUFFIXES:
            path.with_name(path.name + suffix).unlink(missing_ok=True)
    _acknowledge_moved_aside(path)
    write_recovery(  # ends with the directory's fsync: the renames above last with it
        directory, RecoveryRecord(how="reset", at=now, kept="" if kept is None else kept.name)
    )
    return kept
