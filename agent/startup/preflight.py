"""The start-up checks `run` makes before it creates or connects anything, shared with
`check-config` so that "config OK" means `run` would start: the one preflight. Neither command
skips a check the other makes.

`check(config)` raises the `ConfigError` start-up would stop with (exit 2: a restart cannot fix
it) and returns what it read, so `run` reads nothing twice:

    the secret files      `cloudly.token_file` and, with the file option,
                          `corestore.credential_file` (owner-only, one line); not read again
                          when the caller passes them. A file named as a systemd credential
                          needs `$CREDENTIALS_DIRECTORY`: outside the unit both commands refuse
                          it (readme.md's step 4 checks the config as the unit runs it)
    the CA file           `cloudly.ca_file`, loaded into the TLS context the session uses
                          (wss:// only, as the session)
    the state directory   `agent.store.statedir.check`: a directory the agent can write, or a
                          missing one whose parent exists
    the recipient key     with the sealed source, an existing `recipient.key` must be a private
                          32-byte file (`agent.credentials.keys.check_key_file`)
    the shutdown budget   `[shutdown]`: the drain and the six close steps (each bounded by
                          its timeout plus a second of grace, `longest_stop`) must end before
                          systemd kills the agent (`stop_timeout_s`, the unit's
                          `TimeoutStopSec=`)

It also says what start-up will tighten without refusing it (`Checked.tightens`): a state
directory or database file that group or others may use is made 0700 / 0600; `check-config`
prints each, `run` logs them (`state_permissions_tightened`).

The configuration text itself was checked by `load_config` (that includes the cleartext rule
of `cloudly.url`). What only `run` can check comes after these, in this order: the health
address binds and no other agent holds the state directory (`StartupBlocked`, exit 75: both
usually pass), then the key and the database are created or opened.
"""

from __future__ import annotations

import ssl
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from agent.config import Config, Secrets, ShutdownConfig, credential_path, load_secrets
from agent.credentials.keys import check_key_file
from agent.errors import ConfigError
from agent.store import statedir

__all__ = [
    "CLOSE_STEPS",
    "STEP_GRACE_S",
    "Checked",
    "check",
    "longest_stop",
    "shutdown_budget",
    "tls_context",
]

CLOSE_STEPS: Final = 6
"""The bounded steps after the drain (agent/entry/app.py): the Cloudly socket, the engine's work,
the relay's jobs, the health server, the Corestore clients, the store."""
STEP_GRACE_S: Final = 1.0
"""How far each step of a stop, the drain included, may overrun its bound before it is
abandoned (agent/entry/shutdown.py)."""
_DIR_MODE: Final = 0o700
_FILE_MODE: Final = 0o600


@dataclass(frozen=True, slots=True)
class Checked:
    """What the checks read: the secrets and the TLS context for wss:// (None for ws://),
    and what start-up will tighten (one sentence each)."""

    secrets: Secrets
    tls: ssl.SSLContext | None
    tightens: tuple[str, ...] = ()


def check(config: Config, *, secrets: Secrets | None = None) -> Checked:
    """Every check start-up makes before it creates anything; `ConfigError` naming the key."""
    if secrets is None:
        secrets = load_secrets(config)
    tls = tls_context(config)
    directory = config.state.directory
    statedir.check(directory)
    if config.corestore.credential_source == "sealed" and directory.is_dir():
        check_key_file(directory)
    shutdown_budget(config)
    return Checked(secrets=secrets, tls=tls, tightens=_tightens(directory))


def longest_stop(shutdown: ShutdownConfig) -> float:
    """The longest an ordered stop may take: the drain, then each close step, each with its
    grace (agent/entry/app.py)."""
    drain, close = shutdown.drain_timeout_s, shutdown.close_timeout_s
    return drain + STEP_GRACE_S + CLOSE_STEPS * (close + STEP_GRACE_S)


def shutdown_budget(config: Config) -> float:
    """`longest_stop`; `ConfigError` on `shutdown.drain_timeout_s` unless it ends before
    `stop_timeout_s`."""
    shutdown = config.shutdown
    budget = longest_stop(shutdown)
    if budget >= shutdown.stop_timeout_s:
        raise ConfigError(
            "shutdown.drain_timeout_s",
            f"a stop may take {budget:g} s (drain_timeout_s {shutdown.drain_timeout_s:g} and "
            f"{CLOSE_STEPS} close steps of close_timeout_s {shutdown.close_timeout_s:g}, each "
            f"step + {STEP_GRACE_S:g} s), not below shutdown.stop_timeout_s "
            f"{shutdown.stop_timeout_s:g} (the unit's TimeoutStopSec=): systemd would kill the "
            "agent mid-drain; lower them, or raise TimeoutStopSec= and stop_timeout_s together",
        )
    return budget


def _tightens(directory: Path) -> tuple[str, ...]:
    """What start-up makes private without refusing it: the directory 0700, the database
    and its sidecars 0600 (agent/store/files.py)."""
    found: list[str] = []
    for path, wanted, key in (
        (directory, _DIR_MODE, "state.directory"),
        *(
            (directory / f"{statedir.DATABASE_FILE}{suffix}", _FILE_MODE, "the state database")
            for suffix in ("", "-wal", "-shm")
        ),
    ):
        try:
            mode = stat.S_IMODE(path.stat().st_mode)
        except OSError:
            continue  # missing: created with the private mode
        if mode != wanted:
            found.append(f"{key} {path}: mode {mode:04o}, start-up makes it {wanted:04o}")
    return tuple(found)


def tls_context(config: Config) -> ssl.SSLContext | None:
    """The verifying context for a wss:// Cloudly URL: the system's trust store, or
    `cloudly.ca_file`'s certificates; None for ws://."""
    if not config.websocket_url.startswith("wss://"):
        return None
    ca_file = config.cloudly.ca_file
    if ca_file is None:
        return ssl.create_default_context()
    path: Path = credential_path(ca_file, "cloudly.ca_file")
    try:
        return ssl.create_default_context(cafile=str(path))
    except FileNotFoundError as exc:
        raise ConfigError("cloudly.ca_file", f"{path}: no such file") from exc
    except IsADirectoryError as exc:
        raise ConfigError("cloudly.ca_file", f"{path}: is a directory, not a file") from exc
    except ssl.SSLError as exc:
        raise ConfigError(
            "cloudly.ca_file", f"{path}: holds no usable PEM CA certificate ({_ssl_reason(exc)})"
        ) from exc
    except OSError as exc:
        reason = f"{path}: cannot be read ({exc.strerror or exc})"
        raise ConfigError("cloudly.ca_file", reason) from exc


def _ssl_reason(exc: ssl.SSLError) -> str:
    """What OpenSSL found, in words: its reason code (`NO_CERTIFICATE_OR_CRL_FOUND`: no
    certificate at all), or, when it gives none (a BEGIN CERTIFICATE block that does not
    decode: `[X509] PEM lib`), that."""
    if exc.reason:
        return str(exc.reason).lower().replace("_", " ")
    return "a certificate block that does not decode as PEM"
