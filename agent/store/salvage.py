"""`restore-agent state salvage` and `state reset`: an operator's way out of a damaged state.

The agent refuses to start on a damaged state database (`startup.py`, exit 65) rather than
start empty. These two put a database in its place on purpose, with the agent stopped (the
caller holds the state directory's lock), and keep the damaged file:

`salvage(directory)` recovers every row SQLite can still read:

1. the damaged file (`state.sqlite3`, or the newest `state.sqlite3.corrupt-*` an earlier agent
   version moved aside) is copied, with its WAL, into a scratch directory beside it;
2. SQLite reads the copy, by one of two ways:
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
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from agent.errors import StoreError, StoreNewer
from agent.store.files import SIDECAR_SUFFIXES, move_aside, moved_aside
from agent.store.recovery import RecoveryRecord, write_recovery
from agent.store.schema import MIGRATIONS, VERSION_TABLE, split_statements

__all__ = ["SalvageReport", "TableCount", "recovering_shell", "reset", "salvage"]

_Rows = dict[tuple[object, ...], tuple[object, ...]]  # rows by their key
_SCRATCH: Final = ".salvage"
_TIMEOUT_S: Final = 3600.0
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


def _shell(sqlite3_cli: str, args: list[str], *, stdin: Path | None, stdout: Path | None) -> str:
    """Run the sqlite3 shell; its stderr text (`StoreError` when it fails or is missing)."""
    executable = sqlite3_cli
    with contextlib.ExitStack() as files:
        given = None if stdin is None else files.enter_context(stdin.open("rb"))
        taken = None if stdout is None else files.enter_context(stdout.open("wb"))
        done = subprocess.run(  # noqa: S603  # a fixed program, arguments are our own paths
            [executable, *args],
            stdin=given,
            stdout=taken if taken is not None else subprocess.PIPE,
            stderr=subprocess.PIPE,
            timeout=_TIMEOUT_S,
            check=False,
        )
    if done.returncode != 0:
        raise StoreError(
            f"sqlite3 {' '.join(args[1:])} failed ({done.returncode}): "
            + done.stderr.decode(errors="replace").strip()[:400]
        )
    return (done.stdout or b"").decode(errors="replace").strip()


def _tables(db: sqlite3.Connection) -> list[str]:
    rows = db.execute(
        "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
    ).fetchall()
    return [str(row[0]) for row in rows]


def _schema_version(db: sqlite3.Connection) -> int:
    tables = set(_tables(db))
    if "schema_version" in tables:
        with contextlib.suppress(sqlite3.DatabaseError):
            row = db.execute("SELECT MAX(version) FROM schema_version").fetchone()
            if row is not None and isinstance(row[0], int):
                return int(row[0])
    if "relay_job" in tables:
        columns = {str(row[1]) for row in db.execute("PRAGMA table_info(relay_job)")}
        if "plan_json" in columns:
            return 5
        if "restore_plan" in tables:
            return 4
        return 3 if "run" in columns else 2
    return 1 if "restore_state" in tables else 0


def _parents_first(db: sqlite3.Connection, tables: list[str]) -> list[str]:
    """`tables` ordered so that a table comes after every table its foreign keys name."""
    parents = {
        table: {str(row[2]) for row in db.execute(f'PRAGMA foreign_key_list("{table}")')}
        for table in tables
    }
    ordered: list[str] = []
    while len(ordered) < len(tables):
        ready = [t for t in tables if t not in ordered and parents[t] <= {*ordered, t}]
        if not ready:  # a cycle: the schema has none, but never loop
            ready = [t for t in tables if t not in ordered]
        ordered.extend(sorted(ready))
    return ordered


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
    present = set(_tables(recovered))
    tables = [t for t in _tables(target) if t != "schema_version"]
    counts: dict[str, TableCount] = {}
    for table in _parents_first(target, tables):
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


def recovering_shell(sqlite3_cli: str | None) -> str | None:
    """The path of a sqlite3 shell that can run `.recover` (`sqlite3_cli`, else `sqlite3` on
    the PATH), or None: each is asked to recover an empty database first."""
    for name in (sqlite3_cli,) if sqlite3_cli else ("sqlite3",):
        executable = shutil.which(name)
        if executable is None:
            continue
        try:
            done = subprocess.run(  # noqa: S603  # the operator's or the PATH's sqlite3 shell
                [executable, ":memory:", ".recover"],
                capture_output=True,
                timeout=60,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            continue
        if done.returncode == 0 and b"COMMIT" in done.stdout:
            return executable
    return None


def _key_columns(db: sqlite3.Connection, table: str) -> list[str]:
    info = list(db.execute(f'PRAGMA table_info("{table}")'))
    keyed = sorted((int(row[5]), str(row[1])) for row in info if int(row[5]) > 0)
    return [name for _, name in keyed] or ["rowid"]


def _scan(
    db: sqlite3.Connection,
    sql: str,
    params: tuple[object, ...],
    found: _Rows,
    width: int,
) -> None:
    """Add the rows `sql` yields (the key first `width` columns) until SQLite meets damage."""
    try:
        for row in db.execute(sql, params):
            found.setdefault(tuple(row[:width]), tuple(row[width:]))
    except sqlite3.DatabaseError:
        return


def _read_table(
    db: sqlite3.Connection,
    table: str,
    columns: list[str],
    parent_keys: dict[str, list[tuple[object, ...]]],
) -> list[tuple[object, ...]]:
    """Every row of `table` SQLite can still read (`sql` in the module docstring)."""
    key = _key_columns(db, table)
    keys, names = ", ".join(f'"{c}"' for c in key), ", ".join(f'"{c}"' for c in columns)
    select = f'SELECT {keys}, {names} FROM "{table}"'  # noqa: S608
    found: _Rows = {}
    width = len(key)
    _scan(db, f"{select} ORDER BY {keys}", (), found, width)
    _scan(db, f"{select} ORDER BY {keys} DESC", (), found, width)
    match = " AND ".join(f'"{c}" = ?' for c in key)
    candidates: list[tuple[object, ...]] = []
    for index in [str(row[1]) for row in db.execute(f'PRAGMA index_list("{table}")')]:
        indexed: _Rows = {}
        by_index = f'SELECT {keys} FROM "{table}" INDEXED BY "{index}"'  # noqa: S608
        _scan(db, by_index, (), indexed, width)
        candidates += list(indexed)
    for fk in _foreign_keys(db, table):
        parent, mine = fk
        for parent_key in parent_keys.get(parent, []):
            where = " AND ".join(f'"{c}" = ?' for c in mine)
            if mine == key:
                candidates.append(parent_key)
            else:
                _scan(db, f"{select} WHERE {where} ORDER BY {keys}", parent_key, found, width)
                _scan(db, f"{select} WHERE {where} ORDER BY {keys} DESC", parent_key, found, width)
    for candidate in candidates:
        if candidate not in found:
            _scan(db, f"{select} WHERE {match}", candidate, found, width)
    return list(found.values())


def _foreign_keys(db: sqlite3.Connection, table: str) -> list[tuple[str, list[str]]]:
    """(parent table, this table's columns) of each foreign key, the columns in key order."""
    groups: dict[int, tuple[str, list[tuple[int, str]]]] = {}
    for row in db.execute(f'PRAGMA foreign_key_list("{table}")'):
        ident, seq, parent, column = int(row[0]), int(row[1]), str(row[2]), str(row[3])
        groups.setdefault(ident, (parent, []))[1].append((seq, column))
    return [(parent, [c for _, c in sorted(cols)]) for parent, cols in groups.values()]


def _read_with_sql(source: Path, recovered_path: Path) -> None:
    """The `sql` way: every readable row of every table of `source` into `recovered_path`
    (plain tables, no constraints: the new database applies them)."""
    with contextlib.closing(sqlite3.connect(source)) as db:
        try:
            tables = _tables(db)
        except sqlite3.DatabaseError as exc:
            raise StoreError(
                f"the state database's schema is unreadable ({exc}): only SQLite's .recover "
                "can read it; give `--sqlite3 PATH` a sqlite3 shell that has .recover (one "
                "built with SQLITE_ENABLE_DBPAGE_VTAB)"
            ) from exc
        with contextlib.closing(sqlite3.connect(recovered_path, isolation_level=None)) as out:
            out.execute("BEGIN")
            parent_keys: dict[str, list[tuple[object, ...]]] = {}
            for table in _parents_first(db, tables):
                columns = [str(row[1]) for row in db.execute(f'PRAGMA table_info("{table}")')]
                names = ", ".join(f'"{c}"' for c in columns)
                out.execute(f'CREATE TABLE "{table}" ({names})')
                rows = _read_table(db, table, columns, parent_keys)
                marks = ", ".join("?" for _ in columns)
                out.executemany(f'INSERT INTO "{table}" VALUES ({marks})', rows)  # noqa: S608
                key = _key_columns(db, table)
                positions = [columns.index(c) for c in key if c in columns]
                parent_keys[table] = [tuple(row[i] for i in positions) for row in rows]
            out.execute("COMMIT")


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
        shell = recovering_shell(sqlite3_cli)
        if shell is not None:
            version_text = _shell(shell, ["-version"], stdin=None, stdout=None)
            tool = f"sqlite3 {version_text.split(' ')[0]} .recover"
            sql = scratch / "recovered.sql"
            _shell(shell, [str(copy), ".recover"], stdin=None, stdout=sql)
            _shell(shell, [str(recovered_path)], stdin=sql, stdout=None)
        else:
            tool = f"SQL reads (SQLite {sqlite3.sqlite_version}; no sqlite3 shell with .recover)"
            _read_with_sql(copy, recovered_path)
        with contextlib.closing(sqlite3.connect(recovered_path)) as recovered:
            version = _schema_version(recovered)
            if version > len(MIGRATIONS):
                raise StoreNewer(
                    f"the damaged state database has schema version {version}, newer than "
                    f"this agent's {len(MIGRATIONS)}: salvage it with the agent that wrote it",
                    found=version,
                    known=len(MIGRATIONS),
                )
            unattributed = 0
            if "lost_and_found" in _tables(recovered):
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
