"""The state directory: what refuses it, how it comes to exist, and the one-agent lock.

    check(directory)   what `run` and `check-config` both refuse, creating nothing
                       (`ConfigError` on `state.directory`, exit 2: a restart cannot fix it):
                       a path that exists but is no directory; a directory the agent cannot
                       write (a read-only file system, e.g. a path outside `ReadWritePaths=`
                       under `ProtectSystem=strict`, or no write permission); a missing
                       directory whose parent is missing too (or cannot be written)
    create(directory)  make the directory itself (mode 0700) when it is missing, never its
                       parents: under systemd `StateDirectory=` creates the real one, so a
                       missing parent means a mistyped path, not a first start
    lock(directory)    `<state>/agent.lock`, held (flock) while the agent runs, whatever the
                       credential source: one agent per state directory. A second one stops
                       with `StartupBlocked` (exit 75: systemd restarts it, and it starts once
                       the first one is gone)

    record_down(directory, ...)
                       `<state>/agent-down.json`: why the agent refused to start (a damaged
                       or newer state database: the refusal's line, its way out, the exit
                       status, when), written by the CLI as it exits; `read_down` is what
                       `restore-agent status` shows when no agent answers; the next start
                       that opens the state removes it (`clear_down`)

    give_back(directory)
                       a command run as root (`rotate-key`, `state salvage`, `state reset`)
                       hands what it wrote in the directory to the directory's owner (under
                       the unit `DynamicUser=`'s, which could not read a root-owned 0600 key
                       or database)

The database (`agent/store/`) and the recipient key (`agent/credentials/keys.py`) are created
inside the directory only after these checks, the lock and the health endpoint's bind passed.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
from pathlib import Path
from typing import Any, Final

from agent.durable import write_atomically
from agent.errors import ConfigError, StartupBlocked

__all__ = [
    "DATABASE_FILE",
    "DOWN_FILE",
    "LOCK_FILE",
    "StateLock",
    "check",
    "clear_down",
    "create",
    "down_unreadable",
    "give_back",
    "lock",
    "read_down",
    "record_down",
]

LOCK_FILE: Final = "agent.lock"
DOWN_FILE: Final = "agent-down.json"
DATABASE_FILE: Final = "state.sqlite3"
"""The state database's name in the directory (`agent.store.DB_NAME`): the commands that
check or salvage it know it without importing the store."""
_MAX_DOWN_BYTES: Final = 64 * 1024

_KEY: Final = "state.directory"
_DIR_MODE: Final = 0o700
_LOCK_MODE: Final = 0o600
_SYSTEMD_HINT: Final = "under systemd, StateDirectory= creates it"


def check(directory: Path) -> None:
    """Refuse (`ConfigError`) a state directory the agent could not use; create nothing."""
    try:
        info = directory.stat()
    except FileNotFoundError:
        _check_parent(directory)
        return
    except OSError as exc:
        raise ConfigError(_KEY, f"{directory}: cannot be read ({exc.strerror or exc})") from exc
    if not stat.S_ISDIR(info.st_mode):
        raise ConfigError(_KEY, f"{directory}: is not a directory")
    if not _writable(directory):
        raise ConfigError(_KEY, f"{directory}: is not writable{_read_only_hint(directory)}")


def _check_parent(directory: Path) -> None:
    parent = directory.parent
    if not parent.is_dir():
        raise ConfigError(
            _KEY,
            f"{directory}: no such directory, and neither is its parent {parent}: the agent "
            f"creates only the directory itself ({_SYSTEMD_HINT}); check the path",
        )
    if not _writable(parent):
        raise ConfigError(
            _KEY,
            f"{directory}: no such directory, and its parent {parent} is not writable"
            f"{_read_only_hint(parent)} ({_SYSTEMD_HINT})",
        )


def _writable(directory: Path) -> bool:
    # access(2) also answers EROFS for a read-only mount, which permission bits do not show.
    return os.access(directory, os.W_OK | os.X_OK)


def _read_only_hint(directory: Path) -> str:
    try:
        read_only = bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    if read_only:
        return " (a read-only file system: under systemd, list it in ReadWritePaths=)"
    return ""


def create(directory: Path) -> bool:
    """Make `directory` (0700) if it is missing, not its parents; True if it was created."""
    check(directory)
    try:
        directory.mkdir(mode=_DIR_MODE)
    except FileExistsError:
        return False
    except OSError as exc:
        raise ConfigError(_KEY, f"{directory}: cannot be created ({exc.strerror or exc})") from exc
    return True


class StateLock:
    """The held lock on a state directory; `close()` releases it (idempotent)."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    def close(self) -> None:
        """Release the lock."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def lock(directory: Path) -> StateLock:
    """Take `<directory>/agent.lock`; `StartupBlocked` while another agent holds it."""
    path = directory / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, _LOCK_MODE)
    except OSError as exc:
        raise ConfigError(_KEY, f"{path}: cannot be opened ({exc.strerror or exc})") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise StartupBlocked(
                _KEY, f"{directory}: another restore-agent uses this state directory"
            ) from None
        raise ConfigError(_KEY, f"{path}: cannot be locked ({exc.strerror or exc})") from exc
    return StateLock(fd)


def record_down(
    directory: Path, *, reason: str, message: str, exit_code: int, at_ms: int, version: str
) -> bool:
    """Write why the agent refused to start (`reason` a stable word, `message` the fatal line)
    to `<directory>/agent-down.json`, atomically; False when it cannot be written (the refusal
    stands all the same: its line is in the journal)."""
    record = {
        "reason": reason,
        "message": message,
        "exitCode": exit_code,
        "at": at_ms,
        "version": version,
    }
    try:
        write_atomically(directory / DOWN_FILE, json.dumps(record, sort_keys=True).encode() + b"\n")
    except OSError:
        return False
    return True


def read_down(directory: Path) -> dict[str, Any] | None:
    """The record `record_down` left, or None (none, unreadable, or not one)."""
    path = directory / DOWN_FILE
    try:
        if path.stat().st_size > _MAX_DOWN_BYTES:
            return None
        record = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("message"), str) else None


def clear_down(directory: Path) -> None:
    """The agent started: a refusal recorded before is over."""
    with contextlib.suppress(OSError):
        (directory / DOWN_FILE).unlink()


def give_back(directory: Path, *, euid: int | None = None) -> list[str]:
    """As root, hand every entry of `directory` (not below it) that another user owns to the
    directory's owner and group; the names changed. Nothing as another user, or when root owns
    the directory itself. systemd gives the unit's `DynamicUser=` the directory (it chowns it
    at start when its owner is not that user), but never a file inside that root made."""
    if (os.geteuid() if euid is None else euid) != 0:
        return []
    owner = directory.stat()
    if owner.st_uid == 0:
        return []
    changed = []
    for entry in sorted(directory.iterdir()):
        held = entry.lstat()
        if (held.st_uid, held.st_gid) != (owner.st_uid, owner.st_gid):
            os.chown(entry, owner.st_uid, owner.st_gid, follow_symlinks=False)
            changed.append(entry.name)
    return changed


def down_unreadable(directory: Path) -> bool:
    """Whether this user cannot look into `directory` for why the agent is down (the unit's
    directory is 0700: only root and the agent's user can)."""
    return directory.exists() and not os.access(directory, os.R_OK | os.X_OK)
