"""`restore-agent status`: read the running agent's health endpoint and print it for a person.

`fetch()` asks the endpoint `[health] listen` names (loopback TCP or the unix socket; stdlib
`http.client`, so the command needs nothing the daemon runs on) for `/readyz` and
`/v1/restores` and returns them as one JSON-ready mapping; `render()` turns that into the
table below. Both answers are read as the agent serves them (`agent/health.py`,
`agent/overview.py`); a field the table needs but does not find is shown as `-`.

    agent:    ready                      (or: not ready, then one line per reason)
    session:  connected for 2 h 5 min, cluster cluster-1, last pong 3 s ago
    restores: 2

    CLUSTER/NODE/RESTORE        STATUS    REVISION  PROGRESS               AGE
    cluster-1/node-1/r-7        staging          4  41% 4.1 MB of 10.0 MB  12 s
    cluster-1/node-1/r-6        cleaned          9  -                      3 d
"""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Mapping
from typing import Any, Final

from agent.config import HealthListen
from agent.errors import AgentError

__all__ = ["StatusUnavailable", "fetch", "render"]

_COLUMNS: Final = ("CLUSTER/NODE/RESTORE", "STATUS", "REVISION", "PROGRESS", "AGE")


class StatusUnavailable(AgentError):
    """The health endpoint could not be read (the agent is not running, or not there).

    Never on the wire: the CLI prints it and exits 1."""


class _UnixConnection(http.client.HTTPConnection):
    """HTTP over a unix socket (the endpoint's `unix:/path` form)."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def _get(listen: HealthListen, path: str, timeout: float) -> Any:
    if listen.port == 0:
        raise StatusUnavailable(f"health.listen is {listen}: port 0 cannot be asked")
    connection: http.client.HTTPConnection
    if listen.path is not None:
        connection = _UnixConnection(str(listen.path), timeout)
    else:
        connection = http.client.HTTPConnection(str(listen.host), listen.port, timeout=timeout)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        body = response.read()
    except OSError as exc:
        raise StatusUnavailable(
            f"cannot read the agent's health endpoint at {listen}: {exc.strerror or exc} "
            "(is the agent running? see `systemctl status restore-agent`)"
        ) from exc
    finally:
        connection.close()
    try:
        return json.loads(body)
    except ValueError as exc:
        raise StatusUnavailable(f"{listen}{path} answered {response.status} without JSON") from exc


def fetch(listen: HealthListen, *, timeout: float = 5.0) -> dict[str, Any]:
    """`{ready, reasons, session, restores}` from the endpoint at `listen`."""
    ready = _get(listen, "/readyz", timeout)
    restores = _get(listen, "/v1/restores", timeout)
    if not isinstance(ready, dict) or not isinstance(restores, dict):
        raise StatusUnavailable(f"{listen} answered something that is not the agent's status")
    return {
        "ready": ready.get("ready"),
        "reasons": ready.get("reasons", {}),
        "session": ready.get("session", {}),
        "restores": restores.get("restores", []),
        **({"restoresError": restores["error"]} if "error" in restores else {}),
    }


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} d"


def _megabytes(count: int) -> str:
    return f"{count / 1e6:.1f} MB"


def _progress(progress: Any) -> str:
    if not isinstance(progress, Mapping):
        return "-"
    done, total, unit = progress.get("done"), progress.get("total"), progress.get("unit")
    if not isinstance(done, int) or not isinstance(total, int):
        return "-"
    share = f"{100 * done // total}% " if total > 0 else ""
    if unit == "bytes":
        return f"{share}{_megabytes(done)} of {_megabytes(total)}"
    return f"{share}{done} of {total} {unit}"


def _session_line(session: Mapping[str, Any], now: float) -> str:
    state = str(session.get("state", "-"))
    parts = [state]
    since = session.get("connectedSince") if state == "connected" else session.get("stateSince")
    if isinstance(since, int | float):
        parts[0] += f" for {_duration(now - since)}"
    cluster = session.get("cluster")
    if isinstance(cluster, Mapping) and cluster.get("clusterId"):
        parts.append(f"cluster {cluster['clusterId']}")
    pong = session.get("lastPongAt")
    if isinstance(pong, int | float):
        parts.append(f"last pong {_duration(now - pong)} ago")
    error = session.get("lastError")
    if error and state != "connected":
        parts.append(f"last error: {error}")
    return ", ".join(parts)


def render(data: Mapping[str, Any], *, now: float) -> str:
    """The status as text for a terminal (`now`: wall seconds, for ages)."""
    reasons = data.get("reasons") or {}
    lines = ["agent:    " + ("ready" if data.get("ready") else "not ready")]
    lines += [f"          {key}: {reason}" for key, reason in sorted(reasons.items())]
    lines.append(f"session:  {_session_line(data.get('session') or {}, now)}")
    restores = data.get("restores") or []
    if "restoresError" in data:
        lines.append(f"restores: unknown ({data['restoresError']})")
        return "\n".join(lines) + "\n"
    lines.append(f"restores: {len(restores)}")
    if not restores:
        return "\n".join(lines) + "\n"
    rows = [_COLUMNS]
    for row in restores:
        key = "/".join(str(row.get(k, "-")) for k in ("clusterId", "nodeName", "restoreId"))
        age = row.get("ageSeconds")
        rows.append(
            (
                key,
                str(row.get("status", "-")),
                str(row.get("revision", "-")),
                _progress(row.get("progress")),
                _duration(age if isinstance(age, int | float) else None),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    lines.append("")
    for row in rows:
        cells = [
            cell.rjust(width) if index == 2 else cell.ljust(width)
            for index, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines) + "\n"
