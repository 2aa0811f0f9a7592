"""`AgentStatus`: the daemon's state as plain data, readable without reaching into handlers.

Writers (the Cloudly session, the composition root) call small methods; readers (the health
server, tests) call `snapshot()` and get an immutable `StatusSnapshot`, or await
`wait_until(predicate)` to be woken by the write that makes it true (no polling). Nothing here
does I/O or holds a secret: errors are stored as their text (agent errors never quote a secret),
the identity only as its expiry.

The session state (`agent.watch.sessionstate.SessionState`, re-exported here: it is the
snapshot's) moves only through its one table, `STATE_TABLE`; an illegal move raises
`InvalidState` and changes nothing.

Beside the state (whose `state_since` moves at every retry) the status keeps the outage: since
when Cloudly has been unreachable (the end of the last session, or the agent's start when it
never connected), when the session last connected, and how many attempts failed since
(`StatusSnapshot.unreachable()` says it in one line, `agent.watch.outagetext`).

Conditions are named facts about the node an operator should see, each under a stable key with
a sentence and the time it began (`set_condition`, `clear_condition`): `state-unwritable` (the
node's state disk refuses writes: the agent is not ready while it holds), `corestore-full`
(a node's Corestore answered that its disk is full), `corestore-unavailable` (a node's
Corestore has given no usable answer since the time named: its calls ride it out up to
`[corestore] outage_tolerance_s`), `state-recovered` (the state was salvaged or reset;
reconciliation with the nodes' Corestore is due), `duplicate-agent` (another agent enrolls with
the same machine token: the agent is not ready while it holds). `agent.watch.statushooks` sets
them from the parts' observer hooks (`agent.observe`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final, Protocol

from agent.clock import SYSTEM_CLOCK, Clock
from agent.errors import InvalidState, StateUnwritable
from agent.watch.document import ClusterDoc, ConditionDoc, NodeDoc, SessionDoc
from agent.watch.outagetext import unreachable_sentence
from agent.watch.sessionstate import STATE_TABLE, SessionState

__all__ = [
    "DUPLICATE_AGENT",
    "NOT_READY_CONDITIONS",
    "STATE_UNWRITABLE",
    "AgentStatus",
    "ClusterSummary",
    "ClusterViewLike",
    "Condition",
    "NodeSummary",
    "NodeViewLike",
    "SessionState",
    "StatusSnapshot",
]

STATE_UNWRITABLE: Final = StateUnwritable.code
"""The condition of a state disk that refuses writes (`state-unwritable`, its wire code too)."""

DUPLICATE_AGENT: Final = "duplicate-agent"
"""The condition of a second agent with the same token (agent/credentials/contest.py)."""

NOT_READY_CONDITIONS: Final = frozenset({STATE_UNWRITABLE, DUPLICATE_AGENT})
"""The conditions under which the agent is not ready (each is also a readiness reason)."""


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
    started_at: float | None = None
    """When the agent started (the status was made)."""
    unreachable_since: float | None = None
    """Since when Cloudly has been unreachable: the end of the last session, or the agent's
    start if it never connected. None while connected, and before the first attempt failed."""
    last_connected_at: float | None = None
    """When the session last became connected (None: never)."""
    failed_attempts: int = 0
    """Attempts that failed since the outage began (0 while connected)."""
    conditions: Mapping[str, Condition] = field(default_factory=dict)
    """The node's named conditions by stable key (module docstring)."""

    @property
    def cluster_id(self) -> str | None:
        """The session's cluster, once a cluster document was read."""
        return self.cluster.cluster_id if self.cluster is not None else None

    def document(self) -> SessionDoc:
        """The session as `/readyz` serves it: every time in epoch milliseconds, as in the
        seeds and the store's rows; a duration names its unit."""
        cluster = self.cluster
        return SessionDoc(
            state=self.state.value,
            state_since=_ms(self.state_since),
            connected_since=_ms(self.connected_since),
            reconnect_count=self.reconnect_count,
            last_error=self.last_error,
            last_error_at=_ms(self.last_error_at),
            cluster=None
            if cluster is None
            else ClusterDoc(
                cluster_id=cluster.cluster_id,
                published_at=_ms(cluster.published_at),
                nodes=tuple(
                    NodeDoc(node.node_id, node.corestore_endpoint, node.corestore_problems)
                    for node in cluster.nodes
                ),
            ),
            in_flight=self.in_flight,
            identity_expires_at=self.identity_expires_at_ms,
            last_pong_at=_ms(self.last_pong_at),
            pong_latency_seconds=self.pong_latency,
            unreachable_since=_ms(self.unreachable_since),
            last_connected_at=_ms(self.last_connected_at),
            failed_attempts=self.failed_attempts,
        )

    def to_dict(self) -> dict[str, object]:
        """Plain JSON-ready data (the health endpoint's `session`: `document()`'s wire form)."""
        return self.document().to_wire()

    def unreachable(self, now: float) -> str | None:
        """The outage in one line (`unreachable_sentence`), None when there is none."""
        if self.unreachable_since is None:
            return None
        return unreachable_sentence(
            since=self.unreachable_since,
            now=now,
            last_connected_at=self.last_connected_at,
            attempts=self.failed_attempts,
            last_error=self.last_error,
        )


@dataclass(frozen=True, slots=True)
class Condition:
    """One named condition: what it is (a sentence) and since when (epoch seconds)."""

    text: str
    since: float

    def document(self) -> ConditionDoc:
        """As `/readyz` serves it: `since` in epoch milliseconds."""
        return ConditionDoc(text=self.text, since=_ms(self.since))

    def to_dict(self) -> dict[str, object]:
        """`{text, since}` (`document()`'s wire form)."""
        return self.document().to_wire()


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
        self._state_since = self._started_at = clock.time()
        self._connected_since: float | None = None
        self._last_connected_at: float | None = None
        self._lost_at: float | None = None  # when the last session ended
        self._unreachable_since: float | None = None
        self._failed_attempts = 0
        self._reconnect_count = 0
        self._last_error: str | None = None
        self._last_error_at: float | None = None
        self._cluster: ClusterSummary | None = None
        self._in_flight: Callable[[], int] = _no_work
        self._identity_expires_at_ms: int | None = None
        self._last_pong_at: float | None = None
        self._pong_latency: float | None = None
        self._conditions: dict[str, Condition] = {}
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
        if not STATE_TABLE.allows(self._state, state):
            raise InvalidState(f"session state cannot move from {self._state} to {state}")
        now = self._clock()
        if state is SessionState.CONNECTING and self._state is SessionState.BACKING_OFF:
            self._reconnect_count += 1
        if state is SessionState.CONNECTED:
            self._connected_since = self._last_connected_at = now
            self._unreachable_since, self._failed_attempts = None, 0
        elif self._state is SessionState.CONNECTED:
            self._connected_since = None
            self._lost_at = now
        if state is SessionState.BACKING_OFF:
            # The outage began when the last session ended (or at start): a retry does not
            # move it, as it moves `state_since`.
            if self._unreachable_since is None:
                lost = self._lost_at
                self._unreachable_since = self._started_at if lost is None else lost
            if self._state is not SessionState.CONNECTED:
                self._failed_attempts += 1
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

    def set_condition(self, key: str, text: str, *, since: float | None = None) -> None:
        """Name a condition (a new text keeps the time it began; `since` says it, when the
        condition began before it was named)."""
        current = self._conditions.get(key)
        if current is not None and current.text == text:
            return
        if since is None:
            since = current.since if current is not None else self._clock()
        self._conditions[key] = Condition(text, since)
        self._notify()

    def clear_condition(self, key: str) -> None:
        """The condition under `key` is over (nothing if there was none)."""
        if self._conditions.pop(key, None) is not None:
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
            started_at=self._started_at,
            unreachable_since=self._unreachable_since,
            last_connected_at=self._last_connected_at,
            failed_attempts=self._failed_attempts,
            conditions=dict(self._conditions),
        )
