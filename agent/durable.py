"""Durable files in the state directory: a private file replaced atomically, a directory's
entries made to last.

    write_atomically(path, data)   `path` becomes `data` (mode 0600) so that a crash leaves the
                                   old file or the new one, never a mix: a temporary file in
                                   the same directory (O_EXCL, O_NOFOLLOW), every byte written
                                   (a write may take fewer than it was given), fsync, rename
                                   over `path`, fsync of the directory
    fsync_directory(directory)     the renames and removals in `directory` survive a crash

The one home of both for the recipient key and its enrollment (`agent.credentials.keys`), the
record of a refused start (`agent.store.statedir`), the record of a salvaged or reset state and the
salvage itself (`agent.store.recovery`, `agent.store.salvage`). Imports nothing of the agent.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Final

__all__ = ["PRIVATE_MODE", "fsync_directory", "write_atomically"]

PRIVATE_MODE: Final = 0o600


def write_atomically(path: Path, data: bytes, *, mode: int = PRIVATE_MODE) -> None:
    """Replace `path` with `data` (module docstring); `OSError` when the disk refuses, and
    nothing is left of the attempt but what was there before."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        temporary.unlink()  # left by a crash of this very pid number
    fd = os.open(
        temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, mode
    )
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise
    fsync_directory(path.parent)


def fsync_directory(directory: Path) -> None:
    """Make the entries of `directory` (renames, removals) durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
