"""Specification of `agent.watch.metrics`: what /metrics exposes, computed from plain data."""

from __future__ import annotations

import pytest

from agent.store import StatusSummary
from agent.transfers.budget import ByteBudget
from agent.watch.metrics import Metrics
from agent.watch.status import AgentStatus, SessionState
from tests.clock import ManualClock

NOW_MS = 1_700_000_000_000


def _samples(metrics: Metrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of the rendered text: (name, labels) -> value."""
    samples = {}
    for line in metrics.render().decode().splitlines():
        if line.startswith("#") or not line:
            continue
        series, value = line.rsplit(" ", 1)
        name, _, label_text = series.partition("{")
        pairs = (pair.split("=", 1) for pair in label_text.rstrip("}").split(",") if pair)
        samples[(name, frozenset((key, raw.strip('"')) for key, raw in pairs))] = float(value)
    return samples


def _value(metrics: Metrics, name: str, **labels: str) -> float:
    return _samples(metrics)[(name, frozenset(labels.items()))]


def _refreshed(summary: StatusSummary | None, *, ready: bool = True) -> Metrics:
    metrics = Metrics()
    snapshot = AgentStatus(clock=ManualClock(start=NOW_MS / 1000)).snapshot()
    metrics.refresh(snapshot, summary, ready=ready, now_ms=NOW_MS)
    return metrics


def test_the_process_and_platform_collectors_are_on_the_apps_registry() -> None:
    """Memory, CPU, file descriptors and the Python build, as every Prometheus exporter has
    them, on the agent's own registry."""
    samples = {name for name, _ in _samples(Metrics())}
    assert {
        "process_resident_memory_bytes",
        "process_virtual_memory_bytes",
        "process_cpu_seconds_total",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
        "python_info",
    } <= samples
    assert _value(Metrics(), "process_resident_memory_bytes") > 0


def test_no_created_series_is_exposed() -> None:
    """Counters and histograms come without their `_created` timestamps."""
    metrics = _refreshed(StatusSummary(restores={}, jobs={}))
    metrics.request_handled(method="m", code="ok", seconds=0.1)
    metrics.corestore_answer(route="put-chunk", outcome="ok", seconds=0.1)
    assert [name for name, _ in _samples(metrics) if name.endswith("_created")] == []


def test_latency_histograms_are_named_duration_seconds() -> None:
    """Requests, Corestore attempts and store mutations are `*_duration_seconds` histograms."""
    metrics = Metrics()
    metrics.request_handled(method="m", code="ok", seconds=0.1)
    metrics.corestore_answer(route="put-chunk", outcome="ok", seconds=0.1)
    metrics.store_mutation(op="stage", outcome="ok", seconds=0.01)
    names = {name for name, _ in _samples(metrics)}
    for histogram in ("request", "corestore_request", "store_mutation"):
        assert f"restore_agent_{histogram}_duration_seconds_count" in names
        assert f"restore_agent_{histogram}_seconds_count" not in names


@pytest.mark.parametrize("ready", [True, False])
def test_readiness_is_a_gauge(ready: bool) -> None:
    """`restore_agent_ready` is 1 when /readyz would answer 200, else 0."""
    assert _value(_refreshed(None, ready=ready), "restore_agent_ready") == float(ready)


def test_restores_and_jobs_by_status_with_the_age_of_the_oldest() -> None:
    """Counts by status, and how long the least recently changed one has not moved; 0 for a
    status without rows."""
    summary = StatusSummary(
        restores={"restoring": (2, NOW_MS - 90_000)},
        jobs={("restore", "running"): (1, NOW_MS - 7_200_000)},
    )
    metrics = _refreshed(summary)
    assert _value(metrics, "restore_agent_restores", status="restoring") == 2
    assert _value(metrics, "restore_agent_restores_oldest_seconds", status="restoring") == 90
    assert _value(metrics, "restore_agent_restores_oldest_seconds", status="staging") == 0
    running = {"kind": "restore", "status": "running"}
    assert _value(metrics, "restore_agent_jobs", **running) == 1
    assert _value(metrics, "restore_agent_jobs_oldest_seconds", **running) == 7200
    assert _value(metrics, "restore_agent_jobs", kind="backup", status="failed") == 0


def test_an_unreadable_store_keeps_the_last_numbers() -> None:
    """A scrape while the store cannot be read changes no store gauge."""
    metrics = _refreshed(StatusSummary(restores={"ready": (3, NOW_MS)}, jobs={}))
    snapshot = AgentStatus(clock=ManualClock(start=NOW_MS / 1000)).snapshot()
    metrics.refresh(snapshot, None, ready=False, now_ms=NOW_MS)
    assert _value(metrics, "restore_agent_restores", status="ready") == 3


def test_a_credential_rejection_is_counted() -> None:
    """Each control credential Corestore refused for good adds one."""
    metrics = Metrics()
    metrics.credential_rejected()
    metrics.credential_rejected()
    assert _value(metrics, "restore_agent_corestore_credential_rejections_total") == 2


def test_a_second_agent_with_the_token_is_a_gauge_beside_the_retirements() -> None:
    """Each retirement of the recipient counts; the gauge is 1 while the watch says another
    agent uses the token, 0 before and after."""
    metrics = Metrics()
    assert _value(metrics, "restore_agent_duplicate_agent") == 0
    metrics.recipient_retired()
    metrics.recipient_retired()
    metrics.duplicate_agent(text="another agent enrolls with this cluster's machine token")
    assert _value(metrics, "restore_agent_recipient_retirements_total") == 2
    assert _value(metrics, "restore_agent_duplicate_agent") == 1
    metrics.duplicate_agent(text=None)
    assert _value(metrics, "restore_agent_duplicate_agent") == 0


def test_since_when_a_nodes_corestore_is_unavailable_is_a_gauge() -> None:
    """Set to the outage's start (epoch seconds) while it lasts, back to 0 once it answers."""
    metrics = Metrics()
    metrics.corestore_unavailable(node="node-1", since=1_700_000_000.0)
    name = "restore_agent_corestore_unavailable_since_seconds"
    assert _value(metrics, name, node="node-1") == 1_700_000_000.0
    metrics.corestore_unavailable(node="node-1", since=None)
    assert _value(metrics, name, node="node-1") == 0


def test_what_retention_forgot_is_counted_by_kind() -> None:
    """`retention_deleted_total{what}` adds up each report; both kinds exist from the start."""
    metrics = Metrics()
    assert _value(metrics, "restore_agent_retention_deleted_total", what="job") == 0
    metrics.retention_deleted(what="restore", count=3)
    metrics.retention_deleted(what="restore", count=2)
    assert _value(metrics, "restore_agent_retention_deleted_total", what="restore") == 5


def test_the_bytes_retention_gave_back_are_counted() -> None:
    """`retention_freed_bytes_total` adds up the bytes of each incremental vacuum."""
    metrics = Metrics()
    metrics.retention_freed(count=4096)
    metrics.retention_freed(count=8192)
    assert _value(metrics, "restore_agent_retention_freed_bytes_total") == 12288


def test_the_database_size_is_a_gauge_read_at_scrape_time() -> None:
    """`state_database_bytes` is the store summary's size of the database files."""
    metrics = _refreshed(StatusSummary(restores={}, jobs={}, database_bytes=123_456))
    assert _value(metrics, "restore_agent_state_database_bytes") == 123_456


def test_the_byte_budget_and_what_it_holds_are_reported() -> None:
    """A budget reports its size, what is drawn and who waits; waits and trims add up."""
    metrics = Metrics()
    budget = ByteBudget(1000, reserve=0, observer=metrics)
    assert budget.try_take(400)
    assert _value(metrics, "restore_agent_byte_budget_bytes") == 1000
    assert _value(metrics, "restore_agent_byte_budget_held_bytes") == 400
    assert _value(metrics, "restore_agent_byte_budget_waiting") == 0
    metrics.budget_waited(seconds=2.0)
    assert _value(metrics, "restore_agent_byte_budget_wait_duration_seconds_count") == 1
    metrics.memory_trimmed(released=5000)
    metrics.memory_trimmed(released=-10)  # resident grew meanwhile: nothing came back
    assert _value(metrics, "restore_agent_memory_trims_total") == 2
    assert _value(metrics, "restore_agent_memory_trimmed_bytes_total") == 5000


def _names(metrics: Metrics) -> set[str]:
    return {name for name, _ in _samples(metrics)}


def test_the_pong_latency_is_absent_before_the_first_pong() -> None:
    """No pong yet: no sample at all (a 0.0 would claim an instant round trip)."""
    metrics = _refreshed(StatusSummary(restores={}, jobs={}))
    assert "restore_agent_cloudly_pong_latency_seconds" not in _names(metrics)


def test_the_pong_latency_is_the_last_round_trip() -> None:
    """After a pong, its round trip."""
    status = AgentStatus(clock=ManualClock(start=NOW_MS / 1000))
    for state in (SessionState.CONNECTING, SessionState.AUTHENTICATING, SessionState.CONNECTED):
        status.move_to(state)
    status.record_pong(0.25)
    metrics = Metrics()
    metrics.refresh(status.snapshot(), None, ready=True, now_ms=NOW_MS)
    assert _value(metrics, "restore_agent_cloudly_pong_latency_seconds") == 0.25


def test_the_last_connect_and_the_outage_start_are_timestamps() -> None:
    """Connected at T, lost 60 s later: the last connect is T, the outage began at T + 60
    (epoch seconds, as `process_start_time_seconds`); before any connect neither exists, and
    while connected the outage start does not."""
    clock = ManualClock(start=NOW_MS / 1000)
    status = AgentStatus(clock=clock)
    metrics = Metrics()
    metrics.refresh(status.snapshot(), None, ready=False, now_ms=NOW_MS)
    assert {
        "restore_agent_cloudly_last_connect_timestamp_seconds",
        "restore_agent_cloudly_unreachable_since_timestamp_seconds",
    }.isdisjoint(_names(metrics))
    for state in (SessionState.CONNECTING, SessionState.AUTHENTICATING, SessionState.CONNECTED):
        status.move_to(state)
    metrics.refresh(status.snapshot(), None, ready=True, now_ms=NOW_MS)
    assert _value(metrics, "restore_agent_cloudly_last_connect_timestamp_seconds") == NOW_MS / 1000
    assert "restore_agent_cloudly_unreachable_since_timestamp_seconds" not in _names(metrics)
    clock.advance(60)
    status.move_to(SessionState.BACKING_OFF)
    metrics.refresh(status.snapshot(), None, ready=False, now_ms=NOW_MS + 60_000)
    since = _value(metrics, "restore_agent_cloudly_unreachable_since_timestamp_seconds")
    assert since == NOW_MS / 1000 + 60


def test_failed_retention_passes_are_counted() -> None:
    """A pass that failed was a log line only; now it is a counter an alert can read."""
    metrics = Metrics()
    assert _value(metrics, "restore_agent_retention_failures_total") == 0
    metrics.retention_failed()
    assert _value(metrics, "restore_agent_retention_failures_total") == 1


def test_a_skipped_or_failed_vacuum_is_counted_by_reason() -> None:
    """Both reasons are there from the start at 0."""
    metrics = Metrics()
    metrics.vacuum_failed(reason="skipped")
    name = "restore_agent_state_database_vacuum_failures_total"
    assert _value(metrics, name, reason="skipped") == 1
    assert _value(metrics, name, reason="failed") == 0


def test_the_transfer_wait_is_a_duration_histogram() -> None:
    """The wait for a node's place follows the `_duration_seconds` naming."""
    metrics = Metrics()
    metrics.transfer_waited(kind="stage", seconds=2.0)
    names = _names(metrics)
    assert "restore_agent_transfer_wait_duration_seconds_count" in names
    assert "restore_agent_transfer_wait_seconds_count" not in names


def test_each_request_class_has_its_seats_held_as_a_gauge() -> None:
    """The seats a class holds now, per class; both classes exist before any request."""
    metrics = Metrics()
    assert _value(metrics, "restore_agent_request_class_in_flight", **{"class": "control"}) == 0
    metrics.requests_seated(request_class="stream", count=3)
    assert _value(metrics, "restore_agent_request_class_in_flight", **{"class": "stream"}) == 3


def test_each_request_class_counts_its_deferred_requests() -> None:
    """A request answered `retry` counts against its own class only."""
    metrics = Metrics()
    metrics.requests_deferred(request_class="stream", count=1)
    metrics.requests_deferred(request_class="stream", count=1)
    name = "restore_agent_request_class_deferred_total"
    assert _value(metrics, name, **{"class": "stream"}) == 2
    assert _value(metrics, name, **{"class": "control"}) == 0
