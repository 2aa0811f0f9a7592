"""`restore-agent status`: read the running agent's health endpoint and print it for a person.

`fetch()` asks the endpoint `[health] listen` names (loopback TCP or the unix socket; stdlib
`http.client`, so the command needs nothing the daemon runs on) for `/readyz`, `/v1/restores`,
`/v1/jobs` and `/v1/transfers` and returns them as one JSON-ready mapping, each part as the
agent served it (`--json` prints it); `render()` reads that as a `StatusDocument`
(`agent/watch/document.py`: the document the agent builds, every time in epoch milliseconds,
read leniently, since an older or a newer agent may have written it) and turns it into the
text below. A field the text needs but does not find (or finds of another type) is shown as
`-`.

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
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, TypeVar

from agent.errors import AgentError
from agent.watch.docfields import Fields
from agent.watch.docrows import JobRow, Progress, RestoreRow, TransferDoc, TransfersDoc
from agent.watch.document import AgentFacts, SessionDoc, StatusDocument
from agent.watch.listen import HealthListen
from agent.watch.outagetext import human_duration, unreachable_sentence

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
_Row = TypeVar("_Row", RestoreRow, JobRow)
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
    endpoint at `listen` (`StatusDocument.combine`: with `restoresError` / `jobsError` when
    the store could not be read; `transfers` None from an agent that serves none: one still
    running from before an upgrade)."""
    ready = _get(listen, "/readyz", timeout)
    restores = _get(listen, "/v1/restores", timeout)
    jobs = _get(listen, "/v1/jobs", timeout)
    try:
        transfers = _get(listen, "/v1/transfers", timeout)
    except StatusUnavailable:
        transfers = None  # an agent started before an upgrade serves no /v1/transfers yet
    if not all(isinstance(answer, dict) for answer in (ready, restores, jobs)):
        raise StatusUnavailable(f"{listen} answered something that is not the agent's status")
    return StatusDocument.combine(ready, restores, jobs, transfers)


def _duration(seconds: float | None) -> str:
    return "-" if seconds is None else human_duration(seconds)


def _megabytes(count: int) -> str:
    return f"{count / 1e6:.1f} MB"


def _text(value: object | None) -> str:
    """A cell: the value, `-` when the document does not say it."""
    return "-" if value is None else str(value)


def _progress(progress: Progress | None) -> str:
    if progress is None or progress.done is None or progress.total is None:
        return "-"
    done, total, unit = progress.done, progress.total, progress.unit
    share = f"{100 * done // total}% " if total > 0 else ""
    if unit == "bytes":
        return f"{share}{_megabytes(done)} of {_megabytes(total)}"
    return f"{share}{done} of {total} {unit}"


def _since(now_ms: int, then_ms: float | None) -> float | None:
    """Seconds from `then_ms` (epoch ms, from the endpoint) to `now_ms`; None if not a time."""
    return None if then_ms is None else (now_ms - then_ms) / 1000


def _epoch_s(value: float | None) -> float | None:
    """An endpoint time (epoch ms) as epoch seconds; None if it is not a time."""
    return None if value is None else value / 1000


def _outage(session: SessionDoc, now_ms: int) -> str | None:
    """The outage sentence from the session's fields; None when there is no outage."""
    since = _epoch_s(session.unreachable_since)
    if since is None or session.state in ("connected", "stopped"):
        return None
    attempts = session.failed_attempts
    return unreachable_sentence(
        since=since,
        now=now_ms / 1000,
        last_connected_at=_epoch_s(session.last_connected_at),
        attempts=attempts if attempts is not None else 0,
        last_error=session.last_error or None,
    )


def _session_line(session: SessionDoc, now_ms: int) -> str:
    state = _text(session.state)
    if (outage := _outage(session, now_ms)) is not None:
        return f"{state}: {outage}"
    parts = [state]
    since = session.connected_since if state == "connected" else session.state_since
    if (seconds := _since(now_ms, since)) is not None:
        parts[0] += f" for {_duration(seconds)}"
    cluster = session.cluster
    if cluster is not None and cluster.cluster_id:
        parts.append(f"cluster {cluster.cluster_id}")
    if (seconds := _since(now_ms, session.last_pong_at)) is not None:
        parts.append(f"last pong {_duration(seconds)} ago")
    if session.last_error and state != "connected":
        parts.append(f"last error: {session.last_error}")
    return ", ".join(parts)


def _agent_facts(agent: AgentFacts | None) -> str:
    """` (version 0.1.0, up 3 h)`; empty from an agent that serves no `agent` block."""
    if agent is None:
        return ""
    facts = []
    if agent.version:
        facts.append(f"version {agent.version}")
    if agent.uptime_seconds is not None:
        facts.append(f"up {_duration(agent.uptime_seconds)}")
    return f" ({', '.join(facts)})" if facts else ""


def _status(row: RestoreRow | JobRow) -> str:
    """The row's status, and its place in its node's transfer queue while it waits there."""
    status = _text(row.status)
    transfer = row.transfer
    if isinstance(transfer, TransferDoc) and transfer.queued:
        status += f" (queued {_text(transfer.position)})"
    return status


def _transfers_line(transfers: TransfersDoc | None) -> str | None:
    """`node-1 2 moving, 1 queued; node-2 1 moving (at most 2 per node)`; None when unknown."""
    if transfers is None:
        return None
    parts = [
        f"{node} {counts.moving} moving" + (f", {counts.queued} queued" if counts.queued else "")
        for node, counts in transfers.nodes.items()
    ]
    limit = transfers.max_transfers_per_node
    bound = f" (at most {limit} per node)" if limit is not None else ""
    return ("; ".join(parts) or "none") + bound


def _restore_cells(row: RestoreRow) -> tuple[str, ...]:
    return (
        "/".join(_text(part) for part in (row.cluster_id, row.node_id, row.restore_id)),
        _status(row),
        _text(row.revision),
        _progress(row.progress),
        _duration(row.age_seconds),
    )


def _job_result(row: JobRow) -> str:
    """What a job ended with: the error code, or the types a restore restored."""
    if row.error_code:
        return row.error_code
    if row.resource_types:
        return ", ".join(row.resource_types) + (" (partial)" if row.partial else "")
    return "-"


def _job_cells(row: JobRow) -> tuple[str, ...]:
    return (
        "/".join(_text(part) for part in (row.cluster_id, row.node_id, row.backup_id)),
        _text(row.kind),
        _text(row.service_id),
        _status(row),
        _text(row.revision),
        _text(row.attempts),
        _duration(row.age_seconds),
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
    name: str,
    error: str | None,
    columns: tuple[str, ...],
    rows: Sequence[_Row],
    cells: Callable[[_Row], tuple[str, ...]],
) -> list[str]:
    label = f"{name}:".ljust(10)
    if error is not None:
        return [f"{label}unknown ({error})"]
    lines = [f"{label}{len(rows)}"]
    if rows:
        lines += _table(columns, [cells(row) for row in rows])
    return lines


def render(data: Mapping[str, Any], *, now_ms: int) -> str:
    """The status (`fetch()`'s answer, read as a `StatusDocument`) as text for a terminal
    (`now_ms`: wall time in epoch ms, for ages)."""
    document = StatusDocument.from_wire(Fields(data))
    reasons = dict(document.reasons)
    session = document.session
    if _outage(session, now_ms) is not None:
        reasons.pop("session", None)  # the session line below says it, with the outage
    state = "ready" if document.ready else "not ready"
    lines = [f"agent:    {state}{_agent_facts(document.agent)}"]
    lines += [f"          {key}: {reason}" for key, reason in sorted(reasons.items())]
    for key, condition in sorted(document.conditions.items()):
        held = _since(now_ms, condition.since)
        suffix = f" (for {_duration(held)})" if held is not None else ""
        lines.append(f"condition: {key}: {_text(condition.text)}{suffix}")
    lines.append(f"session:  {_session_line(session, now_ms)}")
    if (transfers := _transfers_line(document.transfers)) is not None:
        lines.append(f"transfers: {transfers}")
    restores, jobs = document.restores, document.jobs
    lines += _section("restores", document.restores_error, _COLUMNS, restores, _restore_cells)
    lines.append("")
    lines += _section("jobs", document.jobs_error, _JOB_COLUMNS, jobs, _job_cells)
    return "\n".join(lines) + "\n"


def render_down(down: Mapping[str, Any], *, now_ms: int) -> str:
    """Why the agent is down, from the record of its refused start (`agent-down.json`)."""
    held = _since(now_ms, down.get("at"))
    when = f" since {_duration(held)}" if held is not None else ""
    code = down.get("exitCode")
    status = f" (exit {code})" if isinstance(code, int) else ""
    return f"agent:    down{when}{status}: {down.get('message', '-')}\n"
