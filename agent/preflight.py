"""The start-up checks `run` makes before it creates or connects anything, shared with
`check-config` so that "config OK" means `run` would start.

`check(config)` raises the `ConfigError` start-up would stop with (exit 2: a restart cannot fix
it) and returns what it read, so `run` reads nothing twice:

    the secret files      `cloudly.token_file` and, with the file option,
                          `corestore.credential_file` (owner-only, one line); not read again
                          when the caller passes them, nor at all with `read_secrets=False`
                          (`check-config` outside the unit, where the systemd credentials
                          they name do not exist)
    the CA file           `cloudly.ca_file`, loaded into the TLS context the session uses
                          (wss:// only, as the session)
    the state directory   `agent.statedir.check`: a directory the agent can write, or a
                          missing one whose parent exists
    the recipient key     with the sealed source, an existing `recipient.key` must be a private
                          32-byte file (`agent.credentials.keys.check_key_file`)

The configuration text itself was checked by `load_config` (that includes the cleartext rule
of `cloudly.url`). What only `run` can check comes after these, in this order: the health
address binds and no other agent holds the state directory (`StartupBlocked`, exit 75: both
usually pass), then the key and the database are created or opened.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from pathlib import Path

from agent import statedir
from agent.config import (
    CREDENTIALS_VARIABLE,
    Config,
    Secrets,
    credential_path,
    is_credential,
    load_secrets,
)
from agent.credentials.keys import check_key_file
from agent.errors import ConfigError

__all__ = ["Checked", "check", "tls_context"]


@dataclass(frozen=True, slots=True)
class Checked:
    """What the checks read: the secrets (None when not read) and the TLS context for wss://
    (None for ws://, or when the CA file is a credential that was not read)."""

    secrets: Secrets | None
    tls: ssl.SSLContext | None


def check(config: Config, *, secrets: Secrets | None = None, read_secrets: bool = True) -> Checked:
    """Every check start-up makes before it creates anything; `ConfigError` naming the key."""
    if secrets is None and read_secrets:
        secrets = load_secrets(config)
    tls = tls_context(config, read_credentials=read_secrets)
    directory = config.state.directory
    statedir.check(directory)
    if config.corestore.credential_source == "sealed" and directory.is_dir():
        check_key_file(directory)
    return Checked(secrets=secrets, tls=tls)


def tls_context(config: Config, *, read_credentials: bool = True) -> ssl.SSLContext | None:
    """The verifying context for a wss:// Cloudly URL: the system's trust store, or
    `cloudly.ca_file`'s certificates; None for ws://."""
    if not config.websocket_url.startswith("wss://"):
        return None
    ca_file = config.cloudly.ca_file
    if ca_file is None:
        return ssl.create_default_context()
    if is_credential(ca_file) and not (read_credentials or os.environ.get(CREDENTIALS_VARIABLE)):
        return None
    path: Path = credential_path(ca_file, "cloudly.ca_file")
    try:
        return ssl.create_default_context(cafile=str(path))
    except FileNotFoundError as exc:
        raise ConfigError("cloudly.ca_file", f"{path}: no such file") from exc
    except IsADirectoryError as exc:
        raise ConfigError("cloudly.ca_file", f"{path}: is a directory, not a file") from exc
    except ssl.SSLError as exc:
        raise ConfigError(
            "cloudly.ca_file", f"{path}: holds no usable PEM CA certificate ({exc.reason})"
        ) from exc
    except OSError as exc:
        reason = f"{path}: cannot be read ({exc.strerror or exc})"
        raise ConfigError("cloudly.ca_file", reason) from exc
