"""What an operator sees of the daemon: readiness with its reasons, and one row per restore.

Pure: the health server (`agent/watch/health.py`) gathers the facts (a status snapshot, whether the
store is open, the stored node states with their staging totals) and these functions turn
them into the JSON it serves, each part built as its typed form (`agent.watch.document`,
`agent.watch.docrows`) and served as its wire form; `restore-agent status` reads the same
document back and prints it as a table.

Readiness (`readiness()`): ready only when every check passes; each failing check adds one
reason under a stable key:

    session     the Cloudly session is not `connected`: its state and, in an outage, since
                when Cloudly is unreachable, when it last connected, the failed attempts and
                the last error (`AgentStatus`'s `unreachable_sentence`)
    keepalive   connected, but Cloudly answered no keepalive ping (nor the authentication)
                within `stale_after` seconds
    store       the revision store is not open
    state-unwritable
                the node's state disk refuses writes (full, read-only, failing): requests
                that write are answered `state-unwritable` meanwhile, reads are served
    cluster     no cluster document read yet, or no node of it has a valid Corestore
                endpoint (the agent could route no work)

A restore row (`restore_row()`) says where one node state is: its key, status, revision, age
and, while work is under way, its progress as `{done, total, unit}`:

    prepared, staging   bytes Corestore accepted of the manifest's total (unit `bytes`)
    restoring           resource mappings restored (unit `resources`)
    verifying           resource mappings verified, passed or failed (unit `resources`)
    cleaning            resources whose cleanup finished (unit `resources`)

A row never carries a grant (none is stored) nor the plan's mappings: only counts.

A job row (`job_rows()`) says where one relay job (a service backup or restore) is: its key,
status, revision, attempts and age; a finished restore names the resource types it restored and
whether it was partial, a failed job its error code and message. Never the service document.

`agent_facts()` is `/readyz`'s `agent`: the version, when it started and its uptime.

Transfers (`agent.transfers`): `with_transfers()` gives each restore or job row its `transfer`,
null unless bytes of it move or wait for one of the node's places right now:

    {"kind": "stage", "state": "queued", "position": 3, "seconds": 41}
    {"kind": "closure-import", "state": "moving", "position": null, "seconds": 7}

(`position`: its place in the node's queue, 1 next; `seconds`: since it asked, or since it
moves). `transfers_body()` is `/v1/transfers`: the limits, each node's counts, every transfer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from agent import __version__
from agent.domain.jobs import StoredJob
from agent.domain.outcomes import JobFailed, Succeeded
from agent.domain.restores import StoredState
from agent.transfers.limits import TransferEntry, TransferView
from agent.watch.docfields import Wire
from agent.watch.docrows import (
    JobRow,
    NodeCounts,
    ObjectsProgress,
    Progress,
    RestoreRow,
    TransferDoc,
    TransferListing,
    TransfersDoc,
)
from agent.watch.document import AgentFacts, ReadyBody
from agent.watch.status import NOT_READY_CONDITIONS, SessionState, StatusSnapshot

__all__ = [
    "BYTES_STATUSES",
    "RestoreFacts",
    "agent_facts",
    "job_rows",
    "readiness",
    "ready_body",
    "restore_row",
    "restore_rows",
    "transfers_body",
    "with_transfers",
]

BYTES_STATUSES: Final = frozenset({"prepared", "staging"})
"""The statuses whose progress is staged bytes (the store counts staging rows only for them)."""


def readiness(
    snapshot: StatusSnapshot, *, store_open: bool, now: float, stale_after: float
) -> dict[str, str]:
    """The reasons the agent is not ready, by stable key; empty when it is ready.

    `now` is wall seconds (the status's clock); `stale_after` how long a connection may go
    without a pong before it no longer counts as alive.
    """
    reasons: dict[str, str] = {}
    if snapshot.state is not SessionState.CONNECTED:
        reason = f"the Cloudly session is {snapshot.state.value}"
        outage = snapshot.unreachable(now)
        if outage is not None and snapshot.state is not SessionState.STOPPED:
            reason += f": {outage}"
        elif snapshot.last_error is not None:
            reason += f" (last error: {snapshot.last_error})"
        reasons["session"] = reason
    else:
        heard = max(
            (t for t in (snapshot.last_pong_at, snapshot.connected_since) if t is not None),
            default=None,
        )
        if heard is None or now - heard > stale_after:
            silent = "ever" if heard is None else f"{now - heard:.0f} s"
            reasons["keepalive"] = (
                f"Cloudly answered no keepalive ping for {silent} (allowed {stale_after:g} s)"
            )
    if not store_open:
        reasons["store"] = "the revision store is not open"
    for key in sorted(NOT_READY_CONDITIONS & snapshot.conditions.keys()):
        reasons[key] = snapshot.conditions[key].text
    cluster = snapshot.cluster
    if cluster is None:
        reasons["cluster"] = "no cluster document has been read"
    elif not cluster.nodes_with_corestore:
        problems = "; ".join(
            f"{node.node_id}: {', '.join(node.corestore_problems) or 'no endpoint'}"
            for node in cluster.nodes
        )
        reasons["cluster"] = (
            f"no node of cluster {cluster.cluster_id} has a valid Corestore endpoint"
            + (f" ({problems})" if problems else " (the document lists no node)")
        )
    return reasons


def agent_facts(snapshot: StatusSnapshot, *, now: float) -> AgentFacts:
    """`/readyz`'s `agent`: which version runs and for how long (`restore-agent status`'s
    first line)."""
    started = snapshot.started_at
    return AgentFacts(
        version=__version__,
        started_at=None if started is None else round(started * 1000),
        uptime_seconds=None if started is None else int(max(0.0, now - started)),
    )


def ready_body(snapshot: StatusSnapshot, reasons: dict[str, str], *, now: float) -> Wire:
    """`/readyz`: `reasons` (from `readiness()`, empty when ready), the session, the agent's
    facts and the node's conditions by key."""
    return ReadyBody(
        ready=not reasons,
        reasons=reasons,
        session=snapshot.document(),
        agent=agent_facts(snapshot, now=now),
        conditions={key: c.document() for key, c in sorted(snapshot.conditions.items())},
    ).to_wire()


@dataclass(frozen=True, slots=True)
class RestoreFacts:
    """What the store holds of one restore besides its state: its plan's counts (resource
    mappings, manifest objects and bytes) and its staging so far (accepted chunk bytes,
    written objects; counted in the `BYTES_STATUSES` only)."""

    mappings: int = 0
    objects: int = 0
    total_bytes: int = 0
    chunk_bytes: int = 0
    written_objects: int = 0


def _progress(stored: StoredState, facts: RestoreFacts) -> Progress | None:
    state, mappings = stored.state, facts.mappings
    if stored.status in BYTES_STATUSES:
        objects = ObjectsProgress(done=facts.written_objects, total=facts.objects)
        return Progress(facts.chunk_bytes, facts.total_bytes, "bytes", objects)
    if stored.status == "restoring":
        return Progress(len(state.completed_resource_mapping_ids), mappings, "resources")
    if stored.status == "verifying":
        checked = sum(1 for r in state.verification.results if r.status in ("passed", "failed"))
        return Progress(checked, mappings, "resources")
    if stored.status == "cleaning" and state.cleanup is not None:
        resources = state.cleanup.resources
        finished = sum(1 for r in resources if r.status in ("succeeded", "failed"))
        return Progress(finished, len(resources), "resources")
    return None


def restore_row(stored: StoredState, facts: RestoreFacts, *, now_ms: int) -> dict[str, Any]:
    """One node state as the operator's JSON row (camelCase, no secret, no plan detail)."""
    state = stored.state
    return RestoreRow(
        cluster_id=stored.key.cluster_id,
        node_id=stored.key.node_name,
        restore_id=stored.key.restore_id,
        status=stored.status,
        revision=stored.revision,
        updated_at=stored.updated_at,
        age_seconds=max(0, now_ms - stored.updated_at) // 1000,
        progress=_progress(stored, facts),
        last_error_code=state.last_error_code,
        last_error_message=state.last_error_message,
    ).to_wire()


def restore_rows(
    states: Sequence[StoredState],
    facts: Mapping[tuple[str, str, str], RestoreFacts],
    *,
    now_ms: int,
) -> list[dict[str, Any]]:
    """Every row, in the order given (the store gives the most recent change first)."""
    empty = RestoreFacts()
    return [
        restore_row(
            stored,
            facts.get((stored.key.cluster_id, stored.key.node_name, stored.key.restore_id), empty),
            now_ms=now_ms,
        )
        for stored in states
    ]


def job_rows(jobs: Sequence[StoredJob], *, now_ms: int) -> list[dict[str, Any]]:
    """One operator's row per relay job, in the order given."""
    return [_job_row(job, now_ms=now_ms) for job in jobs]


def _job_row(job: StoredJob, *, now_ms: int) -> dict[str, Any]:
    report = job.result.report if isinstance(job.result, Succeeded) else None
    error = job.result if isinstance(job.result, JobFailed) else None
    return JobRow(
        cluster_id=job.key.cluster_id,
        node_id=job.key.node_id,
        kind=job.key.kind,
        backup_id=job.key.backup_id,
        service_id=job.key.service_id,
        run=job.key.run,
        status=job.status,
        revision=job.revision,
        attempts=job.attempts,
        updated_at=job.updated_at,
        age_seconds=max(0, now_ms - job.updated_at) // 1000,
        resource_types=None
        if report is None or report.resource_types is None
        else tuple(report.resource_types),
        partial=report is not None and report.partial,
        error_code=None if error is None else error.code,
        error_message=None if error is None else error.message,
        delivered=job.delivered_at is not None,
    ).to_wire()


def _transfer(entry: TransferEntry, now: float) -> TransferDoc:
    return TransferDoc(
        kind=entry.ticket.kind,
        state=entry.state,
        position=entry.position,
        seconds=int(max(0.0, now - entry.since)),
    )


def _row_subject(row: Mapping[str, Any]) -> tuple[Any, ...]:
    """The transfer subject (`agent.transfers.limits.Ticket.subject`) a row stands for."""
    if "restoreId" in row:
        return ("restore", row["clusterId"], row["nodeId"], row["restoreId"])
    return (
        "job", row["clusterId"], row["nodeId"], row["kind"], row["backupId"], row["serviceId"],
        str(row["run"]),
    )  # fmt: skip


def with_transfers(rows: list[dict[str, Any]], view: TransferView) -> list[dict[str, Any]]:
    """`rows` (restore or job rows), each with its `transfer` (None: nothing moves or waits)."""
    by_subject = {entry.ticket.subject: entry for entry in view.entries}
    for row in rows:
        entry = by_subject.get(_row_subject(row))
        row["transfer"] = None if entry is None else _transfer(entry, view.now).to_wire()
    return rows


def transfers_body(view: TransferView) -> dict[str, Any]:
    """`/v1/transfers`: the limits, each node's moving and queued counts, every transfer (per
    node: the moving ones, then the queue in its order) with what it moves for."""
    return TransfersDoc(
        max_transfers_per_node=view.max_per_node,
        max_bytes_per_second_per_node=view.bytes_per_s,
        nodes={
            node: NodeCounts(moving=counts.moving, queued=counts.queued)
            for node, counts in view.counts.items()
        },
        transfers=tuple(
            TransferListing(
                node_id=entry.ticket.node,
                subject=" ".join(str(part) for part in entry.ticket.subject[1:]),
                transfer=_transfer(entry, view.now),
            )
            for entry in view.entries
        ),
    ).to_wire()
