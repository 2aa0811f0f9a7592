"""`SessionSettings`: what the Cloudly session needs from the configuration.

Plain data, built by the composition root (`agent.entry.app.session_settings`) and read by the
session (`agent.session.client`) and its authentication (`agent.session.authentication`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.protocol.connection import ConnectionSettings
from agent.retry import Backoff

__all__ = ["SessionSettings"]


@dataclass(frozen=True, slots=True)
class SessionSettings:
    """What the session needs from the configuration (built by the composition root).

    Liveness: a websocket ping every `ping_interval` s (the session's own keepalive, each
    pong recorded in the status); a ping left unanswered for `ping_timeout` s declares the
    connection dead and the session reconnects. `stream_stall_timeout` bounds each wait on a
    stream (`Peer`'s `stall_timeout`).
    """

    url: str  # ws(s), or http(s) mapped by the one mapping, `agent.config.websocket_url`
    tag_name: str
    tag_payload: Any
    max_frame_bytes: int
    ca_file: Path | None = None
    compression: bool = False
    ping_interval: float = 10.0
    ping_timeout: float = 30.0
    open_timeout: float = 10.0
    close_timeout: float = 5.0
    call_timeout: float = 30.0
    identity_renew_margin_s: float = 300.0
    backoff: Backoff = field(default_factory=Backoff)
    stable_after: float = 60.0
    connection: ConnectionSettings = field(default_factory=ConnectionSettings)
    stream_stall_timeout: float | None = None
