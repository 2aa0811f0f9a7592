"""What a failed write of the state means: the node's disk (full, read-only, failing) or not.

`unwritable_cause(exc, directory)` names the cause of an SQLite or OS error that says the state
cannot be written, or None for any other error:

    disk-full   SQLITE_FULL, ENOSPC, EDQUOT; also an I/O error while the file system of the
                state directory has (almost) no room left: SQLite reports a full disk as
                SQLITE_IOERR when it runs out of room growing its `-shm` or `-wal`
    read-only   SQLITE_READONLY (any extended code), EROFS
    io-error    SQLITE_IOERR (any other extended code), EIO

`store_error(exc, what, directory)` turns one into the agent's error: `StateUnwritable` (wire
code `state-unwritable`, retryable, with its cause) for those, `StoreError` for the rest
(chained). The store and its start-up are the only callers: the one place where a write the
disk refused becomes a named condition instead of `internal`.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path
from typing import Final

from agent.errors import StateUnwritable, StoreError

__all__ = ["CAUSES", "store_error", "unwritable_cause"]

CAUSES: Final = ("disk-full", "read-only", "io-error")
"""Every cause `unwritable_cause` names (the metric's label values)."""

_SQLITE: Final = {13: "disk-full", 8: "read-only", 10: "io-error"}  # FULL, READONLY, IOERR
_OS: Final = {
    errno.ENOSPC: "disk-full",
    errno.EDQUOT: "disk-full",
    errno.EROFS: "read-only",
    errno.EIO: "io-error",
}
# Below this much room an I/O error is the disk being full (SQLite grows its -shm in 32 KiB).
_NEARLY_FULL: Final = 256 * 1024


def unwritable_cause(exc: BaseException, directory: Path | None = None) -> str | None:
    """The cause (`CAUSES`) when `exc` says the state cannot be written, else None."""
    cause: str | None = None
    if isinstance(exc, sqlite3.Error):
        code = getattr(exc, "sqlite_errorcode", None)
        cause = None if code is None else _SQLITE.get(code & 0xFF)
    elif isinstance(exc, OSError):
        cause = _OS.get(exc.errno or 0)
    if cause == "io-error" and directory is not None and _nearly_full(directory):
        return "disk-full"
    return cause


def _nearly_full(directory: Path) -> bool:
    try:
        info = os.statvfs(directory)
    except OSError:
        return False
    return info.f_bavail * info.f_frsize < _NEARLY_FULL


def store_error(exc: BaseException, what: str, directory: Path | None = None) -> StoreError:
    """`StateUnwritable` when `exc` says the disk refused a write, else `StoreError`; the
    caller chains it (`raise store_error(...) from exc`)."""
    text = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
    cause = unwritable_cause(exc, directory)
    if cause is not None:
        return StateUnwritable(
            f"{what}: the node's state cannot be written ({cause}: {text})", cause=cause
        )
    return StoreError(f"{what}: {text}")
