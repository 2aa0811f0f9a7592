"""The configuration's sections: one frozen pydantic model per TOML table, and `Config`, the
whole file. Each section builds the settings objects of the parts it configures (a method on
the section they read, on `Config` for those that read several), and each default a part
takes is written once, by the part: the section reads it (the protocol's, the session's, the
engine's, the Corestore clients', the transfer limits' and the byte budget's). Only what no
part defaults lives here alone (a URL, a path, the health address, the log format).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Final, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from agent.config.fields import (
    FilePath,
    KiB,
    MiB,
    NonNegativeSeconds,
    PollSeconds,
    Seconds,
    is_cleartext_remote,
    part_default,
    require_json_value,
    spoken_number,
)
from agent.corestore.shapes import DEFAULT_CHUNK_SIZE
from agent.corestore.transport import CorestoreTimeouts
from agent.protocol.chunks import ChunkForm
from agent.protocol.settings import ConnectionSettings, StreamSettings
from agent.relay.settings import RelaySettings
from agent.restore.settings import EngineSettings
from agent.retry import Backoff, RetryPolicy
from agent.session.settings import URL_SCHEMES, SessionSettings, websocket_url
from agent.store.retention import RetentionSettings
from agent.transfers.budget import DEFAULT_BUDGET_BYTES
from agent.transfers.limits import DEFAULT_MAX_PER_NODE, NodeLimits
from agent.watch.listen import HealthListen, parse_listen

__all__ = [
    "CloudlyConfig",
    "Config",
    "CorestoreConfig",
    "HealthConfig",
    "LogConfig",
    "MemoryConfig",
    "ShutdownConfig",
    "StateConfig",
    "StreamsConfig",
]

# The parts' defaults, read once each.
_CONNECTION: Final = ConnectionSettings()
_STREAMS: Final = _CONNECTION.streams
_RECEIVE_BUDGET: Final = _CONNECTION.receive_budget or 4 * MiB
_SESSION_BACKOFF: Final = part_default(SessionSettings, "backoff", Backoff)
_TIMEOUTS: Final = CorestoreTimeouts()
_RETRY: Final = RetryPolicy()


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
    compression: bool = part_default(SessionSettings, "compression", bool)
    call_timeout_s: Seconds = part_default(SessionSettings, "call_timeout", float)
    ping_interval_s: Seconds = part_default(SessionSettings, "ping_interval", float)
    ping_timeout_s: Seconds = part_default(SessionSettings, "ping_timeout", float)
    backoff_base_s: Seconds = _SESSION_BACKOFF.base
    backoff_cap_s: Seconds = _SESSION_BACKOFF.cap
    stable_after_s: NonNegativeSeconds = part_default(SessionSettings, "stable_after", float)
    identity_renew_margin_s: NonNegativeSeconds = part_default(
        SessionSettings, "identity_renew_margin_s", float
    )
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
        if parts.scheme not in URL_SCHEMES:
            raise ValueError("must start with http://, https://, ws:// or wss://")
        if not parts.hostname:
            raise ValueError("names no host")
        if parts.username is not None or parts.password is not None:
            raise ValueError("must not carry credentials; the machine token goes in token_file")
        if parts.fragment:
            raise ValueError("must not have a #fragment")
        if is_cleartext_remote(url) and not info.data.get("allow_cleartext", False):
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
                f"must be >= backoff_base_s ({spoken_number(base)}), got {spoken_number(cap)}"
            ) from None
        return cap

    @field_validator("tag_payload")
    @classmethod
    def _check_tag_payload(cls, payload: Mapping[str, Any]) -> Mapping[str, Any]:
        require_json_value(payload, "")
        return payload

    @property
    def websocket_url(self) -> str:
        """`url` with http(s) mapped to ws(s)."""
        return websocket_url(self.url)

    @property
    def cleartext_allowed(self) -> bool:
        """Whether the session runs unencrypted to a host that is not loopback (only with
        `allow_cleartext`; the agent warns at start-up)."""
        return is_cleartext_remote(self.url)


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
    chunk_size: Annotated[int, Field(ge=64 * KiB, le=16 * MiB)] = DEFAULT_CHUNK_SIZE
    max_in_flight: Annotated[int, Field(ge=1, le=32)] = part_default(
        EngineSettings, "max_in_flight", int
    )
    connect_timeout_s: Seconds = _TIMEOUTS.connect
    # Not the clients' own default: a client built without a configuration (the tests, the
    # stand-ins) waits `CorestoreTimeouts.control`, 30 s; an agent started from a file, 60 s.
    request_timeout_s: Seconds = 60.0
    # One chunk PUT, object commit (Corestore re-hashes the object) or resource verification.
    transfer_timeout_s: Seconds = _TIMEOUTS.transfer
    # Sends after the first: the attempts of the clients' default policy, less the first.
    retries: Annotated[int, Field(ge=0, le=10)] = _RETRY.attempts - 1
    # How long an outage of a node's Corestore its idempotent calls ride out (0: `retries`).
    outage_tolerance_s: NonNegativeSeconds = 120.0
    restore_poll_interval_s: PollSeconds = part_default(EngineSettings, "poll_interval", float)
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

    def engine_settings(self) -> EngineSettings:
        """The engine's settings: chunking and the poll interval (`retries` and the timeouts
        are the Corestore clients', not the engine's)."""
        return EngineSettings(
            chunk_size=self.chunk_size,
            max_in_flight=self.max_in_flight,
            poll_interval=self.restore_poll_interval_s,
        )

    def timeouts(self) -> CorestoreTimeouts:
        """The Corestore clients' timeouts (`connect_timeout_s`, `request_timeout_s`,
        `transfer_timeout_s`)."""
        return CorestoreTimeouts(
            connect=self.connect_timeout_s,
            control=self.request_timeout_s,
            transfer=self.transfer_timeout_s,
        )

    def retry_policy(self) -> RetryPolicy:
        """How the Corestore clients resend an idempotent call while Corestore is unavailable:
        `retries` sends after the first, riding out `outage_tolerance_s` of outage."""
        return RetryPolicy(attempts=self.retries + 1, tolerance=self.outage_tolerance_s)

    def node_limits(self) -> NodeLimits:
        """Each node's transfer places and byte rate (`max_transfers_per_node`,
        `max_bytes_per_s_per_node`)."""
        return NodeLimits(self.max_transfers_per_node, self.max_bytes_per_s_per_node)


class StateConfig(_Section):
    """`[state]`: where the revision store and the agent's key live, and how long finished
    records stay (docs/operations.md, "Retention")."""

    directory: FilePath = Path("/var/lib/restore-agent")
    # Days a cleaned restore or a finished relay job stays in the store after its last change.
    # 30: far past any repeat Cloudly may still send (a call's timeout and retries are minutes,
    # an isolated restore's lifetime is capped by Cloudly's maximum TTL) and a month of history
    # in /v1/restores and /v1/jobs. At most ten years.
    retention_days: Annotated[int, Field(ge=1, le=3650)] = 30

    def retention_settings(self) -> RetentionSettings:
        """The store's retention: `retention_days`, the pace at its defaults."""
        return RetentionSettings.from_days(self.retention_days)


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

    def stream_settings(self) -> StreamSettings:
        """What every stream of the session's connections shares."""
        return StreamSettings(
            window=self.window,
            window_bytes=self.window_bytes,
            idle_timeout=self.idle_timeout_s,
            chunk_form=self.chunk_form,
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
    close_timeout_s: Seconds = part_default(SessionSettings, "close_timeout", float)
    stop_timeout_s: Seconds = 90.0


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
        parse_listen(listen)
        return listen

    @field_validator("metrics_listen")
    @classmethod
    def _check_metrics_listen(cls, listen: str | None) -> str | None:
        if listen is not None:
            parse_listen(listen, loopback=False)
        return listen

    @property
    def endpoint(self) -> HealthListen:
        """`listen`, parsed."""
        return parse_listen(self.listen)

    @property
    def metrics_endpoint(self) -> HealthListen | None:
        """`metrics_listen`, parsed (None: not set)."""
        return (
            None
            if self.metrics_listen is None
            else parse_listen(self.metrics_listen, loopback=False)
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

    def session_settings(self) -> SessionSettings:
        """The session's settings: `[cloudly]`, its connections' (`[streams]` and `[cloudly]`'s
        seats per request class) and `[shutdown] close_timeout_s`."""
        cloudly, streams = self.cloudly, self.streams
        return SessionSettings(
            url=cloudly.websocket_url,
            tag_name=cloudly.tag_name,
            tag_payload=dict(cloudly.tag_payload),
            max_frame_bytes=cloudly.max_frame_bytes,
            ca_file=cloudly.ca_file,
            compression=cloudly.compression,
            ping_interval=cloudly.ping_interval_s,
            ping_timeout=cloudly.ping_timeout_s,
            close_timeout=self.shutdown.close_timeout_s,
            call_timeout=cloudly.call_timeout_s,
            identity_renew_margin_s=cloudly.identity_renew_margin_s,
            backoff=Backoff(base=cloudly.backoff_base_s, cap=cloudly.backoff_cap_s),
            stable_after=cloudly.stable_after_s,
            connection=ConnectionSettings(
                streams=streams.stream_settings(),
                max_concurrent_requests=cloudly.max_concurrent_requests,
                max_stream_requests=cloudly.max_stream_requests,
                max_stream_requests_per_node=cloudly.max_stream_requests_per_node,
                receive_budget=streams.receive_budget_bytes,
                receive_budget_max=streams.receive_budget_max_bytes,
            ),
            stream_stall_timeout=streams.stall_timeout_s,
        )

    def relay_settings(self) -> RelaySettings:
        """The relay's settings: `[corestore] chunk_size`, and `[cloudly] call_timeout_s` as the
        bound of Cloudly's answer to each closure call."""
        return RelaySettings(
            chunk_size=self.corestore.chunk_size, answer_timeout=self.cloudly.call_timeout_s
        )
