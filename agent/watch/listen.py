"""`HealthListen`: where the health endpoint (or the metrics scrape) listens, and the one parser
of the address the configuration names (`[health] listen`, `metrics_listen`). Pure."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

__all__ = ["HealthListen", "parse_listen"]


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


def parse_listen(text: str, *, loopback: bool = True) -> HealthListen:
    """`text` as an address: HOST:PORT with an IP literal (a loopback one unless `loopback` is
    False) or, loopback only, `unix:/absolute/path`. A `ValueError` says what is wrong."""
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
