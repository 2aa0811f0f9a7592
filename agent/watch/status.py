"""`AgentStatus`: the daemon's state as plain data, readable without reaching into handlers.

Writers (the Cloudly session, the composition root) call small methods; readers (the health
server, tests) call `snapshot()` and get an immutable `StatusSnapshot`, or await
`wait_until(predicate)` to be woken by the write that makes it true (no polling). Nothing here
does I/O or holds a secret: errors are stored as their text (agent errors never quote a secret),
the identity only as its expiry.

The session state is a state machine with one transition table (`STATE_TABLE`, an
`agent.table.TransitionTable` whose events are the states entered; `TRANSITIONS` lists the same
moves by state); an illegal move raises `InvalidState` and changes nothing. The session moves it
to show its own lifecycle (`agent.session.lifecycle.PUBLISHED`).

Beside the state (whose `state_since` moves at every retry) the status keeps the outage: since
when Cloudly has been unreachable (the end of the last session, or the agent's start when it
never connected), when the session last connected, and how many attempts failed since.
`unreachable_sentence()` says it in one line, the same in `restore-agent status`, `/readyz`'s
`session` reason and `STATUS=`:

    Cloudly unreachable since 2025-06-01 12:03:04 UTC (2 min), last connected
    2025-06-01 11:00:00 UTC, 17 attempts, last error: connection refused

Conditions are named facts about the node an operator should see, each under a stable key with
a sentence and the time it began (`set_condition`, `clear_condition`): `state-unwritable` (the
node's state disk refuses writes: the agent is not ready while it holds), `corestore-full`
(a node's Corestore answered that its disk is full), `corestore-unavailable` (a node's
Corestore has given no usable answer since the time named: its calls ride it out up to
`[corestore] outage_tolerance_s`), `state-recovered` (the state was salvaged or reset;
reconciliation with the nodes' Corestore is due), `duplicate-agent` (another agent enrolls with
the same machine token: the agent is not ready while it holds). `StatusHooks` sets them from the
parts' observer hooks (`agent.observe`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Final, Protocol

from agent.clock import SYSTEM_CLOCK, Clock
from agent.errors import InvalidState, StateUnwritable
from agent.table import TransitionTable

__all__ = [
    "DUPLICATE_AGENT",
    "NOT_READY_CONDITIONS",
    "STATE_TABLE",
    "STATE_UNWRITABLE",
    "TRANSITIONS",
    "AgentStatus",
    "ClusterSummary",
    "ClusterViewLike",
    "Condition",
    "NodeSummary",
    "NodeViewLike",
    "SessionState",
    "StatusHooks",
    "StatusSnapshot",
    "human_duration",
    "unreachable_sentence",
    "utc_text",
]

STATE_UNWRITABLE: Final = StateUnwritable.code
"""The condition of a state disk that refuses writes (`state-unwritable`, its wire code too)."""

DUPLICATE_AGENT: Final = "duplicate-agent"
"""The condition of a second agent with the same token (agent/credentials/contest.py)."""

NOT_READY_CONDITIONS: Final = frozenset({STATE_UNWRITABLE, DUPLICATE_AGENT})
"""The conditions under which the agent is not ready (each is also a readiness reason)."""


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
_ONWARD: Final[Mapping[SessionState, tuple[SessionState, ...]]] = {
    _S.STARTING: (_S.CONNECTING, _S.DRAINING, _S.STOPPED),
    _S.CONNECTING: (_S.AUTHENTICATING, _S.BACKING_OFF, _S.DRAINING, _S.STOPPED),
    _S.AUTHENTICATING: (_S.CONNECTED, _S.BACKING_OFF, _S.DRAINING, _S.STOPPED),
    _S.CONNECTED: (_S.BACKING_OFF, _S.DRAINING, _S.STOPPED),
    _S.BACKING_OFF: (_S.CONNECTING, _S.DRAINING, _S.STOPPED),
    _S.DRAINING: (_S.STOPPED,),
    _S.STOPPED: (),
}

STATE_TABLE: Final = TransitionTable[SessionState, SessionState](
    {(state, to): to for state, onward in _ONWARD.items() for to in onward}
)
"""The shown session state's table: the event is the state entered (`move_to`)."""

TRANSITIONS: Final[Mapping[SessionState, frozenset[SessionState]]] = MappingProxyType(
    {
        state: frozenset(to for (source, _), to in STATE_TABLE.moves.items() if source is state)
        for state in SessionState
    }
)
"""Where each state may go, every state listed (`STATE_TABLE`'s moves, by state)."""


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
            "unreachableSince": _ms(self.unreachable_since),
            "lastConnectedAt": _ms(self.last_connected_at),
            "failedAttempts": self.failed_attempts,
        }

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


def utc_text(seconds: float) -> str:
    """An epoch time as `2025-06-01 12:03:04 UTC` (the same on every node and in every log)."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))


def human_duration(seconds: float) -> str:
    """`45 s`, `3 min`, `5 h`, `2 d`: a duration as an operator reads it."""
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} d"


def unreachable_sentence(
    *,
    since: float,
    now: float,
    last_connected_at: float | None,
    attempts: int,
    last_error: str | None,
) -> str:
    """`Cloudly unreachable since <time> (<duration>), last connected <time>, <n> attempts,
    last error: <text>` (epoch seconds in; `never connected` when it never did)."""
    connected = "never connected" if last_connected_at is None else (
        f"last connected {utc_text(last_connected_at)}"
    )  # fmt: skip
    line = (
        f"Cloudly unreachable since {utc_text(since)} ({human_duration(now - since)}), "
        f"{connected}, {attempts} attempt{'' if attempts == 1 else 's'}"
    )
    return line + (f", last error: {last_error}" if last_error else "")


@dataclass(frozen=True, slots=True)
class Condition:
    """One named condition: what it is (a sentence) and since when (epoch seconds)."""

    text: str
    since: float

    def to_dict(self) -> dict[str, object]:
        """`{text, since}` with `since` in epoch milliseconds."""
        return {"text": self.text, "since": _ms(self.since)}


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


class StatusHooks:
    """The observer hooks (`agent.observe`) that name conditions on an `AgentStatus`: the state
    disk refusing writes, a node's Corestore full or unavailable, a salvaged or reset state still
    being reconciled. The composition root hands them out beside the metrics (`observe.Tee`)."""

    def __init__(self, status: AgentStatus) -> None:
        self._status = status
        self._full: set[str] = set()
        self._down: dict[str, float] = {}  # node -> since when its Corestore is unavailable
        self._recovered: tuple[str, float] | None = None
        self.unwritable_cause: str | None = None
        """The cause of the state disk's last refusal while it holds (None: writable)."""

    def state_write_failed(self, *, cause: str) -> None:
        """`state-unwritable`: the agent is not ready while it holds."""
        self.unwritable_cause = cause
        self._status.set_condition(
            STATE_UNWRITABLE, f"the node's state cannot be written ({cause})"
        )

    def state_writable(self) -> None:
        """The state disk takes writes again."""
        self.unwritable_cause = None
        self._status.clear_condition(STATE_UNWRITABLE)

    def corestore_full(self, *, node: str, full: bool) -> None:
        """`corestore-full` names every node whose Corestore said its disk is full."""
        if full:
            self._full.add(node)
        else:
            self._full.discard(node)
        if self._full:
            nodes = ", ".join(sorted(self._full))
            self._status.set_condition(
                "corestore-full", f"the Corestore of {nodes} answered that its disk is full"
            )
        else:
            self._status.clear_condition("corestore-full")

    def corestore_unavailable(self, *, node: str, since: float | None) -> None:
        """`corestore-unavailable` names every node whose Corestore gives no usable answer, and
        since when; it begins when the first of them did."""
        if since is None:
            self._down.pop(node, None)
        else:
            self._down[node] = since
        if not self._down:
            self._status.clear_condition("corestore-unavailable")
            return
        nodes = ", ".join(f"{n} since {utc_text(at)}" for n, at in sorted(self._down.items()))
        self._status.set_condition(
            "corestore-unavailable",
            f"the Corestore of {nodes} gives no usable answer (no answer, or 5xx, 408, 429); "
            "its calls ride the outage out up to [corestore] outage_tolerance_s",
            since=min(self._down.values()),
        )

    def state_recovered(self, *, how: str, at: float) -> None:
        """Remember how the state was recovered (named while reconciliation is pending)."""
        self._recovered = (how, at)

    def reconcile_pending(self, *, pending: bool) -> None:
        """`state-recovered` while reconciliation with the nodes' Corestore is due."""
        if pending and self._recovered is not None:
            how, _ = self._recovered
            self._status.set_condition(
                "state-recovered",
                f"the state was {how}; reconciling with each node's Corestore (what it holds "
                "that the state does not know is taken into cleanup)",
            )
        else:
            self._status.clear_condition("state-recovered")

    def recipient_retired(self) -> None:
        """A retirement alone names nothing (the watch decides when it is a second agent)."""

    def duplicate_agent(self, *, text: str | None) -> None:
        """`duplicate-agent` while another agent seems to use the same token: not ready."""
        if text is None:
            self._status.clear_condition(DUPLICATE_AGENT)
        else:
            self._status.set_condition(DUPLICATE_AGENT, text)
