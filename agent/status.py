"""`AgentStatus`: the daemon's state as plain data, readable without reaching into handlers.

Writers (the Cloudly session, the composition root) call small methods; readers (the health
server, tests) call `snapshot()` and get an immutable `StatusSnapshot`, or await
`wait_until(predicate)` to be woken by the write that makes it true (no polling). Nothing here
does I/O or holds a secret: errors are stored as their text (agent errors never quote a secret),
the identity only as its expiry.

The session state is a state machine with one transition table (`TRANSITIONS`); an illegal move
raises `InvalidState` and changes nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

from agent.clock import SYSTEM_CLOCK, Clock
from agent.errors import InvalidState

__all__ = [
    "TRANSITIONS",
    "AgentStatus",
    "ClusterSummary",
    "ClusterViewLike",
    "NodeSummary",
    "NodeViewLike",
    "SessionState",
    "StatusSnapshot",
]


class SessionState(StrEnum):
    """Where the Cloudly session is."""

    STARTING = "starting"
    CONNECTING = "connecting"
    AUTHENTICATING = "authenticating"
    CONNECTED = "connected"
    BACKING_OFF = "backing-off"
    DRAINING = "draining"
    STOPPED = "stopped"


_S = SessionState

# Every attempt that fails goes through BACKING_OFF (even with a zero delay), so the reconnect
# count and the last error are recorded in exactly one place. DRAINING and STOPPED are reachable
# from everywhere because a signal may arrive at any moment.
TRANSITIONS: Mapping[SessionState, frozenset[SessionState]] = {
    _S.STARTING: frozenset({_S.CONNECTING, _S.DRAINING, _S.STOPPED}),
    _S.CONNECTING: frozenset({_S.AUTHENTICATING, _S.BACKING_OFF, _S.DRAINING, _S.STOPPED}),
    _S.AUTHENTICATING: frozenset({_S.CONNECTED, _S.BACKING_OFF, _S.DRAINING, _S.STOPPED}),
    _S.CONNECTED: frozenset({_S.BACKING_OFF, _S.DRAINING, _S.STOPPED}),
    _S.BACKING_OFF: frozenset({_S.CONNECTING, _S.DRAINING, _S.STOPPED}),
    _S.DRAINING: frozenset({_S.STOPPED}),
    _S.STOPPED: frozenset(),
}


class NodeViewLike(Protocol):
    """What the status reads from one node of a cluster view."""

    @property
    def corestore_endpoint(self) -> str | None: ...

    @property
    def corestore_problems(self) -> tuple[str, ...] | list[str]: ...


class ClusterViewLike(Protocol):
    """What the status reads from a cluster view (`agent.contracts.cluster.ClusterView`)."""

    @property
    def cluster_id(self) -> str: ...

    @property
    def nodes(self) -> Mapping[str, NodeViewLike]: ...


@dataclass(frozen=True, slots=True)
class NodeSummary:
    """One node: its id and either its validated Corestore endpoint or why it has none."""

    node_id: str
    corestore_endpoint: str | None
    corestore_problems: tuple[str, ...]

    @property
    def has_corestore(self) -> bool:
        """Whether the agent may route work to this node's Corestore."""
        return self.corestore_endpoint is not None


@dataclass(frozen=True, slots=True)
class ClusterSummary:
    """The published cluster view, reduced to what an operator needs to see."""

    cluster_id: str
    nodes: tuple[NodeSummary, ...]
    published_at: float

    @property
    def nodes_with_corestore(self) -> tuple[str, ...]:
        """Ids of the nodes with a valid Corestore endpoint."""
        return tuple(node.node_id for node in self.nodes if node.has_corestore)

    @property
    def nodes_without_corestore(self) -> tuple[str, ...]:
        """Ids of the nodes whose Corestore endpoint is absent or invalid."""
        return tuple(node.node_id for node in self.nodes if not node.has_corestore)

    @classmethod
    def of(cls, view: ClusterViewLike, published_at: float) -> ClusterSummary:
        """Summarise a cluster view (nodes sorted by id for stable output)."""
        nodes = tuple(
            NodeSummary(
                node_id=node_id,
                corestore_endpoint=node.corestore_endpoint,
                corestore_problems=tuple(node.corestore_problems),
            )
            for node_id, node in sorted(view.nodes.items())
        )
        return cls(cluster_id=view.cluster_id, nodes=nodes, published_at=published_at)


@dataclass(frozen=True, slots=True)
class StatusSnapshot:
    """The daemon's state at one moment. Times are epoch seconds; expiry is epoch milliseconds."""

    state: SessionState
    state_since: float
    connected_since: float | None
    reconnect_count: int
    last_error: str | None
    last_error_at: float | None
    cluster: ClusterSummary | None
    in_flight: int
    identity_expires_at_ms: int | None
    last_pong_at: float | None = None
    """When Cloudly last answered a keepalive ping on this connection (None: not yet)."""
    pong_latency: float | None = None
    """That ping's round trip in seconds."""
    corestore_unavailable: tuple[tuple[str, float], ...] = ()
    """The nodes whose Corestore gives no usable answer, each with since when (epoch seconds)."""

    @property
    def cluster_id(self) -> str | None:
        """The session's cluster, once a cluster document was read."""
        return self.cluster.cluster_id if self.cluster is not None else None

    def to_dict(self) -> dict[str, object]:
        """Plain JSON-ready data (for a health endpoint). Every time is epoch milliseconds, as
        in the seeds and the store's rows; a duration names its unit."""
        cluster: dict[str, object] | None = None
        if self.cluster is not None:
            cluster = {
                "clusterId": self.cluster.cluster_id,
                "publishedAt": _ms(self.cluster.published_at),
                "nodes": [
                    {
                        "nodeId": node.node_id,
                        "corestoreEndpoint": node.corestore_endpoint,
                        "corestoreProblems": list(node.corestore_problems),
                    }
                    for node in self.cluster.nodes
                ],
            }
        return {
            "state": self.state.value,
            "stateSince": _ms(self.state_since),
            "connectedSince": _ms(self.connected_since),
            "reconnectCount": self.reconnect_count,
            "lastError": self.last_error,
            "lastErrorAt": _ms(self.last_error_at),
            "cluster": cluster,
            "inFlight": self.in_flight,
            "identityExpiresAt": self.identity_expires_at_ms,
            "lastPongAt": _ms(self.last_pong_at),
            "pongLatencySeconds": self.pong_latency,
            "corestoreUnavailableSince": {
                node: _ms(since) for node, since in self.corestore_unavailable
            },
        }


def _ms(seconds: float | None) -> int | None:
    """Epoch seconds (the status's clock) as epoch milliseconds."""
    return None if seconds is None else round(seconds * 1000)


def _no_work() -> int:
    return 0


class AgentStatus:
    """The mutable holder behind the snapshots. Single event loop; no locking needed."""

    def __init__(self, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock.time
        self._state = SessionState.STARTING
        self._state_since = clock.time()
        self._connected_since: float | None = None
        self._reconnect_count = 0
        self._last_error: str | None = None
        self._last_error_at: float | None = None
        self._cluster: ClusterSummary | None = None
        self._in_flight: Callable[[], int] = _no_work
        self._identity_expires_at_ms: int | None = None
        self._last_pong_at: float | None = None
        self._pong_latency: float | None = None
        self._corestore_down: dict[str, float] = {}
        self._changed = asyncio.Event()

    def _notify(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait_until(self, predicate: Callable[[StatusSnapshot], bool]) -> StatusSnapshot:
        """The first snapshot that satisfies `predicate`, checked now and after every write.

        The in-flight count is read, not written, so a predicate on it alone is re-checked
        only when something else changes.
        """
        while True:
            snapshot = self.snapshot()
            if predicate(snapshot):
                return snapshot
            changed = self._changed
            await changed.wait()

    @property
    def state(self) -> SessionState:
        """The current session state."""
        return self._state

    def move_to(self, state: SessionState) -> None:
        """Enter `state`; raises `InvalidState` (and changes nothing) if the move is illegal."""
        if state not in TRANSITIONS[self._state]:
            raise InvalidState(f"session state cannot move from {self._state} to {state}")
        now = self._clock()
        if state is SessionState.CONNECTING and self._state is SessionState.BACKING_OFF:
            self._reconnect_count += 1
        if state is SessionState.CONNECTED:
            self._connected_since = now
        elif self._state is SessionState.CONNECTED:
            self._connected_since = None
        if state in (SessionState.BACKING_OFF, SessionState.STOPPED):
            # An identity (and a pong) belongs to one connection; once that is gone its
            # expiry is no longer a fact about the agent.
            self._identity_expires_at_ms = None
            self._last_pong_at = self._pong_latency = None
        self._state = state
        self._state_since = now
        self._notify()

    def record_error(self, text: str) -> None:
        """Remember the last session error (its text; callers never pass a secret)."""
        self._last_error = text
        self._last_error_at = self._clock()
        self._notify()

    def publish_cluster(self, view: ClusterViewLike) -> ClusterSummary:
        """Publish the cluster view the session just read; returns its summary."""
        summary = ClusterSummary.of(view, self._clock())
        self._cluster = summary
        self._notify()
        return summary

    def set_identity_expiry(self, expires_at_ms: int | None) -> None:
        """Record when the current identity expires (epoch milliseconds), or forget it."""
        self._identity_expires_at_ms = expires_at_ms
        self._notify()

    def record_pong(self, latency: float) -> None:
        """Cloudly answered a keepalive ping after `latency` seconds."""
        self._last_pong_at = self._clock()
        self._pong_latency = latency
        self._notify()

    def corestore_unavailable(self, *, node: str, since: float | None) -> None:
        """`node`'s Corestore gives no usable answer since `since` (epoch seconds), or answers
        again (None): the `agent.observe.CorestoreObserver` hook."""
        if since is None:
            self._corestore_down.pop(node, None)
        else:
            self._corestore_down[node] = since
        self._notify()

    def bind_in_flight(self, source: Callable[[], int] | None) -> None:
        """Read the in-flight handler count from `source` (the live peer), or report 0."""
        self._in_flight = source or _no_work

    def snapshot(self) -> StatusSnapshot:
        """An immutable copy of the current state."""
        return StatusSnapshot(
            state=self._state,
            state_since=self._state_since,
            connected_since=self._connected_since,
            reconnect_count=self._reconnect_count,
            last_error=self._last_error,
            last_error_at=self._last_error_at,
            cluster=self._cluster,
            in_flight=self._in_flight(),
            identity_expires_at_ms=self._identity_expires_at_ms,
            last_pong_at=self._last_pong_at,
            pong_latency=self._pong_latency,
            corestore_unavailable=tuple(sorted(self._corestore_down.items())),
        )
