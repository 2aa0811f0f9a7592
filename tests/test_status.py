"""AgentStatus: a transition table for the session state and immutable snapshots for readers."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

import pytest

from agent.errors import InvalidState
from agent.watch.outagetext import unreachable_sentence
from agent.watch.sessionstate import TRANSITIONS
from agent.watch.status import AgentStatus, SessionState
from tests.clock import ManualClock


@dataclass(frozen=True)
class _Node:
    corestore_endpoint: str | None
    corestore_problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class _View:
    cluster_id: str
    nodes: Mapping[str, _Node] = field(default_factory=dict)


def _connected(status: AgentStatus) -> None:
    for state in (SessionState.CONNECTING, SessionState.AUTHENTICATING, SessionState.CONNECTED):
        status.move_to(state)


def test_a_new_status_is_starting_with_nothing_known() -> None:
    """Before the session runs the snapshot says `starting` and knows no cluster."""
    snap = AgentStatus().snapshot()
    assert snap.state is SessionState.STARTING
    assert (snap.cluster, snap.connected_since, snap.last_error) == (None, None, None)
    assert (snap.reconnect_count, snap.in_flight) == (0, 0)


def test_every_state_has_a_row_in_the_transition_table() -> None:
    """The table is total: every state lists where it may go (stopped goes nowhere)."""
    assert set(TRANSITIONS) == set(SessionState)
    assert TRANSITIONS[SessionState.STOPPED] == frozenset()


def test_illegal_move_raises_and_changes_nothing() -> None:
    """Skipping authentication is refused and leaves the state as it was."""
    status = AgentStatus()
    status.move_to(SessionState.CONNECTING)
    before = status.snapshot()
    with pytest.raises(InvalidState, match="connecting to connected"):
        status.move_to(SessionState.CONNECTED)
    assert status.snapshot() == before


def test_stopped_is_final() -> None:
    """Nothing leaves `stopped`."""
    status = AgentStatus()
    status.move_to(SessionState.STOPPED)
    for state in SessionState:
        with pytest.raises(InvalidState):
            status.move_to(state)


def test_connected_since_is_set_on_connect_and_cleared_on_loss() -> None:
    """`connected_since` is the time the session reached `connected`, None once it is lost."""
    clock = ManualClock(start=1000.0)
    status = AgentStatus(clock=clock)
    status.move_to(SessionState.CONNECTING)
    clock.advance(5.0)
    status.move_to(SessionState.AUTHENTICATING)
    status.move_to(SessionState.CONNECTED)
    assert status.snapshot().connected_since == 1005.0
    status.move_to(SessionState.BACKING_OFF)
    assert status.snapshot().connected_since is None


def test_reconnect_count_counts_attempts_after_backing_off() -> None:
    """Each return from `backing-off` to `connecting` is one reconnect; the first is not."""
    status = AgentStatus()
    _connected(status)
    for _ in range(3):
        status.move_to(SessionState.BACKING_OFF)
        status.move_to(SessionState.CONNECTING)
    assert status.snapshot().reconnect_count == 3


def test_last_error_keeps_text_and_time() -> None:
    """The last error is kept as text with the time it was recorded."""
    clock = ManualClock(start=1000.0)
    status = AgentStatus(clock=clock)
    status.record_error("session closed with code 1006")
    clock.advance(1000.0)
    status.record_error("getIdentityByToken failed: no")
    snap = status.snapshot()
    assert (snap.last_error, snap.last_error_at) == ("getIdentityByToken failed: no", 2000.0)


def test_cluster_summary_splits_nodes_by_corestore_validity() -> None:
    """The published view lists every node, with or without a valid Corestore endpoint."""
    status = AgentStatus()
    status.publish_cluster(
        _View(
            "c1",
            {
                "n2": _Node(None, ("cluster node corestore endpoint must be a parsable URL",)),
                "n1": _Node("http://10.0.0.1:3000"),
            },
        )
    )
    cluster = status.snapshot().cluster
    assert cluster is not None
    assert status.snapshot().cluster_id == "c1"
    assert [node.node_id for node in cluster.nodes] == ["n1", "n2"]
    assert cluster.nodes_with_corestore == ("n1",)
    assert cluster.nodes_without_corestore == ("n2",)
    assert cluster.nodes[1].corestore_problems == (
        "cluster node corestore endpoint must be a parsable URL",
    )


def test_in_flight_is_read_from_the_bound_source() -> None:
    """The in-flight count comes from the live peer at snapshot time; unbound means 0."""
    status = AgentStatus()
    count = [4]
    status.bind_in_flight(lambda: count[0])
    assert status.snapshot().in_flight == 4
    count[0] = 1
    assert status.snapshot().in_flight == 1
    status.bind_in_flight(None)
    assert status.snapshot().in_flight == 0


def test_identity_expiry_survives_draining_but_not_a_lost_session() -> None:
    """The identity's expiry is kept while draining and forgotten when the session is lost."""
    status = AgentStatus()
    _connected(status)
    status.set_identity_expiry(1_700_000_000_000)
    status.move_to(SessionState.DRAINING)
    assert status.snapshot().identity_expires_at_ms == 1_700_000_000_000
    other = AgentStatus()
    _connected(other)
    other.set_identity_expiry(1_700_000_000_000)
    other.move_to(SessionState.BACKING_OFF)
    assert other.snapshot().identity_expires_at_ms is None


def test_snapshot_is_immutable_and_detached() -> None:
    """A snapshot cannot be changed and does not follow later writes."""
    status = AgentStatus()
    snap = status.snapshot()
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.reconnect_count = 9  # type: ignore[misc]
    status.move_to(SessionState.CONNECTING)
    assert snap.state is SessionState.STARTING


def test_to_dict_is_plain_camel_case_data() -> None:
    """The health form uses the state's wire value and camelCase keys."""
    status = AgentStatus(clock=ManualClock(start=1000.0))
    status.move_to(SessionState.CONNECTING)
    status.move_to(SessionState.BACKING_OFF)
    status.publish_cluster(_View("c1", {"n1": _Node("http://10.0.0.1:3000")}))
    data = status.snapshot().to_dict()
    assert data["state"] == "backing-off"
    assert data["cluster"] == {
        "clusterId": "c1",
        "publishedAt": 1_000_000,
        "nodes": [
            {"nodeId": "n1", "corestoreEndpoint": "http://10.0.0.1:3000", "corestoreProblems": []}
        ],
    }


def test_every_time_in_the_health_form_is_epoch_milliseconds() -> None:
    """One unit for every point in time, as the seeds and the store's `updatedAt`: the state's
    and the connection's start, the last error and pong, the identity's expiry."""
    clock = ManualClock(start=1000.25)
    status = AgentStatus(clock=clock)
    status.move_to(SessionState.CONNECTING)
    status.record_error("refused")
    status.move_to(SessionState.AUTHENTICATING)
    status.move_to(SessionState.CONNECTED)
    status.set_identity_expiry(1_700_000_000_000)
    status.record_pong(0.004)
    data = status.snapshot().to_dict()
    times = {key: data[key] for key in ("stateSince", "connectedSince", "lastErrorAt")}
    assert times == dict.fromkeys(times, 1_000_250)
    assert (data["lastPongAt"], data["identityExpiresAt"]) == (1_000_250, 1_700_000_000_000)
    assert data["pongLatencySeconds"] == 0.004
    assert "identityExpiresAtMs" not in data
    assert "pongLatency" not in data


async def test_wait_until_returns_at_once_when_already_true() -> None:
    """A predicate that holds now is answered without waiting."""
    status = AgentStatus()
    snap = await status.wait_until(lambda s: s.state is SessionState.STARTING)
    assert snap.state is SessionState.STARTING


async def test_wait_until_wakes_on_the_write_that_makes_it_true() -> None:
    """A waiter sleeps through unrelated writes and wakes on the matching one."""
    status = AgentStatus()
    waiter = asyncio.create_task(status.wait_until(lambda s: s.state is SessionState.CONNECTED))
    status.move_to(SessionState.CONNECTING)
    status.record_error("first attempt failed")
    await asyncio.sleep(0)
    assert not waiter.done()
    status.move_to(SessionState.AUTHENTICATING)
    status.move_to(SessionState.CONNECTED)
    snap = await asyncio.wait_for(waiter, timeout=5)
    assert snap.state is SessionState.CONNECTED


# --- the outage: since when Cloudly is unreachable ---------------------------------------------


def _fail_attempt(status: AgentStatus, error: str = "connection refused") -> None:
    status.move_to(SessionState.CONNECTING)
    status.record_error(error)
    status.move_to(SessionState.BACKING_OFF)


def test_the_outage_starts_when_the_session_is_lost_and_retries_do_not_move_it() -> None:
    """Connected at 1000, lost at 1500, then retried every few seconds for two minutes:
    `unreachable_since` stays at the loss (`state_since` moves at every retry), the last
    connect stays 1000 and every failed attempt is counted."""
    clock = ManualClock(start=1000.0)
    status = AgentStatus(clock=clock)
    _connected(status)
    clock.advance(500)
    status.move_to(SessionState.BACKING_OFF)
    for _ in range(40):
        clock.advance(3)
        _fail_attempt(status)
    snap = status.snapshot()
    assert snap.state_since == 1620.0
    assert (snap.unreachable_since, snap.last_connected_at) == (1500.0, 1000.0)
    assert snap.failed_attempts == 40


def test_an_agent_that_never_connected_is_unreachable_since_its_start() -> None:
    """No session yet: the outage runs from the agent's start, and there is no last connect."""
    clock = ManualClock(start=1000.0)
    status = AgentStatus(clock=clock)
    clock.advance(7)
    _fail_attempt(status)
    snap = status.snapshot()
    assert (snap.started_at, snap.unreachable_since, snap.last_connected_at) == (
        1000.0,
        1000.0,
        None,
    )
    assert snap.failed_attempts == 1


def test_there_is_no_outage_before_an_attempt_failed_nor_once_connected() -> None:
    """The first connect in progress is no outage; a connect ends one and clears its count."""
    clock = ManualClock(start=1000.0)
    status = AgentStatus(clock=clock)
    status.move_to(SessionState.CONNECTING)
    assert status.snapshot().unreachable_since is None
    status.move_to(SessionState.BACKING_OFF)
    _connected(status)
    snap = status.snapshot()
    assert (snap.unreachable_since, snap.failed_attempts) == (None, 0)
    assert snap.unreachable(clock.time()) is None


def test_the_outage_sentence_names_its_start_length_last_connect_attempts_and_error() -> None:
    """The one line `status`, `/readyz` and `STATUS=` share."""
    clock = ManualClock(start=1_750_000_000.0)
    status = AgentStatus(clock=clock)
    _connected(status)
    clock.advance(3600)
    status.move_to(SessionState.BACKING_OFF)
    for _ in range(17):
        _fail_attempt(status, "[Errno 111] Connect call failed ('127.0.0.1', 9)")
    assert status.snapshot().unreachable(clock.time() + 125) == (
        "Cloudly unreachable since 2025-06-15 16:06:40 UTC (2 min), last connected "
        "2025-06-15 15:06:40 UTC, 17 attempts, last error: [Errno 111] Connect call failed "
        "('127.0.0.1', 9)"
    )


def test_the_outage_sentence_of_an_agent_that_never_connected() -> None:
    """`never connected`, and one attempt in the singular."""
    assert unreachable_sentence(
        since=0.0, now=45.0, last_connected_at=None, attempts=1, last_error=None
    ) == ("Cloudly unreachable since 1970-01-01 00:00:00 UTC (45 s), never connected, 1 attempt")


def test_the_health_form_carries_the_outage_in_epoch_milliseconds() -> None:
    """`unreachableSince`, `lastConnectedAt`, `failedAttempts` in `/readyz`'s session."""
    clock = ManualClock(start=1000.0)
    status = AgentStatus(clock=clock)
    _connected(status)
    clock.advance(2.5)
    status.move_to(SessionState.BACKING_OFF)
    _fail_attempt(status)
    data = status.snapshot().to_dict()
    assert (data["unreachableSince"], data["lastConnectedAt"], data["failedAttempts"]) == (
        1_002_500,
        1_000_000,
        1,
    )
