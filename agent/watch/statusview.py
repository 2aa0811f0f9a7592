"""`restore-agent status`: read the running agent's health endpoint and print it for a person.

`fetch()` asks the endpoint `[health] listen` names (loopback TCP or the unix socket; stdlib
`http.client`, so the command needs nothing the daemon runs on) for `/readyz`, `/v1/restores`,
`/v1/jobs` and `/v1/transfers` and returns them as one JSON-ready mapping (`--json` prints
it); `render()` turns that into the text below. The answers are read as the agent serves
them (`agent/watch/health.py`, `agent/watch/overview.py`: every time in epoch milliseconds); a
field the text needs but does not find is shown as `-`.

    agent:    ready (version 0.1.0, up 5 h)   (or: not ready, then one line per reason)
    session:  connected for 2 h, cluster cluster-1, last pong 3 s ago

or, while Cloudly cannot be reached (the `session` reason is then this line):

    session:  backing-off: Cloudly unreachable since 2025-06-01 12:03:04 UTC (2 min), last
              connected 2025-06-01 11:00:00 UTC, 17 attempts, last error: ...
    transfers: node-1 2 moving, 1 queued (at most 2 per node)
    restores: 3

    CLUSTER/NODE/RESTORE        STATUS              REVISION  PROGRESS               AGE
    cluster-1/node-1/r-8        prepared (queued 1)        2  0% 0.0 MB of 10.0 MB   1 s
    cluster-1/node-1/r-7        staging                    4  41% 4.1 MB of 10.0 MB  12 s
    cluster-1/node-1/r-6        cleaned                    9  -                      3 d

A named condition of the node (`conditions` in `/readyz`: the state disk refusing writes, a
node's Corestore full, a salvaged or reset state being reconciled) is one `condition:` line
each, with how long it has held.

When no agent answers but the state directory holds the record of a refused start
(`agent-down.json`: a damaged or newer state database), `render_down()` says why it is down:

    agent:    down since 3 min (exit 65): restore-agent: the state database ... is damaged ...

A row whose bytes wait for one of the node's places (`[corestore] max_transfers_per_node`)
says `(queued N)` after its status, N its place in the node's queue (1: next).

    jobs:     1

    CLUSTER/NODE/BACKUP         KIND     SERVICE  STATUS     REVISION  ATTEMPTS  AGE  RESULT
    cluster-1/node-1/backup-3   restore  svc-1    succeeded         3         1  5 s  database
"""

from __future__ import annotations

import http.client
import json
import socket
from collections.abc import Callable, Mapping
from typing import Any, Final

from agent.errors import AgentError
from agent.watch.listen import HealthListen
from agent.watch.status import human_duration, unreachable_sentence

__all__ = ["StatusUnavailable", "fetch", "render", "render_down"]

_COLUMNS: Final = ("CLUSTER/NODE/RESTORE", "STATUS", "REVISION", "PROGRESS", "AGE")
_JOB_COLUMNS: Final = (
    "CLUSTER/NODE/BACKUP",
    "KIND",
    "SERVICE",
    "STATUS",
    "REVISION",
    "ATTEMPTS",
    "AGE",
    "RESULT",
)
# Right-aligned columns (numbers) of each table.
_NUMBERS: Final = {_COLUMNS: {2}, _JOB_COLUMNS: {4, 5}}


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
    """`{ready, agent, reasons, session, conditions, restores, jobs, transfers}` from the
    endpoint at `listen`
    (with `restoresError` / `jobsError` when the store could not be read; `transfers` None
    from an agent that serves none: one still running from before an upgrade)."""
    ready = _get(listen, "/readyz", timeout)
    restores = _get(listen, "/v1/restores", timeout)
    jobs = _get(listen, "/v1/jobs", timeout)
    try:
        transfers = _get(listen, "/v1/transfers", timeout)
    except StatusUnavailable:
        transfers = None  # an agent started before an upgrade serves no /v1/transfers yet
    if not all(isinstance(answer, dict) for answer in (ready, restores, jobs)):
        raise StatusUnavailable(f"{listen} answered something that is not the agent's status")
    return {
        "ready": ready.get("ready"),
        "agent": ready.get("agent"),
        "reasons": ready.get("reasons", {}),
        "session": ready.get("session", {}),
        "restores": restores.get("restores", []),
        **({"restoresError": restores["error"]} if "error" in restores else {}),
        "jobs": jobs.get("jobs", []),
        **({"jobsError": jobs["error"]} if "error" in jobs else {}),
        "transfers": transfers,
        "conditions": ready.get("conditions", {}),
    }


def _duration(seconds: float | None) -> str:
    return "-" if seconds is None else human_duration(seconds)


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


def _since(now_ms: int, then_ms: Any) -> float | None:
    """Seconds from `then_ms` (epoch ms, from the endpoint) to `now_ms`; None if not a time."""
    if isinstance(then_ms, bool) or not isinstance(then_ms, int | float):
        return None
    return (now_ms - then_ms) / 1000


def _epoch_s(value: Any) -> float | None:
    """An endpoint time (epoch ms) as epoch seconds; None if it is not a time."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value / 1000


def _outage(session: Mapping[str, Any], now_ms: int) -> str | None:
    """The outage sentence from the session's fields; None when there is no outage."""
    since = _epoch_s(session.get("unreachableSince"))
    if since is None or session.get("state") in ("connected", "stopped"):
        return None
    attempts = session.get("failedAttempts")
    error = session.get("lastError")
    return unreachable_sentence(
        since=since,
        now=now_ms / 1000,
        last_connected_at=_epoch_s(session.get("lastConnectedAt")),
        attempts=attempts if isinstance(attempts, int) else 0,
        last_error=str(error) if error else None,
    )


def _session_line(session: Mapping[str, Any], now_ms: int) -> str:
    state = str(session.get("state", "-"))
    if (outage := _outage(session, now_ms)) is not None:
        return f"{state}: {outage}"
    parts = [state]
    since = session.get("connectedSince") if state == "connected" else session.get("stateSince")
    if (seconds := _since(now_ms, since)) is not None:
        parts[0] += f" for {_duration(seconds)}"
    cluster = session.get("cluster")
    if isinstance(cluster, Mapping) and cluster.get("clusterId"):
        parts.append(f"cluster {cluster['clusterId']}")
    if (seconds := _since(now_ms, session.get("lastPongAt"))) is not None:
        parts.append(f"last pong {_duration(seconds)} ago")
    error = session.get("lastError")
    if error and state != "connected":
        parts.append(f"last error: {error}")
    return ", ".join(parts)


def _agent_facts(agent: Any) -> str:
    """` (version 0.1.0, up 3 h)`; empty from an agent that serves no `agent` block."""
    if not isinstance(agent, Mapping):
        return ""
    facts = []
    if agent.get("version"):
        facts.append(f"version {agent['version']}")
    uptime = agent.get("uptimeSeconds")
    if isinstance(uptime, int | float) and not isinstance(uptime, bool):
        facts.append(f"up {_duration(uptime)}")
    return f" ({', '.join(facts)})" if facts else ""


def _age(row: Mapping[str, Any]) -> str:
    age = row.get("ageSeconds")
    return _duration(age if isinstance(age, int | float) else None)


def _status(row: Mapping[str, Any]) -> str:
    """The row's status, and its place in its node's transfer queue while it waits there."""
    status = str(row.get("status", "-"))
    transfer = row.get("transfer")
    if isinstance(transfer, Mapping) and transfer.get("state") == "queued":
        status += f" (queued {transfer.get('position', '-')})"
    return status


def _transfers_line(transfers: Any) -> str | None:
    """`node-1 2 moving, 1 queued; node-2 1 moving (at most 2 per node)`; None when unknown."""
    if not isinstance(transfers, Mapping):
        return None
    nodes = transfers.get("nodes")
    parts = []
    for node, counts in (nodes if isinstance(nodes, Mapping) else {}).items():
        if not isinstance(counts, Mapping):
            continue
        moving, queued = counts.get("moving", 0), counts.get("queued", 0)
        parts.append(f"{node} {moving} moving" + (f", {queued} queued" if queued else ""))
    limit = transfers.get("maxTransfersPerNode")
    bound = f" (at most {limit} per node)" if limit is not None else ""
    return ("; ".join(parts) or "none") + bound


def _restore_cells(row: Mapping[str, Any]) -> tuple[str, ...]:
    key = "/".join(str(row.get(k, "-")) for k in ("clusterId", "nodeId", "restoreId"))
    return (
        key,
        _status(row),
        str(row.get("revision", "-")),
        _progress(row.get("progress")),
        _age(row),
    )


def _job_result(row: Mapping[str, Any]) -> str:
    """What a job ended with: the error code, or the types a restore restored."""
    if row.get("errorCode"):
        return str(row["errorCode"])
    types = row.get("resourceTypes")
    if isinstance(types, list) and types:
        return ", ".join(str(kind) for kind in types) + (" (partial)" if row.get("partial") else "")
    return "-"


def _job_cells(row: Mapping[str, Any]) -> tuple[str, ...]:
    key = "/".join(str(row.get(k, "-")) for k in ("clusterId", "nodeId", "backupId"))
    return (
        key,
        str(row.get("kind", "-")),
        str(row.get("serviceId", "-")),
        _status(row),
        str(row.get("revision", "-")),
        str(row.get("attempts", "-")),
        _age(row),
        _job_result(row),
    )


def _table(columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    """A blank line, then `columns` and `rows` aligned (numbers to the right)."""
    every = [columns, *rows]
    widths = [max(len(row[i]) for row in every) for i in range(len(columns))]
    numbers = _NUMBERS[columns]
    lines = [""]
    for row in every:
        cells = [
            cell.rjust(width) if index in numbers else cell.ljust(width)
            for index, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return lines


def _section(
    data: Mapping[str, Any],
    name: str,
    columns: tuple[str, ...],
    cells: Callable[[Mapping[str, Any]], tuple[str, ...]],
) -> list[str]:
    label = f"{name}:".ljust(10)
    if f"{name}Error" in data:
        return [f"{label}unknown ({data[f'{name}Error']})"]
    rows = [row for row in data.get(name) or [] if isinstance(row, Mapping)]
    lines = [f"{label}{len(rows)}"]
    if rows:
        lines += _table(columns, [cells(row) for row in rows])
    return lines


def render(data: Mapping[str, Any], *, now_ms: int) -> str:
    """The status as text for a terminal (`now_ms`: wall time in epoch ms, for ages)."""
    reasons = dict(data.get("reasons") or {})
    session = data.get("session") or {}
    if _outage(session, now_ms) is not None:
        reasons.pop("session", None)  # the session line below says it, with the outage
    state = "ready" if data.get("ready") else "not ready"
    lines = [f"agent:    {state}{_agent_facts(data.get('agent'))}"]
    lines += [f"          {key}: {reason}" for key, reason in sorted(reasons.items())]
    conditions = data.get("conditions") or {}
    for key, condition in sorted(conditions.items() if isinstance(conditions, Mapping) else []):
        if not isinstance(condition, Mapping):
            continue
        held = _since(now_ms, condition.get("since"))
        suffix = f" (for {_duration(held)})" if held is not None else ""
        lines.append(f"condition: {key}: {condition.get('text', '-')}{suffix}")
    lines.append(f"session:  {_session_line(session, now_ms)}")
    if (transfers := _transfers_line(data.get("transfers"))) is not None:
        lines.append(f"transfers: {transfers}")
    lines += _section(data, "restores", _COLUMNS, _restore_cells)
    lines.append("")
    lines += _section(data, "jobs", _JOB_COLUMNS, _job_cells)
    return "\n".join(lines) + "\n"


def render_down(down: Mapping[str, Any], *, now_ms: int) -> str:
    """Why the agent is down, from the record of its refused start (`agent-down.json`)."""
    held = _since(now_ms, down.get("at"))
    when = f" since {_duration(held)}" if held is not None else ""
    code = down.get("exitCode")
    status = f" (exit {code})" if isinstance(code, int) else ""
    return f"agent:    down{when}{status}: {down.get('message', '-')}\n"
