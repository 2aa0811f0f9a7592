"""The status document, typed once: what the health endpoint serves and `restore-agent status`
reads back (pure).

Each part is a frozen value with its wire form (`to_wire()`: camelCase, in the order served,
every time in epoch milliseconds, a duration naming its unit) and its reader (`from_wire()`).
The builders are `agent.watch.overview` and `StatusSnapshot.to_dict()` (the session); the
reader is `agent.watch.statusview`:

    /readyz         ReadyBody: ready, reasons, session (SessionDoc, its ClusterDoc), agent
                    (AgentFacts), conditions (ConditionDoc by key)
    /v1/restores    RestoreRow each, /v1/jobs JobRow each, /v1/transfers TransfersDoc
                    (`agent.watch.docrows`)
    `status`        StatusDocument: the four answers in one (`combine()`; `--json` prints it)

The document is read from another process, possibly an older or a newer agent: `from_wire()`
ignores a field it does not know and reads one missing or of another type as None
(`agent.watch.docfields.Fields`), so nothing it reads raises.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Self

from agent.watch.docfields import Fields, Wire
from agent.watch.docrows import JobRow, RestoreRow, TransfersDoc

__all__ = [
    "AgentFacts",
    "ClusterDoc",
    "ConditionDoc",
    "NodeDoc",
    "ReadyBody",
    "SessionDoc",
    "StatusDocument",
]


@dataclass(frozen=True, slots=True)
class NodeDoc:
    """One node of the cluster: its validated Corestore endpoint, or why it has none."""

    node_id: str | None
    corestore_endpoint: str | None
    corestore_problems: tuple[str, ...]

    def to_wire(self) -> Wire:
        return {
            "nodeId": self.node_id,
            "corestoreEndpoint": self.corestore_endpoint,
            "corestoreProblems": list(self.corestore_problems),
        }

    @classmethod
    def from_wire(cls, data: Fields) -> Self:
        return cls(
            node_id=data.text("nodeId"),
            corestore_endpoint=data.text("corestoreEndpoint"),
            corestore_problems=data.texts("corestoreProblems") or (),
        )


@dataclass(frozen=True, slots=True)
class ClusterDoc:
    """The cluster view the session published, and when."""

    cluster_id: str | None
    published_at: float | None
    nodes: tuple[NodeDoc, ...]

    def to_wire(self) -> Wire:
        return {
            "clusterId": self.cluster_id,
            "publishedAt": self.published_at,
            "nodes": [node.to_wire() for node in self.nodes],
        }

    @classmethod
    def from_wire(cls, data: Fields) -> Self:
        return cls(
            cluster_id=data.text("clusterId"),
            published_at=data.number("publishedAt"),
            nodes=tuple(NodeDoc.from_wire(node) for node in data.records("nodes")),
        )


@dataclass(frozen=True, slots=True)
class SessionDoc:
    """`/readyz`'s `session`: the Cloudly session's state and since when, the connection's
    facts, the outage (since when Cloudly is unreachable, the last connect, the failed
    attempts) and the cluster read."""

    state: str | None
    state_since: float | None
    connected_since: float | None
    reconnect_count: int | None
    last_error: str | None
    last_error_at: float | None
    cluster: ClusterDoc | None
    in_flight: int | None
    identity_expires_at: int | None
    last_pong_at: float | None
    pong_latency_seconds: float | None
    unreachable_since: float | None
    last_connected_at: float | None
    failed_attempts: int | None

    def to_wire(self) -> Wire:
        return {
            "state": self.state,
            "stateSince": self.state_since,
            "connectedSince": self.connected_since,
            "reconnectCount": self.reconnect_count,
            "lastError": self.last_error,
            "lastErrorAt": self.last_error_at,
            "cluster": None if self.cluster is None else self.cluster.to_wire(),
            "inFlight": self.in_flight,
            "identityExpiresAt": self.identity_expires_at,
            "lastPongAt": self.last_pong_at,
            "pongLatencySeconds": self.pong_latency_seconds,
            "unreachableSince": self.unreachable_since,
            "lastConnectedAt": self.last_connected_at,
            "failedAttempts": self.failed_attempts,
        }

    @classmethod
    def from_wire(cls, data: Fields) -> Self:
        cluster = data.record("cluster")
        return cls(
            state=data.text("state"),
            state_since=data.number("stateSince"),
            connected_since=data.number("connectedSince"),
            reconnect_count=data.whole("reconnectCount"),
            last_error=data.text("lastError"),
            last_error_at=data.number("lastErrorAt"),
            cluster=None if cluster is None else ClusterDoc.from_wire(cluster),
            in_flight=data.whole("inFlight"),
            identity_expires_at=data.whole("identityExpiresAt"),
            last_pong_at=data.number("lastPongAt"),
            pong_latency_seconds=data.number("pongLatencySeconds"),
            unreachable_since=data.number("unreachableSince"),
            last_connected_at=data.number("lastConnectedAt"),
            failed_attempts=data.whole("failedAttempts"),
        )


@dataclass(frozen=True, slots=True)
class ConditionDoc:
    """One named condition of the node: its sentence and since when."""

    text: str | None
    since: float | None

    def to_wire(self) -> Wire:
        return {"text": self.text, "since": self.since}

    @classmethod
    def from_wire(cls, data: Fields) -> Self:
        return cls(text=data.text("text"), since=data.number("since"))


@dataclass(frozen=True, slots=True)
class AgentFacts:
    """`/readyz`'s `agent`: which version runs, since when and for how long."""

    version: str | None
    started_at: int | None
    uptime_seconds: float | None

    def to_wire(self) -> Wire:
        return {
            "version": self.version,
            "startedAt": self.started_at,
            "uptimeSeconds": self.uptime_seconds,
        }

    @classmethod
    def from_wire(cls, data: Fields) -> Self:
        return cls(
            version=data.text("version"),
            started_at=data.whole("startedAt"),
            uptime_seconds=data.number("uptimeSeconds"),
        )


def _conditions_wire(conditions: dict[str, ConditionDoc]) -> Wire:
    return {key: condition.to_wire() for key, condition in conditions.items()}


def _conditions(data: Fields, key: str) -> dict[str, ConditionDoc]:
    found = data.record(key) or Fields(None)
    return {
        name: ConditionDoc.from_wire(fields)
        for name, value in found.entries()
        if (fields := Fields.of(value)) is not None
    }


@dataclass(frozen=True, slots=True)
class ReadyBody:
    """`/readyz`: ready or not with each reason by stable key, and the same facts either way."""

    ready: bool
    reasons: dict[str, str]
    session: SessionDoc
    agent: AgentFacts
    conditions: dict[str, ConditionDoc]

    def to_wire(self) -> Wire:
        return {
            "ready": self.ready,
            "reasons": dict(self.reasons),
            "session": self.session.to_wire(),
            "agent": self.agent.to_wire(),
            "conditions": _conditions_wire(self.conditions),
        }


@dataclass(frozen=True, slots=True)
class StatusDocument:
    """What `restore-agent status` shows: `/readyz` with the rows of `/v1/restores` and
    `/v1/jobs` (or why the store could not be read) and `/v1/transfers` (None from an agent
    that serves none)."""

    ready: bool | None
    agent: AgentFacts | None
    reasons: dict[str, str]
    session: SessionDoc
    restores: tuple[RestoreRow, ...]
    restores_error: str | None
    jobs: tuple[JobRow, ...]
    jobs_error: str | None
    transfers: TransfersDoc | None
    conditions: dict[str, ConditionDoc]

    @staticmethod
    def combine(ready: Wire, restores: Wire, jobs: Wire, transfers: object) -> Wire:
        """The four answers in one, each part as the agent served it (what `--json` prints:
        a newer agent's fields pass through)."""
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

    @classmethod
    def from_wire(cls, data: Fields) -> Self:
        agent, transfers = data.record("agent"), data.record("transfers")
        reasons = data.record("reasons") or Fields(None)
        return cls(
            ready=data.flag("ready"),
            agent=None if agent is None else AgentFacts.from_wire(agent),
            reasons={key: str(reason) for key, reason in reasons.entries()},
            session=SessionDoc.from_wire(data.record("session") or Fields(None)),
            restores=tuple(RestoreRow.from_wire(row) for row in data.records("restores")),
            restores_error=data.text("restoresError"),
            jobs=tuple(JobRow.from_wire(row) for row in data.records("jobs")),
            jobs_error=data.text("jobsError"),
            transfers=None if transfers is None else TransfersDoc.from_wire(transfers),
            conditions=_conditions(data, "conditions"),
        )
