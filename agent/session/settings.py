"""`SessionSettings`: what the Cloudly session needs from the configuration, and
`websocket_url`, the one mapping of the configured Cloudly URL to the one dialled.

Plain data, built from the configuration (`agent.config`'s `Config.session_settings`) and read
by the session (`agent.session.client`) and its authentication (`agent.session.authentication`).
The defaults written here are the configuration's: `[cloudly]` and `[shutdown]` read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit, urlunsplit

from agent.errors import ConfigError
from agent.protocol.connection import ConnectionSettings
from agent.retry import Backoff

__all__ = ["URL_SCHEMES", "SessionSettings", "websocket_url"]

# The schemes a Cloudly URL may have, and the websocket scheme each is dialled with.
URL_SCHEMES: Final = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}


@dataclass(frozen=True, slots=True)
class SessionSettings:
    """What the session needs from the configuration (built by the composition root).

    Liveness: a websocket ping every `ping_interval` s (the session's own keepalive, each
    pong recorded in the status); a ping left unanswered for `ping_timeout` s declares the
    connection dead and the session reconnects. `stream_stall_timeout` bounds each wait on a
    stream (`Peer`'s `stall_timeout`).
    """

    url: str  # ws(s), or http(s) mapped by the one mapping, `websocket_url`
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


def websocket_url(url: str) -> str:
    """The websocket URL to dial for the Cloudly URL `url`: http(s) becomes ws(s), ws(s) and the
    rest of the URL stay. Anything else is a `ConfigError` naming `cloudly.url`. The one place
    the mapping is made (the session dials what this returns)."""
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise ConfigError("cloudly.url", "must be an http, https, ws or wss URL") from exc
    scheme = URL_SCHEMES.get(parts.scheme)  # urlsplit lowercases the scheme
    if scheme is None or not parts.netloc:
        raise ConfigError("cloudly.url", "must be an http, https, ws or wss URL")
    return urlunsplit(parts._replace(scheme=scheme))
