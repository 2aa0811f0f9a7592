"""File-system edges of the state database: private modes, damaged files set aside, size.

The directory is 0700 and the database 0600 whatever the umask: the file is created by us with
`O_CREAT` and mode 0600 before SQLite opens it, and SQLite gives its `-wal` and `-shm` files the
database file's mode. Existing paths are tightened, never loosened.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import Final

__all__ = [
    "DB_MODE",
    "DIR_MODE",
    "SIDECAR_SUFFIXES",
    "beside",
    "database_bytes",
    "ensure_private_directory",
    "ensure_private_file",
    "move_aside",
    "moved_aside",
]

DIR_MODE: Final = 0o700
DB_MODE: Final = 0o600
SIDECAR_SUFFIXES: Final = ("-wal", "-shm", "-journal")


def ensure_private_directory(directory: Path) -> None:
    """Create `directory` (and parents) if missing and make it 0700."""
    directory.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    if stat.S_IMODE(directory.stat().st_mode) != DIR_MODE:
        directory.chmod(DIR_MODE)


def ensure_private_file(path: Path) -> None:
    """Create `path` empty with mode 0600 if missing; make an existing one 0600."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, DB_MODE)
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) != DB_MODE:
            os.fchmod(fd, DB_MODE)
    finally:
        os.close(fd)
    for suffix in SIDECAR_SUFFIXES:
        sidecar = path.with_name(path.name + suffix)
        if sidecar.exists() and stat.S_IMODE(sidecar.stat().st_mode) != DB_MODE:
            sidecar.chmod(DB_MODE)


def move_aside(path: Path, now: float, *, label: str = "corrupt") -> Path:
    """Rename `path` to `<name>.<label>-<UTC timestamp>` (its sidecars alike); return the name.

    A numeric suffix keeps an earlier moved-aside file from being overwritten. The sidecars
    travel with it because an old WAL must never be replayed into a fresh database.
    """
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    base = path.with_name(f"{path.name}.{label}-{stamp}")
    destination = base
    counter = 1
    while destination.exists():
        destination = base.with_name(f"{base.name}.{counter}")
        counter += 1
    path.rename(destination)
    for suffix in SIDECAR_SUFFIXES:
        sidecar = path.with_name(path.name + suffix)
        if sidecar.exists():
            sidecar.rename(destination.with_name(destination.name + suffix))
    return destination


def beside(path: Path, label: str) -> list[Path]:
    """The files beside database `path` named `<name>.<label>-*` (`move_aside`'s names, and the
    copies taken before a migration, `schema`), not their sidecars, by name."""
    prefix = f"{path.name}.{label}-"
    return [
        path.with_name(name)
        for name in sorted(entry.name for entry in path.parent.iterdir())
        if name.startswith(prefix) and not name.endswith(SIDECAR_SUFFIXES)
    ]


def moved_aside(path: Path) -> list[Path]:
    """The damaged databases an earlier start moved aside beside `path` (`<name>.corrupt-*`,
    not their sidecars), oldest name first: until an operator salvages or resets the state,
    each means records the agent lost."""
    try:
        return beside(path, "corrupt")
    except OSError:
        return []


def database_bytes(path: Path) -> int:
    """The bytes the database takes on disk now: its file and its WAL (absent ones count 0)."""
    total = 0
    for name in (path, path.with_name(path.name + "-wal")):
        try:
            total += name.stat().st_size
        except OSError:
            continue
    return total
