"""The agent's configuration: a frozen pydantic model tree loaded from one TOML file.

`load_config(path)` turns every way a file can be wrong (missing, not TOML, unknown key, wrong
type, out of range) into one `ConfigError` naming the dotted key (`cloudly.url`) and the
reason. Relative paths in the file are resolved against the file's directory.

The model holds no secret, only the paths of the files that hold them: `read_secret_file()`
reads one (owner-only permissions, one line) into a `Secret`, and `load_secrets(config)` reads
the machine token and, only with `[corestore] credential_source = "file"` (a development
option), the Corestore credential: by default each node's credential is sealed by Cloudly to the
agent's own key and never comes from a file (docs/credentials.md). A secret file may be named
`${CREDENTIALS_DIRECTORY}/NAME`: the systemd credential NAME (`LoadCredential=NAME:...`), looked
up in the directory systemd names in that variable when the secret is read, so no config holds
a `/run/credentials/...` path. `config.example.toml` at the repository root documents every key.

`[health]` names the local health endpoint, the agent's only listener: a loopback TCP address
(an IP literal in 127.0.0.0/8 or ::1; anything else is refused) or `unix:/absolute/path`.
"""

from __future__ import annotations

import ipaddress
import math
import os
import stat
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, datetime, time
from pathlib import Path
from typing import Annotated, Any, Final, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)
from pydantic_core import ErrorDetails

from agent.errors import ConfigError
from agent.protocol.chunks import ChunkForm
from agent.protocol.settings import ConnectionSettings
from agent.retry import Backoff
from agent.secret import Secret
from agent.transfers.budget import DEFAULT_BUDGET_BYTES
from agent.transfers.limits import DEFAULT_MAX_PER_NODE

__all__ = [
    "CREDENTIALS_VARIABLE",
    "CloudlyConfig",
    "Config",
    "CorestoreConfig",
    "HealthConfig",
    "HealthListen",
    "LogConfig",
    "MemoryConfig",
    "Secrets",
    "ShutdownConfig",
    "StateConfig",
    "StreamsConfig",
    "credential_path",
    "is_credential",
    "load_config",
    "load_secrets",
    "read_secret_file",
    "websocket_url",
]

KiB: Final = 1024
MiB: Final = 1024 * KiB

# A secret file larger than this is the wrong file, not a token.
_MAX_SECRET_BYTES: Final = 64 * KiB
# Durations above one day are typos, not intentions.
_MAX_SECONDS: Final = 86_400.0

_URL_SCHEMES: Final = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}
_CLEARTEXT_SCHEMES: Final = frozenset({"http", "ws"})

# The protocol's defaults are the configuration's: each is written once, in agent.protocol.
_CONNECTION: Final = ConnectionSettings()
_STREAMS: Final = _CONNECTION.streams
_RECEIVE_BUDGET: Final = _CONNECTION.receive_budget or 4 * MiB

# Keys that were renamed: an old file fails naming the new key (they mean the same).
_RENAMED: Final = {"streams.keepalive_timeout_s": "streams.idle_timeout_s"}

# A secret file named `${CREDENTIALS_DIRECTORY}/NAME` is the systemd credential NAME.
CREDENTIALS_VARIABLE: Final = "CREDENTIALS_DIRECTORY"
_CREDENTIALS_PREFIX: Final = "${" + CREDENTIALS_VARIABLE + "}"


def _refuse_empty_path(value: object) -> object:
    # Path("") is Path("."): refuse it before it silently means "this directory".
    if value == "":
        raise ValueError("must not be empty")
    return value


def _resolve_path(value: Path, info: ValidationInfo) -> Path:
    if value.parts and value.parts[0] == _CREDENTIALS_PREFIX:
        if len(value.parts) != 2 or value.parts[1] in (".", ".."):
            raise ValueError(f"must be {_CREDENTIALS_PREFIX}/NAME, one credential name")
        return value  # resolved when the secret is read (`credential_path`)
    if "${" in str(value):
        raise ValueError(f"may name no variable but {_CREDENTIALS_PREFIX}, as its first part")
    base = info.context.get("base_dir") if isinstance(info.context, dict) else None
    if not value.is_absolute() and isinstance(base, Path):
        return base / value
    return value


# Paths come from TOML strings, which strict mode would refuse for `Path`.
FilePath = Annotated[
    Path,
    Field(strict=False),
    BeforeValidator(_refuse_empty_path),
    AfterValidator(_resolve_path),
]
Seconds = Annotated[float, Field(gt=0, le=_MAX_SECONDS, allow_inf_nan=False)]
# Polling Corestore more often than 100 times a second only loads it; less often than once a
# minute only delays every resource restore.
PollSeconds = Annotated[float, Field(ge=0.01, le=60.0, allow_inf_nan=False)]
NonNegativeSeconds = Annotated[float, Field(ge=0, le=_MAX_SECONDS, allow_inf_nan=False)]


class _Section(BaseModel):
    """Exact (unknown keys refused), strict (no `"30"` for 30) and frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class CloudlyConfig(_Section):
    """`[cloudly]`: the outbound session to Cloudly."""

    # Before `url`: its check reads it.
    allow_cleartext: bool = False
    url: str
    token_file: FilePath
    ca_file: FilePath | None = None
    max_frame_bytes: Annotated[int, Field(ge=1 * MiB, le=256 * MiB)] = 16 * MiB
    compression: bool = False
    call_timeout_s: Seconds = 30.0
    ping_interval_s: Seconds = 10.0
    ping_timeout_s: Seconds = 30.0
    backoff_base_s: Seconds = 1.0
    backoff_cap_s: Seconds = 60.0
    stable_after_s: NonNegativeSeconds = 60.0
    identity_renew_margin_s: NonNegativeSeconds = 300.0
    recipient_check_s: Seconds = 10.0
    tag_name: Annotated[str, Field(min_length=1)] = "restore-agent"
    tag_payload: Mapping[str, Any] = Field(default_factory=dict)
    # Seats per request class (agent.protocol.admission): control requests, requests that
    # carry or wait for a stream, and of those one node's share.
    max_concurrent_requests: Annotated[int, Field(ge=1, le=4096)] = (
        _CONNECTION.max_concurrent_requests
    )
    max_stream_requests: Annotated[int, Field(ge=1, le=16384)] = _CONNECTION.max_stream_requests
    max_stream_requests_per_node: Annotated[int, Field(ge=1, le=16384)] = (
        _CONNECTION.max_stream_requests_per_node
    )

    @field_validator("url")
    @classmethod
    def _check_url(cls, url: str, info: ValidationInfo) -> str:
        try:
            parts = urlsplit(url)
            _ = parts.port  # parsing the port raises ValueError when it is not a number
        except ValueError as exc:
            raise ValueError(f"is not a valid URL ({exc})") from exc
        if parts.scheme not in _URL_SCHEMES:
            raise ValueError("must start with http://, https://, ws:// or wss://")
        if not parts.hostname:
            raise ValueError("names no host")
        if parts.username is not None or parts.password is not None:
            raise ValueError("must not carry credentials; the machine token goes in token_file")
        if parts.fragment:
            raise ValueError("must not have a #fragment")
        if _is_cleartext_remote(url) and not info.data.get("allow_cleartext", False):
            raise ValueError(
                f"{parts.scheme}:// to {parts.hostname}, which is not loopback, would send the "
                "machine token and every request unencrypted: use https:// (or wss://), or set "
                "cloudly.allow_cleartext = true if that is meant"
            )
        return url

    @field_validator("backoff_cap_s")
    @classmethod
    def _check_backoff_cap(cls, cap: float, info: ValidationInfo) -> float:
        base = info.data.get("backoff_base_s")
        if base is None:
            return cap
        try:
            Backoff(base=base, cap=cap)  # the one rule of a backoff's shape (`agent.retry`)
        except ValueError:
            raise ValueError(
                f"must be >= backoff_base_s ({_number(base)}), got {_number(cap)}"
            ) from None
        return cap

    @field_validator("tag_payload")
    @classmethod
    def _check_tag_payload(cls, payload: Mapping[str, Any]) -> Mapping[str, Any]:
        _require_json_value(payload, "")
        return payload

    @property
    def websocket_url(self) -> str:
        """`url` with http(s) mapped to ws(s)."""
        return websocket_url(self.url)

    @property
    def cleartext_allowed(self) -> bool:
        """Whether the session runs unencrypted to a host that is not loopback (only with
        `allow_cleartext`; the agent warns at start-up)."""
        return _is_cleartext_remote(self.url)


def websocket_url(url: str) -> str:
    """The websocket URL to dial for the Cloudly URL `url`: http(s) becomes ws(s), ws(s) and the
    rest of the URL stay. Anything else is a `ConfigError` naming `cloudly.url`. The one place
    the mapping is made (the session dials what this returns)."""
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise ConfigError("cloudly.url", "must be an http, https, ws or wss URL") from exc
    scheme = _URL_SCHEMES.get(parts.scheme)  # urlsplit lowercases the scheme
    if scheme is None or not parts.netloc:
        raise ConfigError("cloudly.url", "must be an http, https, ws or wss URL")
    return urlunsplit(parts._replace(scheme=scheme))


def _is_cleartext_remote(url: str) -> bool:
    """An http:// or ws:// URL whose host is not loopback (`localhost`, 127.0.0.0/8, ::1)."""
    parts = urlsplit(url)
    if parts.scheme not in _CLEARTEXT_SCHEMES:
        return False
    host = (parts.hostname or "").lower()
    if host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True  # a name: where it resolves to is not ours to trust


def _require_json_value(value: Any, where: str) -> None:
    """Refuse what TOML can say but JSON cannot carry (dates and times, inf, nan)."""
    at = f" at {where}" if where else ""
    if isinstance(value, datetime | date | time):
        # pydantic turns only ValueError into a validation error.
        raise ValueError(f"holds a TOML date/time{at}, which JSON cannot carry")  # noqa: TRY004
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"holds {value}{at}, which JSON cannot carry")
    if isinstance(value, Mapping):
        for key, item in value.items():
            _require_json_value(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _require_json_value(item, f"{where}[{index}]")


class CorestoreConfig(_Section):
    """`[corestore]`: the nodes' Corestore control API.

    `credential_source` says where each node's bearer comes from: `"sealed"` (the default, and
    what production runs) fetches it per node from Cloudly, sealed to the agent's own X25519 key
    (docs/credentials.md); `"file"` is a development option that sends the one bearer in
    `credential_file` to every node. `credential_file` is required with `"file"` and refused
    otherwise, so a config cannot name a file that is silently not used.
    """

    credential_source: Literal["sealed", "file"] = "sealed"
    # validate_default: the rule below must also see a credential_file that was left out.
    credential_file: FilePath | None = Field(default=None, validate_default=True)
    chunk_size: Annotated[int, Field(ge=64 * KiB, le=16 * MiB)] = 4 * MiB
    max_in_flight: Annotated[int, Field(ge=1, le=32)] = 4
    connect_timeout_s: Seconds = 5.0
    request_timeout_s: Seconds = 60.0
    # One chunk PUT, object commit (Corestore re-hashes the object) or resource verification.
    transfer_timeout_s: Seconds = 300.0
    retries: Annotated[int, Field(ge=0, le=10)] = 3
    # How long an outage of a node's Corestore its idempotent calls ride out (0: `retries`).
    outage_tolerance_s: NonNegativeSeconds = 120.0
    restore_poll_interval_s: PollSeconds = 1.0
    # Transfers (stages, closure exports and imports) moving bytes to or from one node's
    # Corestore at once; more wait their turn, first come first served, per node.
    max_transfers_per_node: Annotated[int, Field(ge=1, le=64)] = DEFAULT_MAX_PER_NODE
    # Bytes per second to or from one node's Corestore, its transfers together (None: no limit).
    max_bytes_per_s_per_node: Annotated[int, Field(ge=MiB, le=1024 * 1024 * MiB)] | None = None

    @field_validator("credential_file")
    @classmethod
    def _check_credential_file(cls, path: Path | None, info: ValidationInfo) -> Path | None:
        source = info.data.get("credential_source")
        if source == "file" and path is None:
            raise ValueError('is required with credential_source = "file"')
        if source != "file" and path is not None:
            raise ValueError(
                'is only used with credential_source = "file" (the default "sealed" fetches '
                "each node's credential from Cloudly)"
            )
        return path


class StateConfig(_Section):
    """`[state]`: where the revision store and the agent's key live, and how long finished
    records stay (docs/operations.md, "Retention")."""

    directory: FilePath = Path("/var/lib/restore-agent")
    # Days a cleaned restore or a finished relay job stays in the store after its last change.
    # 30: far past any repeat Cloudly may still send (a call's timeout and retries are minutes,
    # an isolated restore's lifetime is capped by Cloudly's maximum TTL) and a month of history
    # in /v1/restores and /v1/jobs. At most ten years.
    retention_days: Annotated[int, Field(ge=1, le=3650)] = 30


class StreamsConfig(_Section):
    """`[streams]`: VirtualStream flow control and chunk encoding (defaults: the protocol's)."""

    window: Annotated[int, Field(ge=1, le=256)] = _STREAMS.window
    window_bytes: Annotated[int, Field(ge=1 * MiB, le=256 * MiB)] = _STREAMS.window_bytes
    idle_timeout_s: Seconds = _STREAMS.idle_timeout
    # The longest one wait on a stream may last (for the next chunk, or for room to send one)
    # while the peer keeps it alive without moving a byte: then the transfer fails, retryable.
    stall_timeout_s: Seconds = 300.0
    chunk_form: ChunkForm = _STREAMS.chunk_form
    # Bytes of chunk frames the agent's answers invite at once, all the streams it receives
    # together: more wait their turn, so a request (a status call) never queues behind more.
    receive_budget_bytes: Annotated[int, Field(ge=MiB, le=1024 * MiB)] = _RECEIVE_BUDGET
    # ... and what it may grow to with the measured bandwidth-delay product (a far Cloudly).
    receive_budget_max_bytes: Annotated[int, Field(ge=MiB, le=4096 * MiB)] = (
        _CONNECTION.receive_budget_max or 64 * MiB
    )


class MemoryConfig(_Section):
    """`[memory]`: the one byte budget every transfer draws from (`agent.transfers.budget`)."""

    # Bytes of frames, chunks and bodies all transfers together hold at once: 16 MiB .. 64 GiB.
    # At least twice [cloudly] max_frame_bytes and four [corestore] chunk_size (checked).
    budget_bytes: Annotated[int, Field(ge=16 * MiB, le=64 * 1024 * MiB)] = DEFAULT_BUDGET_BYTES


class ShutdownConfig(_Section):
    """`[shutdown]`: how long a stop may take. The drain and the six close steps (each with
    1 s of grace) must end below `stop_timeout_s`, the unit's `TimeoutStopSec=`
    (agent/startup/preflight.py refuses it otherwise)."""

    drain_timeout_s: Seconds = 20.0
    close_timeout_s: Seconds = 5.0
    stop_timeout_s: Seconds = 90.0


@dataclass(frozen=True, slots=True)
class HealthListen:
    """Where the health endpoint listens: `host`:`port` (loopback) or the unix socket `path`."""

    host: str | None = None
    port: int | None = None
    path: Path | None = None

    def __str__(self) -> str:
        if self.path is not None:
            return f"unix:{self.path}"
        host = f"[{self.host}]" if self.host is not None and ":" in self.host else self.host
        return f"{host}:{self.port}"


def _parse_listen(text: str, *, loopback: bool = True) -> HealthListen:
    if text.startswith("unix:") and not loopback:
        raise ValueError("must be HOST:PORT (the node's IP address and a port)")
    if text.startswith("unix:"):
        path = Path(text.removeprefix("unix:"))
        if not path.is_absolute():
            raise ValueError("a unix socket must be an absolute path (unix:/run/...)")
        return HealthListen(path=path)
    host, separator, port_text = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not separator or not port_text.isdigit() or int(port_text) > 65535:
        if not loopback:
            raise ValueError("must be HOST:PORT (the node's IP address and a port)")
        raise ValueError("must be HOST:PORT (a loopback IP and a port) or unix:/PATH")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        example = "127.0.0.1 or ::1" if loopback else "the node's, e.g. 10.0.0.5"
        raise ValueError(f"the host must be an IP address ({example}), not a name") from None
    if loopback and not address.is_loopback:
        raise ValueError("must be a loopback address (127.0.0.0/8 or ::1): nothing else listens")
    return HealthListen(host=str(address), port=int(port_text))


class HealthConfig(_Section):
    """`[health]`: the local health endpoint (`/healthz`, `/readyz`, `/metrics`,
    `/v1/restores`), the agent's only listener."""

    listen: str = "127.0.0.1:9733"
    # The event loop counts as healthy while its timers fire at most this late; the systemd
    # watchdog is pinged only then.
    max_loop_lag_s: Annotated[float, Field(gt=0, le=60.0, allow_inf_nan=False)] = 2.0

    # `/metrics` alone, on an address Prometheus reaches (the node's): docs/operations.md,
    # "Scraping the agents". None: only the loopback endpoint serves it.
    metrics_listen: str | None = None

    @field_validator("listen")
    @classmethod
    def _check_listen(cls, listen: str) -> str:
        _parse_listen(listen)
        return listen

    @field_validator("metrics_listen")
    @classmethod
    def _check_metrics_listen(cls, listen: str | None) -> str | None:
        if listen is not None:
            _parse_listen(listen, loopback=False)
        return listen

    @property
    def endpoint(self) -> HealthListen:
        """`listen`, parsed."""
        return _parse_listen(self.listen)

    @property
    def metrics_endpoint(self) -> HealthListen | None:
        """`metrics_listen`, parsed (None: not set)."""
        return (
            None
            if self.metrics_listen is None
            else _parse_listen(self.metrics_listen, loopback=False)
        )


class LogConfig(_Section):
    """`[log]`: output format and level."""

    format: Literal["auto", "json", "console"] = "auto"
    level: Literal["debug", "info", "warning", "error", "critical"] = "info"


class Config(_Section):
    """The whole configuration file."""

    cloudly: CloudlyConfig
    corestore: CorestoreConfig = CorestoreConfig()
    state: StateConfig = StateConfig()
    streams: StreamsConfig = StreamsConfig()
    memory: MemoryConfig = MemoryConfig()
    shutdown: ShutdownConfig = ShutdownConfig()
    log: LogConfig = LogConfig()
    health: HealthConfig = HealthConfig()

    @property
    def websocket_url(self) -> str:
        """The Cloudly URL to connect to, with http(s) mapped to ws(s)."""
        return self.cloudly.websocket_url


def load_config(path: Path) -> Config:
    """Read and validate the TOML file at `path`; raise `ConfigError` naming what is wrong."""
    try:
        # A UTF-8 byte order mark (some Windows editors write one) is not TOML, but it is
        # no mistake of the content either: it is dropped, not refused.
        data = tomllib.loads(path.read_bytes().decode("utf-8").removeprefix("\ufeff"))
    except FileNotFoundError as exc:
        raise ConfigError("", f"{path}: no such file") from exc
    except IsADirectoryError as exc:
        raise ConfigError("", f"{path}: is a directory, not a file") from exc
    except OSError as exc:
        raise ConfigError("", f"{path}: cannot be read ({exc.strerror or exc})") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError("", f"{path}: is not UTF-8 text") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("", f"{path}: is not valid TOML ({exc})") from exc
    try:
        config = Config.model_validate(data, context={"base_dir": path.parent.absolute()})
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        # A misspelt key is also a missing one; the unknown key is the cause worth naming.
        error = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
        key = _dotted_key(error["loc"])
        if error["type"] == "extra_forbidden" and key in _RENAMED:
            raise ConfigError(key, f"renamed to {_RENAMED[key]} (same meaning)") from None
        raise ConfigError(key, _reason(error)) from None
    _check_budget(config)
    return config


def _check_budget(config: Config) -> None:
    """The byte budget must hold what one transfer needs to move: a chunk frame as large as the
    session accepts (with its decoded bytes) and a few Corestore chunks."""
    budget = config.memory.budget_bytes
    frame, chunk = config.cloudly.max_frame_bytes, config.corestore.chunk_size
    if budget < 2 * frame or budget < 4 * chunk:
        raise ConfigError(
            "memory.budget_bytes",
            f"must be at least twice cloudly.max_frame_bytes ({2 * frame}) and four times "
            f"corestore.chunk_size ({4 * chunk})",
        )


def _dotted_key(loc: tuple[int | str, ...]) -> str:
    key = ""
    for part in loc:
        key += f"[{part}]" if isinstance(part, int) else (f".{part}" if key else part)
    return key


_EXPECTED: Final = {
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "true or false",
    "string_type": "a string",
    "path_type": "a path (string)",
    "is_instance_of": "a path (string)",
    "model_type": "a table",
    "dict_type": "a table",
}
_BOUNDS: Final = {
    "greater_than": ">",
    "greater_than_equal": ">=",
    "less_than": "<",
    "less_than_equal": "<=",
}


def _reason(error: ErrorDetails) -> str:
    """One clause saying what is wrong, without echoing strings (they might be pasted secrets)."""
    kind = error["type"]
    value = error["input"]
    ctx = error.get("ctx", {})
    if kind == "missing":
        return (
            "required section is missing" if len(error["loc"]) == 1 else "required key is missing"
        )
    if kind == "extra_forbidden":
        return "unknown section" if isinstance(value, dict) else "unknown key"
    if kind in _EXPECTED:
        return f"expected {_EXPECTED[kind]}, got {_toml_type(value)}"
    if kind in _BOUNDS:
        bound = next(iter(ctx.values()))
        return f"must be {_BOUNDS[kind]} {_number(bound)}, got {value}"
    if kind == "finite_number":
        return f"must be a finite number, got {value}"
    if kind == "literal_error":
        got = "" if isinstance(value, str) else f", got {_toml_type(value)}"
        return f"must be {ctx['expected']}{got}"
    if kind == "string_too_short":
        return "must not be empty"
    if kind == "value_error":
        return str(ctx.get("error", error["msg"]))
    return error["msg"].replace("Input should be", "must be")


def _number(value: object) -> object:
    """`60` rather than `60.0` for a whole float bound."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _toml_type(value: object) -> str:
    names: list[tuple[type | tuple[type, ...], str]] = [
        (bool, "a boolean"),
        (int, "an integer"),
        (float, "a float"),
        (str, "a string"),
        (dict, "a table"),
        (list, "an array"),
        ((datetime, date, time), "a date/time"),
    ]
    return next((name for kind, name in names if isinstance(value, kind)), type(value).__name__)


def is_credential(path: Path) -> bool:
    """Whether `path` names a systemd credential (`${CREDENTIALS_DIRECTORY}/NAME`)."""
    return bool(path.parts) and path.parts[0] == _CREDENTIALS_PREFIX


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
