"""Reading what a damaged state database still holds, for `restore-agent state salvage`
(salvage.py's docstring, step 2, says both ways and when each is taken):

    read_damaged(copy, recovered)   every row SQLite can still read of `copy` into the plain
                                    tables of a new file `recovered`; the way it took, said
    recovering_shell(sqlite3_cli)   a sqlite3 shell that can run `.recover`, or None

`.recover` runs in the sqlite3 shell (a subprocess, bounded by a timeout); the fallback reads
with SQL through the standard library's `sqlite3`, around the damaged pages.
"""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
import subprocess
from pathlib import Path
from typing import Final

from agent.errors import StoreError
from agent.store import file_schema

__all__ = ["read_damaged", "recovering_shell"]

_Rows = dict[tuple[object, ...], tuple[object, ...]]  # rows by their key
_TIMEOUT_S: Final = 3600.0


def read_damaged(copy: Path, recovered: Path, *, sqlite3_cli: str | None) -> str:
    """Every row SQLite can still read of the damaged `copy` into a new file `recovered` (its
    tables plain, without constraints: the salvaged database applies them), by `.recover` when
    a shell that has it is found, else by SQL reads; how it was read (for the report)."""
    shell = recovering_shell(sqlite3_cli)
    if shell is None:
        _read_with_sql(copy, recovered)
        return f"SQL reads (SQLite {sqlite3.sqlite_version}; no sqlite3 shell with .recover)"
    version_text = _shell(shell, ["-version"], stdin=None, stdout=None)
    sql = recovered.with_name("recovered.sql")
    _shell(shell, [str(copy), ".recover"], stdin=None, stdout=sql)
    _shell(shell, [str(recovered)], stdin=sql, stdout=None)
    return f"sqlite3 {version_text.split(' ')[0]} .recover"


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
    """Every row of `table` SQLite can still read (`sql` in salvage.py's docstring)."""
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
            tables = file_schema.tables(db)
        except sqlite3.DatabaseError as exc:
            raise StoreError(
                f"the state database's schema is unreadable ({exc}): only SQLite's .recover "
                "can read it; give `--sqlite3 PATH` a sqlite3 shell that has .recover (one "
                "built with SQLITE_ENABLE_DBPAGE_VTAB)"
            ) from exc
        with contextlib.closing(sqlite3.connect(recovered_path, isolation_level=None)) as out:
            out.execute("BEGIN")
            parent_keys: dict[str, list[tuple[object, ...]]] = {}
            for table in file_schema.parents_first(db, tables):
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
