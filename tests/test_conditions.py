"""Specification of the node's named conditions: set from the parts' hooks, a readiness reason
only for the state disk and a second agent with the token, shown by `restore-agent status` (and
why the agent is down when it does not answer), said in `STATUS=`, and counted in the
metrics."""

from __future__ import annotations

from agent.entry.systemd import status_line
from agent.watch.metrics import Metrics
from agent.watch.overview import readiness
from agent.watch.status import AgentStatus
from agent.watch.statushooks import StatusHooks
from agent.watch.statusview import render, render_down
from tests.clock import ManualClock

NOW_MS = 1_700_000_100_000


def _status() -> tuple[AgentStatus, StatusHooks]:
    status = AgentStatus(clock=ManualClock(start=1_700_000_000.0))
    return status, StatusHooks(status)


def test_an_unwritable_state_disk_makes_the_agent_not_ready_with_its_cause() -> None:
    """`state-unwritable` is a readiness reason naming the cause, until writes get through."""
    status, hooks = _status()
    hooks.state_write_failed(cause="disk-full")
    reasons = readiness(status.snapshot(), store_open=True, now=0.0, stale_after=30)
    assert reasons["state-unwritable"] == "the node's state cannot be written (disk-full)"
    hooks.state_writable()
    reasons = readiness(status.snapshot(), store_open=True, now=0.0, stale_after=30)
    assert "state-unwritable" not in reasons


def test_a_second_agent_with_the_token_makes_the_agent_not_ready_until_it_is_gone() -> None:
    """`duplicate-agent` is a readiness reason with the watch's sentence, until it clears."""
    status, hooks = _status()
    hooks.duplicate_agent(text="another agent enrolls with this cluster's machine token")
    reasons = readiness(status.snapshot(), store_open=True, now=0.0, stale_after=30)
    assert reasons["duplicate-agent"] == "another agent enrolls with this cluster's machine token"
    hooks.duplicate_agent(text=None)
    reasons = readiness(status.snapshot(), store_open=True, now=0.0, stale_after=30)
    assert "duplicate-agent" not in reasons


def test_a_full_corestore_is_named_per_node_but_is_no_readiness_reason() -> None:
    """The agent still serves the other nodes: `corestore-full` names the node, not ready
    stays as it was; the condition goes once the node takes writes again."""
    status, hooks = _status()
    hooks.corestore_full(node="node-2", full=True)
    hooks.corestore_full(node="node-1", full=True)
    snapshot = status.snapshot()
    assert snapshot.conditions["corestore-full"].text == (
        "the Corestore of node-1, node-2 answered that its disk is full"
    )
    assert "corestore-full" not in readiness(snapshot, store_open=True, now=0.0, stale_after=30)
    hooks.corestore_full(node="node-1", full=False)
    hooks.corestore_full(node="node-2", full=False)
    assert "corestore-full" not in status.snapshot().conditions


def test_a_corestore_that_gives_no_answer_is_named_per_node_with_since_when() -> None:
    """`corestore-unavailable` names each node with the time its outage began (UTC), begins
    when the first did, is no readiness reason (the other nodes are served), and goes once
    every node answers again."""
    status, hooks = _status()
    hooks.corestore_unavailable(node="node-2", since=1_700_000_030.0)
    hooks.corestore_unavailable(node="node-1", since=1_700_000_010.0)
    snapshot = status.snapshot()
    condition = snapshot.conditions["corestore-unavailable"]
    assert condition.text.startswith(
        "the Corestore of node-1 since 2023-11-14 22:13:30 UTC, node-2 since "
        "2023-11-14 22:13:50 UTC gives no usable answer"
    )
    assert condition.since == 1_700_000_010.0
    assert "corestore-unavailable" not in readiness(
        snapshot, store_open=True, now=0.0, stale_after=30
    )
    hooks.corestore_unavailable(node="node-1", since=None)
    assert (
        status.snapshot()
        .conditions["corestore-unavailable"]
        .text.startswith("the Corestore of node-2 since")
    )
    hooks.corestore_unavailable(node="node-2", since=None)
    assert "corestore-unavailable" not in status.snapshot().conditions


def test_a_salvaged_state_is_a_condition_while_reconciliation_is_due() -> None:
    status, hooks = _status()
    hooks.state_recovered(how="salvaged", at=1_700_000_000.0)
    hooks.reconcile_pending(pending=True)
    assert (
        status.snapshot()
        .conditions["state-recovered"]
        .text.startswith("the state was salvaged; reconciling with each node's Corestore")
    )
    hooks.reconcile_pending(pending=False)
    assert "state-recovered" not in status.snapshot().conditions


def test_status_shows_each_condition_with_how_long_it_has_held() -> None:
    data = {
        "ready": False,
        "reasons": {"state-unwritable": "the node's state cannot be written (disk-full)"},
        "session": {"state": "connected"},
        "conditions": {
            "state-unwritable": {
                "text": "the node's state cannot be written (disk-full)",
                "since": NOW_MS - 90_000,
            }
        },
        "restores": [],
        "jobs": [],
        "transfers": None,
    }
    lines = render(data, now_ms=NOW_MS).splitlines()
    assert lines[:3] == [
        "agent:    not ready",
        "          state-unwritable: the node's state cannot be written (disk-full)",
        "condition: state-unwritable: the node's state cannot be written (disk-full) (for 90 s)",
    ]


def test_status_says_why_a_down_agent_is_down() -> None:
    down = {"message": "restore-agent: the state database x is damaged", "exitCode": 65}
    assert render_down({**down, "at": NOW_MS - 240_000}, now_ms=NOW_MS) == (
        "agent:    down since 4 min (exit 65): restore-agent: the state database x is damaged\n"
    )


def test_systemd_status_says_the_state_disk_first() -> None:
    """While the state cannot be written, STATUS= says so (whatever the session does)."""
    status, hooks = _status()
    hooks.state_write_failed(cause="read-only")
    assert status_line(status.snapshot()) == (
        "not ready: the node's state cannot be written (read-only); retrying"
    )


def test_the_metrics_count_refused_writes_and_say_writable() -> None:
    metrics = Metrics()
    metrics.state_write_failed(cause="disk-full")
    metrics.state_write_failed(cause="disk-full")
    text = metrics.render().decode()
    assert 'restore_agent_state_write_failures_total{cause="disk-full"} 2.0' in text
    assert "restore_agent_state_writable 0.0" in text
    metrics.state_writable()
    metrics.corestore_full(node="node-1", full=True)
    metrics.state_recovered(how="reset", at=1_700_000_000.0)
    metrics.reconcile_pending(pending=True)
    metrics.orphans_adopted(what="restore", count=2)
    text = metrics.render().decode()
    assert "restore_agent_state_writable 1.0" in text
    assert 'restore_agent_corestore_storage_full{node="node-1"} 1.0' in text
    assert 'restore_agent_state_recovered_timestamp_seconds{how="reset"} 1.7e+09' in text
    assert "restore_agent_state_reconcile_pending 1.0" in text
    assert 'restore_agent_reconcile_orphans_total{what="restore"} 2.0' in text
