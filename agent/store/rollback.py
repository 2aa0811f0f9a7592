"""`restore-agent state rollback`: the copy taken before a migration back in place.

An agent refuses a database a newer agent migrated (`StoreNewer`, exit 2). Before a migration
changes a database, start-up keeps a copy beside it (`<name>.schema-<version>-<UTC timestamp>`,
`startup.py`). Rolling back to the older agent puts that copy in place, with the agent stopped:

- the migrated database (and its sidecars) is kept aside as `<name>.rolled-back-<timestamp>`;
- the copy is copied (kept too) to `<name>`, 0600, fsync'd;
- `state-recovery.json` is written as for a salvage (`how: salvaged`, `kept`: the migrated
  file), which every agent version that reads the record understands: the next start
  reconciles with each node's Corestore, so what the newer agent left there after the
  migration (a restore's scratch space, a closure import) is taken into cleanup, not lost.

What the newer agent recorded after the migration is not in the copy; the migrated file stays
beside it. Plain files and sqlite3's read-only open only: this never migrates anything.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from agent.errors import StoreError
from agent.store.file_schema import recorded_version
from agent.store.files import SIDECAR_SUFFIXES, beside, move_aside
from agent.store.recovery import RecoveryRecord, write_recovery

__all__ = ["RolledBack", "copies", "roll_back"]


@dataclass(frozen=True, slots=True)
class RolledBack:
    """What a rollback did: the copy now in place, its schema, the migrated file kept."""

    copy: Path
    schema_version: int
    kept: Path | None


def copies(path: Path) -> list[Path]:
    """The copies taken of database `path` before a migration, oldest first (by their UTC
    timestamp, which sorts as text), not their sidecars."""
    return sorted(beside(path, "schema"), key=lambda entry: entry.name.rpartition("-")[2])


def _schema_version(path: Path) -> int:
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
            return recorded_version(db) or 0
    except sqlite3.Error as exc:
        raise StoreError(f"the copy {path} cannot be read as a state database: {exc}") from exc


def roll_back(directory: Path, *, name: str, now: float, copy: str | None = None) -> RolledBack:
    """Put the newest copy (or the one named `copy`) in place of `directory/name`."""
    path = directory / name
    taken = copies(path)
    if copy is not None:
        taken = [entry for entry in taken if entry.name == copy]
        if not taken:
            raise StoreError(f"{directory / copy} is no copy taken before a migration")
    if not taken:
        raise StoreError(
            f"no copy of {path} taken before a migration is in {directory}: there is nothing to "
            "roll back to (a database no migration changed is the older agent's already)"
        )
    chosen = taken[-1]
    version = _schema_version(chosen)
    kept = move_aside(path, now, label="rolled-back") if path.exists() else None
    for suffix in SIDECAR_SUFFIXES:  # a WAL must never be replayed into another database
        path.with_name(path.name + suffix).unlink(missing_ok=True)
    partial = path.with_name(path.name + ".rolling-back")
    shutil.copyfile(chosen, partial)
    partial.chmod(0o600)
    with partial.open("rb") as written:
        os.fsync(written.fileno())
    partial.replace(path)
    write_recovery(  # ends with the directory's fsync: the renames above last with it
        directory, RecoveryRecord(how="salvaged", at=now, kept="" if kept is None else kept.name)
    )
    return RolledBack(chosen, version, kept)
