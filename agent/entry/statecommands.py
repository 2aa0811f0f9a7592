"""`restore-agent state salvage|reset|rollback`: an operator's way out of a damaged state
database, or back to the agent before a migration, with the agent stopped (each takes the state
directory's lock: refused, exit 75, while an agent runs on it). Run as root, what they write in
the state directory is handed to its owner, the unit's `DynamicUser=` (`statedir.give_back`);
`rotate-key` does the same (agent/entry/cli.py).
"""

from __future__ import annotations

import contextlib
import importlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from agent.config import Config
from agent.entry.exits import EXIT_CRASH, EXIT_OK, PROG, fatal_line
from agent.errors import StartupBlocked, StoreError, StoreNewer
from agent.store import statedir

__all__ = ["NEXT_START", "give_back", "held_state", "reset", "rollback", "salvage", "stopped"]

NEXT_START: Final = (
    "  next: systemctl start restore-agent; once connected it lists what each node's Corestore "
    "holds and takes what the state does not know into cleanup (restore-agent status)"
)


def held_state(config: Config) -> statedir.StateLock:
    """The state directory's lock, for a command that must not run beside an agent."""
    directory = config.state.directory
    statedir.check(directory)
    try:
        return statedir.lock(directory)
    except StartupBlocked:
        raise StartupBlocked(
            "state.directory",
            f"{directory}: a restore-agent runs on this state directory: stop it first "
            "(systemctl stop restore-agent)",
        ) from None


@contextlib.contextmanager
def stopped(config: Config) -> Iterator[Path]:
    """The state directory, held (no agent runs on it) for the block; once the block ends
    without an error, what root wrote there is handed to its owner."""
    held = held_state(config)
    try:
        yield config.state.directory
    finally:
        held.close()
    give_back(config.state.directory)


def give_back(directory: Path) -> None:
    """Root wrote in the state directory: its owner (the unit's user) gets it back."""
    changed = statedir.give_back(directory)
    if changed:
        print(f"  handed to the state directory's owner: {', '.join(changed)}")


def salvage(config: Config, *, sqlite3_cli: str | None) -> int:
    """`restore-agent state salvage` (agent/store/salvage.py)."""
    salvaging = importlib.import_module("agent.store.salvage")
    try:
        with stopped(config) as directory:
            report = salvaging.salvage(
                directory, name=statedir.DATABASE_FILE, now=time.time(), sqlite3_cli=sqlite3_cli
            )
    except StoreNewer:
        raise
    except StoreError as exc:
        fatal_line(f"{PROG}: state salvage: {exc}")
        return EXIT_CRASH
    print(f"state salvaged: {report.database} (schema version {report.schema_version})")
    print(f"  read with:    {report.tool}")
    print(f"  damaged copy: {report.kept.name} (kept)")
    rows = [("TABLE", "RECOVERED", "KEPT", "DROPPED")] + [
        (table, str(c.recovered), str(c.kept), str(c.dropped))
        for table, c in sorted(report.tables.items())
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        numbers = zip(row[1:], widths[1:], strict=True)
        cells = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in numbers]
        print("  " + "  ".join(cells))
    if report.unattributed:
        print(
            f"  {report.unattributed} rows SQLite found belong to no table any more: not restored"
        )
    print(NEXT_START)
    return EXIT_OK


def reset(config: Config) -> int:
    """`restore-agent state reset --start-empty` (agent/store/salvage.py)."""
    salvage = importlib.import_module("agent.store.salvage")
    with stopped(config) as directory:
        kept = salvage.reset(directory, name=statedir.DATABASE_FILE, now=time.time())
    where = config.state.directory / statedir.DATABASE_FILE
    print(f"state reset: {where} starts empty at the next start")
    if kept is not None:
        print(f"  previous database: {kept.name} (kept)")
    print(NEXT_START)
    return EXIT_OK


def rollback(config: Config, *, copy: str | None) -> int:
    """`restore-agent state rollback` (agent/store/rollback.py)."""
    rolling = importlib.import_module("agent.store.rollback")
    try:
        with stopped(config) as directory:
            done = rolling.roll_back(
                directory, name=statedir.DATABASE_FILE, now=time.time(), copy=copy
            )
    except StoreError as exc:
        fatal_line(f"{PROG}: state rollback: {exc}")
        return EXIT_CRASH
    where = config.state.directory / statedir.DATABASE_FILE
    print(f"state rolled back: {where} is {done.copy.name} (schema version {done.schema_version})")
    if done.kept is not None:
        print(f"  migrated database: {done.kept.name} (kept)")
    print(
        "  next: install the agent that wrote schema version "
        f"{done.schema_version} (docs/operations.md, 'Upgrading and rolling back'), then "
        "systemctl start restore-agent; once connected it reconciles with each node's Corestore"
    )
    return EXIT_OK
