"""The secrets the configuration names, read from their files.

The model holds no secret, only the paths of the files that hold them: `read_secret_file()`
reads one (owner-only permissions, one line) into a `Secret`, and `load_secrets(config)` reads
the machine token and, only with `[corestore] credential_source = "file"` (a development
option), the Corestore credential: by default each node's credential is sealed by Cloudly to the
agent's own key and never comes from a file (docs/credentials.md). A secret file may be named
`${CREDENTIALS_DIRECTORY}/NAME`: the systemd credential NAME (`LoadCredential=NAME:...`), looked
up in the directory systemd names in that variable when the secret is read, so no config holds
a `/run/credentials/...` path.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from agent.config.fields import CREDENTIALS_PREFIX, CREDENTIALS_VARIABLE, KiB
from agent.errors import ConfigError
from agent.secret import Secret

if TYPE_CHECKING:
    from agent.config.sections import Config

__all__ = [
    "Secrets",
    "credential_path",
    "is_credential",
    "load_secrets",
    "read_secret_file",
]

# A secret file larger than this is the wrong file, not a token.
_MAX_SECRET_BYTES: Final = 64 * KiB


def is_credential(path: Path) -> bool:
    """Whether `path` names a systemd credential (`${CREDENTIALS_DIRECTORY}/NAME`)."""
    return bool(path.parts) and path.parts[0] == CREDENTIALS_PREFIX


def credential_path(path: Path, key: str, environ: Mapping[str, str] | None = None) -> Path:
    """`path` with a leading `${CREDENTIALS_DIRECTORY}` replaced by that variable's value.

    Raises `ConfigError` naming `key` when the path names the variable and it is unset or not
    absolute (the agent was not started by a unit with `LoadCredential=`).
    """
    if not is_credential(path):
        return path
    directory = (os.environ if environ is None else environ).get(CREDENTIALS_VARIABLE, "")
    if not directory or not Path(directory).is_absolute():
        raise ConfigError(
            key,
            f"{path}: ${CREDENTIALS_VARIABLE} is not set (start the agent from its systemd unit, "
            "which sets it with LoadCredential=, or name a file)",
        )
    return Path(directory) / path.parts[1]


def read_secret_file(path: Path, key: str) -> Secret:
    """The one-line secret in the file at `path`; `key` names the config key for errors.

    `path` may name a systemd credential (`${CREDENTIALS_DIRECTORY}/NAME`). Refuses a missing,
    non-regular, empty, multi-line or oversized file and one that group or others may access.
    One trailing newline is stripped. The composition root registers the value with the log
    redactor (`agent.entry.app.run`), so it cannot appear in log output.
    """
    path = credential_path(path, key)
    try:
        # O_NONBLOCK: a FIFO put there by mistake must not hang start-up.
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK)
    except FileNotFoundError as exc:
        raise ConfigError(key, f"{path}: no such file") from exc
    except OSError as exc:
        raise ConfigError(key, f"{path}: cannot be read ({exc.strerror or exc})") from exc
    try:
        raw = _read_owner_only(fd, path, key)
    finally:
        os.close(fd)
    if len(raw) > _MAX_SECRET_BYTES:
        raise ConfigError(key, f"{path}: is larger than {_MAX_SECRET_BYTES // KiB} KiB")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(key, f"{path}: is not UTF-8 text") from exc
    text = text.removesuffix("\n").removesuffix("\r")
    if not text:
        raise ConfigError(key, f"{path}: is empty")
    if "\n" in text or "\r" in text:
        raise ConfigError(key, f"{path}: must hold a single line")
    if text != text.strip():
        raise ConfigError(key, f"{path}: has leading or trailing whitespace")
    secret = Secret(text)
    return secret


def _read_owner_only(fd: int, path: Path, key: str) -> bytes:
    """Up to one byte more than the size limit from `fd`, after checking what it is."""
    # fstat on the open descriptor: the checked file is the file that is read.
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(key, f"{path}: is not a regular file")
    if info.st_mode & 0o077:
        mode = stat.S_IMODE(info.st_mode)
        raise ConfigError(
            key, f"{path}: group or others have access (mode {mode:04o}); use 0600 or 0400"
        )
    chunks: list[bytes] = []
    remaining = _MAX_SECRET_BYTES + 1
    try:
        while remaining > 0 and (chunk := os.read(fd, remaining)):
            chunks.append(chunk)
            remaining -= len(chunk)
    except OSError as exc:
        raise ConfigError(key, f"{path}: cannot be read ({exc.strerror or exc})") from exc
    return b"".join(chunks)


@dataclass(frozen=True, slots=True)
class Secrets:
    """The secrets the configuration names, read from their files. `corestore_credential` is
    None unless `corestore.credential_source = "file"`."""

    machine_token: Secret
    corestore_credential: Secret | None = None

    def all(self) -> tuple[Secret, ...]:
        """Every secret, for the log redactor."""
        credential = self.corestore_credential
        return (self.machine_token,) if credential is None else (self.machine_token, credential)


def load_secrets(config: Config) -> Secrets:
    """Read the secret files `config` names; raise `ConfigError` naming the key that failed."""
    path = config.corestore.credential_file
    return Secrets(
        machine_token=read_secret_file(config.cloudly.token_file, "cloudly.token_file"),
        corestore_credential=(
            None if path is None else read_secret_file(path, "corestore.credential_file")
        ),
    )
