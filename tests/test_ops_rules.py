"""The shipped alert rules and dashboard (ops/): every metric and label they use is one the
agent exposes (agent/watch/metrics.py), every alert has a runbook and a unit test, and promtool
accepts the rules and passes their unit tests (when promtool is installed)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.store import StatusSummary
from agent.watch.metrics import Metrics
from agent.watch.status import AgentStatus, SessionState

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "ops" / "prometheus" / "restore-agent.rules.yml"
RULE_TESTS = ROOT / "ops" / "prometheus" / "restore-agent.rules.test.yml"
DASHBOARD = ROOT / "ops" / "grafana" / "restore-agent.json"
OPERATIONS = ROOT / "docs" / "operations.md"

# Not the agent's: Prometheus adds `up` to every scrape, and `job`/`instance` to every series.
SCRAPE_SERIES = frozenset({"up"})
TARGET_LABELS = frozenset({"job", "instance"})
KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or"}
    | {"unless", "offset", "inf", "nan"}
)
_IDENTIFIER = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_SELECTOR = re.compile(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*\{([^}]*)\}")
_MATCHER = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)")


def _rules() -> list[dict[str, Any]]:
    data = yaml.safe_load(RULES.read_text())
    return [rule for group in data["groups"] for rule in group["rules"]]


def _panel_expressions() -> Iterator[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield target["expr"]


def template_metrics() -> set[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    found = set()
    for variable in dashboard["templating"]["list"]:
        query = variable.get("definition", "")
        found |= set(re.findall(r"label_values\(([A-Za-z_:][A-Za-z0-9_:]*)", query))
    return found


def metric_names(expression: str) -> set[str]:
    """The series names a PromQL expression selects (functions, keywords, label names,
    grouping labels, ranges and strings left out)."""
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', expression)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\boffset\s+-?[0-9a-z]+", " ", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        word = match.group(0)
        if text[match.end() :].lstrip().startswith("(") or word.lower() in KEYWORDS:
            continue  # a function call, or PromQL's own word
        names.add(word)
    return names


def matched_labels(expression: str) -> dict[str, set[str]]:
    """The label names each selector of `expression` matches on, by series name."""
    found: dict[str, set[str]] = {}
    for name, matchers in _SELECTOR.findall(expression):
        found.setdefault(name, set()).update(_MATCHER.findall(matchers))
    return found


def _in_outage() -> AgentStatus:
    """A status that connected, got a pong, and lost Cloudly: every session gauge exists
    (the pong's until the loss, the outage's after it)."""
    status = AgentStatus()
    for state in (SessionState.CONNECTING, SessionState.AUTHENTICATING, SessionState.CONNECTED):
        status.move_to(state)
    return status


def _populated() -> Metrics:
    """Metrics with every hook called once, so every labelled series has a sample."""
    metrics = Metrics()
    summary = StatusSummary(restores={"restoring": (1, 0)}, jobs={("backup", "running"): (1, 0)})
    status = _in_outage()
    status.record_pong(0.01)
    metrics.refresh(status.snapshot(), summary, ready=True, now_ms=1000)
    _ = metrics.render()  # the pong's sample, before the loss below removes it
    status.move_to(SessionState.BACKING_OFF)
    metrics.refresh(status.snapshot(), summary, ready=False, now_ms=1000)
    metrics.session_connected(reconnect=False)
    metrics.session_lost(cause="closed", permanent=False)
    metrics.request_handled(method="m", code="ok", seconds=0.1)
    metrics.stream_bytes(direction="in", count=1)
    metrics.store_mutation(op="stage", outcome="ok", seconds=0.01)
    metrics.chunk_recorded(length=1)
    metrics.object_written(size=1)
    metrics.corestore_answer(route="put-chunk", outcome="ok", seconds=0.1)
    metrics.corestore_resend(route="put-chunk")
    metrics.credential_rejected()
    metrics.loop_lag(seconds=0.01)
    metrics.transfers_changed(node="node-1", moving=1, queued=1)
    metrics.transfer_waited(kind="stage", seconds=1.0)
    metrics.retention_deleted(what="restore", count=1)
    metrics.retention_freed(count=1)
    metrics.retention_failed()
    metrics.vacuum_failed(reason="skipped")
    return metrics


def _exposed() -> dict[str, set[str]]:
    """Every series name the agent exposes, with the label names its samples carry (the
    pong latency exists only while connected: it is read from a connected status)."""
    connected = Metrics()
    status = _in_outage()
    status.record_pong(0.01)
    connected.refresh(status.snapshot(), None, ready=True, now_ms=1000)
    text = _populated().render().decode() + connected.render().decode()
    return exposition_series(text)


def exposition_series(text: str) -> dict[str, set[str]]:
    """The series names of a Prometheus text exposition, with the label names they carry."""
    series: dict[str, set[str]] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            suffixes = ("_bucket", "_count", "_sum") if kind == "histogram" else ("",)
            for suffix in suffixes:
                series.setdefault(name + suffix, set())
        elif line and not line.startswith("#"):
            name, _, labels = line.rsplit(" ", 1)[0].partition("{")
            series.setdefault(name, set()).update(_MATCHER.findall(labels))
    return series


def every_expression() -> list[tuple[str, str]]:
    rules = [(f"alert {rule['alert']}", rule["expr"]) for rule in _rules()]
    panels = [(f"panel expression {expr[:60]}", expr) for expr in _panel_expressions()]
    return rules + panels


def test_the_metric_name_reader_skips_functions_labels_and_ranges() -> None:
    """The reader these checks stand on: only series names come out of an expression."""
    expression = (
        'histogram_quantile(0.99, sum by (instance, le) (rate(a_bucket{job="x", le=~"1"}[5m])))'
        " / on (instance) group_left b_total > bool 0.5 unless c - c offset 1h"
    )
    assert metric_names(expression) == {"a_bucket", "b_total", "c"}
    assert matched_labels(expression) == {"a_bucket": {"job", "le"}}


def test_every_metric_an_alert_or_panel_uses_exists() -> None:
    """Each series a rule, a panel or a dashboard variable selects is exposed by the agent's
    registry (or is Prometheus' own `up`): a renamed metric cannot leave a silent alert."""
    exposed = set(_exposed()) | SCRAPE_SERIES
    missing = {
        (where, name)
        for where, expression in every_expression()
        for name in metric_names(expression)
        if name not in exposed
    }
    missing |= {("dashboard variable", name) for name in template_metrics() - exposed}
    assert missing == set()


def test_every_label_an_alert_or_panel_matches_exists() -> None:
    """Each label a selector matches on is one the series carries (or a target label)."""
    exposed = _exposed()
    unknown = {
        (where, name, label)
        for where, expression in every_expression()
        for name, labels in matched_labels(expression).items()
        if name in exposed
        for label in labels - exposed[name] - TARGET_LABELS
    }
    assert unknown == set()


def test_every_alert_has_a_runbook_in_the_operations_guide() -> None:
    """Each alert names its runbook, a section of docs/operations.md headed by its name."""
    headings = set(re.findall(r"^#### (RestoreAgent\w+)$", OPERATIONS.read_text(), re.MULTILINE))
    for rule in _rules():
        name = rule["alert"]
        assert rule["annotations"]["runbook"] == f"docs/operations.md#{name.lower()}"
        assert name in headings, f"{name} has no runbook section"
    assert headings == {rule["alert"] for rule in _rules()}


def test_every_alert_links_its_runbook_for_alertmanager() -> None:
    """`runbook_url` is the `runbook` anchor as a link: under the external label
    `restore_agent_runbooks`, else the copy readme.md installs on every node."""
    for rule in _rules():
        annotations = rule["annotations"]
        anchor = annotations["runbook"].split("#", 1)[1]
        assert annotations["runbook_url"] == (
            "{{ with $externalLabels.restore_agent_runbooks }}{{ . }}{{ else }}"
            f"file:///opt/restore-agent/share/operations.md{{{{ end }}}}#{anchor}"
        ), rule["alert"]


def test_every_alert_has_a_unit_test_that_fires_it() -> None:
    """The promtool unit tests expect each alert to fire at least once."""
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    fired = {
        case["alertname"]
        for test in tests
        for case in test.get("alert_rule_test", [])
        if case.get("exp_alerts")
    }
    assert fired == {rule["alert"] for rule in _rules()}


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        message = (
            "promtool is not installed (Debian: apt-get install prometheus; .ci/run does): "
            "the alert rules were NOT checked by promtool"
        )
        if os.environ.get("CI"):
            pytest.fail(message)  # CI installs it: missing there is a broken CI, not a skip
        pytest.skip(message)
    return found


def test_promtool_accepts_the_rules() -> None:
    """`promtool check rules` finds every rule valid."""
    done = subprocess.run(
        [_promtool(), "check", "rules", str(RULES)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in done.stdout + done.stderr


def test_the_rules_pass_their_promtool_unit_tests() -> None:
    """`promtool test rules`: each alert fires on its series, after its `for:`, with its
    labels and texts, and not on the series beside it."""
    done = subprocess.run(
        [_promtool(), "test", "rules", RULE_TESTS.name],
        cwd=RULE_TESTS.parent,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout + done.stderr


# --- the dashboard's import contract -------------------------------------------------------------


def _dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def _every_datasource(node: object) -> Iterator[dict[str, Any]]:
    """Every `datasource` object anywhere in the dashboard (panels, targets, variables)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "datasource" and isinstance(value, dict):
                yield value
            else:
                yield from _every_datasource(value)
    elif isinstance(node, list):
        for item in node:
            yield from _every_datasource(item)


def test_importing_the_dashboard_asks_for_the_prometheus_data_source() -> None:
    """One `__inputs` entry, a Prometheus data source; every panel, query and variable uses
    it (`${DS_PROMETHEUS}`), so Grafana's import asks for it and wires every query to it."""
    dashboard = _dashboard()
    [source] = dashboard["__inputs"]
    assert (source["type"], source["pluginId"], source["name"]) == (
        "datasource",
        "prometheus",
        "DS_PROMETHEUS",
    )
    used = list(_every_datasource(dashboard["panels"])) + list(
        _every_datasource(dashboard["templating"])
    )
    assert used
    assert {(d["type"], d["uid"]) for d in used} == {("prometheus", "${DS_PROMETHEUS}")}
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${DS_PROMETHEUS}", panel["title"]


def test_every_reference_in_the_dashboard_is_an_input_or_a_variable() -> None:
    """Each `${NAME}` / `$name` the JSON names is an input, a template variable or one of
    Grafana's own (`$__rate_interval`, `$__all`)."""
    dashboard = _dashboard()
    known = {i["name"] for i in dashboard["__inputs"]} | {
        v["name"] for v in dashboard["templating"]["list"]
    }
    text = DASHBOARD.read_text()
    named = set(re.findall(r"\$\{(\w+)\}", text)) | set(re.findall(r"\$(\w+)", text))
    assert {name for name in named if not name.startswith("__")} <= known


def test_the_dashboard_requires_every_panel_type_it_uses() -> None:
    """`__requires` lists Grafana, the Prometheus data source and every panel type, as an
    export for sharing does; the import needs no id of this Grafana."""
    dashboard = _dashboard()
    required = {(r["type"], r["id"]) for r in dashboard["__requires"]}
    used = {("panel", p["type"]) for p in dashboard["panels"] if p["type"] != "row"}
    assert used | {("grafana", "grafana"), ("datasource", "prometheus")} == required
    assert dashboard["id"] is None
    assert dashboard["uid"] == "restore-agent"


def test_the_panels_have_unique_ids_and_do_not_overlap() -> None:
    """Panel ids are unique and no two panels cover the same grid cell (24 columns)."""
    panels = _dashboard()["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    taken: dict[tuple[int, int], str] = {}
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                assert (x, y) not in taken, f"{panel['title']} overlaps {taken.get((x, y))}"
                taken[(x, y)] = panel["title"]


def _panel(title: str) -> dict[str, Any]:
    [panel] = [p for p in _dashboard()["panels"] if p["title"] == title]
    return panel


def test_the_version_table_is_an_instant_table_query() -> None:
    """The Version table asks for one instant row per node (`format: table`), not a series."""
    panel = _panel("Version and uptime")
    assert panel["type"] == "table"
    for target in panel["targets"]:
        assert (target["format"], target["instant"], target["range"]) == ("table", True, False)


def test_the_ready_stat_has_thresholds_and_words() -> None:
    """Ready is red at 0 and green at 1, and says `ready` / `not ready`."""
    defaults = _panel("Ready")["fieldConfig"]["defaults"]
    steps = defaults["thresholds"]["steps"]
    assert [(s["color"], s["value"]) for s in steps] == [("red", None), ("green", 1)]
    [mapping] = defaults["mappings"]
    assert {k: v["text"] for k, v in mapping["options"].items()} == {
        "0": "not ready",
        "1": "ready",
    }


def test_counts_and_durations_are_never_drawn_on_one_axis() -> None:
    """A time-series panel has one unit: no counts and minutes on one axis (the old Relay
    jobs panel)."""
    for panel in _dashboard()["panels"]:
        if panel["type"] != "timeseries":
            continue
        assert panel["fieldConfig"]["defaults"]["unit"], panel["title"]
        assert panel["fieldConfig"]["overrides"] == [], panel["title"]
        for target in panel["targets"]:
            assert not re.search(r"/\s*60\b", target["expr"]), panel["title"]


@pytest.mark.parametrize(
    "metric",
    [
        "restore_agent_transfers_moving",
        "restore_agent_transfers_queued",
        "restore_agent_transfer_wait_duration_seconds_bucket",
        "restore_agent_state_database_bytes",
        "restore_agent_retention_deleted_total",
        "restore_agent_retention_freed_bytes_total",
        "restore_agent_retention_failures_total",
        "restore_agent_state_database_vacuum_failures_total",
        "restore_agent_cloudly_unreachable_since_timestamp_seconds",
        # every paging alert's series
        "up",
        "restore_agent_state_writable",
        "restore_agent_corestore_storage_full",
        "restore_agent_corestore_unavailable_since_seconds",
        "restore_agent_duplicate_agent",
        "restore_agent_recipient_retirements_total",
    ],
)
def test_the_dashboard_has_a_panel_for(metric: str) -> None:
    """Every feature built since the dashboard was first drawn has its panel."""
    assert any(metric in names for names in map(metric_names, _panel_expressions()))
