"""The shipped Alertmanager inhibition rules (ops/alertmanager/restore-agent.yml), run in a
real Alertmanager: `amtool check-config` accepts the file, and each cause silences its
consequences and nothing else.

The alerts fed to Alertmanager are the very ones the promtool unit tests prove the rules raise
together (the tests of restore-agent.rules.test.yml whose name ends "(inhibited)"), labels and
all: what is checked here is what Prometheus would send.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
ALERTMANAGER_CONFIG = ROOT / "ops" / "alertmanager" / "restore-agent.yml"
RULE_TESTS = ROOT / "ops" / "prometheus" / "restore-agent.rules.test.yml"


def _tool(*names: str) -> str:
    """The first of `names` on PATH; in CI a missing one fails, elsewhere it skips, loudly."""
    for name in names:
        found = shutil.which(name)
        if found is not None:
            return found
    message = (
        f"{' / '.join(names)} is not installed (Debian: apt-get install prometheus-alertmanager; "
        ".ci/run does): the inhibition rules were NOT checked"
    )
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def _fired_together(test_name: str) -> list[dict[str, str]]:
    """Every alert the promtool test `test_name` expects (labels with `alertname`)."""
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    [test] = [test for test in tests if test["name"] == test_name]
    alerts = []
    for case in test["alert_rule_test"]:
        for expected in case["exp_alerts"]:
            labels = {"alertname": case["alertname"], **expected["exp_labels"]}
            if labels not in alerts:
                alerts.append(labels)
    return alerts


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Alertmanager:
    """A real Alertmanager on 127.0.0.1 with the shipped configuration (no cluster)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def _call(self, method: str, path: str, body: object = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(  # noqa: S310  # our own loopback Alertmanager
            self.url + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310
            text = answer.read()
        return json.loads(text) if path.startswith("/api/") and text else text

    def post(self, alerts: list[dict[str, str]]) -> None:
        """Send `alerts` as firing now (as Prometheus does)."""
        self._call("POST", "/api/v2/alerts", [{"labels": labels} for labels in alerts])

    def silenced(
        self, count: int, *, suppressed: int
    ) -> dict[str, set[tuple[tuple[str, str], ...]]]:
        """`{"active": {...}, "suppressed": {...}}` once all `count` alerts are there and
        Alertmanager marked `suppressed` of them so (its inhibitor marks them a moment after
        they arrive), or after 30 s as they stand; each alert as its sorted label pairs."""
        deadline = time.monotonic() + 30
        while True:
            alerts = self._call("GET", "/api/v2/alerts")
            marked = sum(1 for alert in alerts if alert["status"]["state"] == "suppressed")
            if (len(alerts) >= count and marked >= suppressed) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        states: dict[str, set[tuple[tuple[str, str], ...]]] = {"active": set(), "suppressed": set()}
        for alert in alerts:
            states[alert["status"]["state"]].add(tuple(sorted(alert["labels"].items())))
        return states


@pytest.fixture
def alertmanager(tmp_path: Path) -> Iterator[Alertmanager]:
    binary = _tool("prometheus-alertmanager", "alertmanager")
    port = _free_port()
    process = subprocess.Popen(  # a fixed argument list
        [
            binary,
            f"--config.file={ALERTMANAGER_CONFIG}",
            f"--storage.path={tmp_path}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
            "--log.level=warn",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    manager = Alertmanager(f"http://127.0.0.1:{port}")
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                manager._call("GET", "/-/ready")
                break
            except (urllib.error.URLError, ConnectionError):
                if process.poll() is not None or time.monotonic() > deadline:
                    _, err = process.communicate(timeout=5)
                    pytest.fail(f"Alertmanager did not start: {err.decode(errors='replace')}")
                time.sleep(0.1)
        yield manager
    finally:
        process.terminate()
        process.wait(timeout=10)
        assert process.stderr is not None
        process.stderr.close()


def _key(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


def test_amtool_accepts_the_alertmanager_configuration() -> None:
    """`amtool check-config` (Debian's prometheus-alertmanager) finds the file valid, with
    its inhibition rules."""
    done = subprocess.run(
        [_tool("amtool"), "check-config", str(ALERTMANAGER_CONFIG)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rules = len(yaml.safe_load(ALERTMANAGER_CONFIG.read_text())["inhibit_rules"])
    assert "SUCCESS" in done.stdout
    assert f" - {rules} inhibit rules" in done.stdout


def test_a_fleet_wide_cloudly_outage_pages_once(alertmanager: Alertmanager) -> None:
    """Cloudly down for two nodes of three: the fleet-wide alert stays, each node's session
    alert and the consequences on any node of the job are silenced."""
    alerts = _fired_together(
        "Cloudly is down for most of the fleet: one page, and every node session alert beside "
        "it (inhibited)"
    )
    # A consequence on a third node (`depends_on: cloudly`) is silenced by the fleet alert too.
    [not_ready] = _fired_together("the agent is not ready for fifteen minutes")
    not_ready = {**not_ready, "instance": "node-3"}
    alertmanager.post([*alerts, not_ready])
    states = alertmanager.silenced(len(alerts) + 1, suppressed=3)
    fleet = [a for a in alerts if a["alertname"] == "RestoreAgentCloudlyUnreachableFleetWide"]
    nodes = [a for a in alerts if a["alertname"] == "RestoreAgentCloudlySessionDown"]
    assert (len(fleet), len(nodes)) == (1, 2)
    assert states == {
        "active": {_key(fleet[0])},
        "suppressed": {_key(a) for a in [*nodes, not_ready]},
    }


def test_the_session_down_alert_silences_its_nodes_not_ready_only(
    alertmanager: Alertmanager,
) -> None:
    """Session down and not ready on node-1: NotReady is silenced; another node's NotReady
    (its own cause) still pages."""
    alerts = _fired_together(
        "the session is down and the agent is not ready because of it (inhibited)"
    )
    [not_ready] = [a for a in alerts if a["alertname"] == "RestoreAgentNotReady"]
    elsewhere = {**not_ready, "instance": "node-2"}
    alertmanager.post([*alerts, elsewhere])
    states = alertmanager.silenced(len(alerts) + 1, suppressed=1)
    [session] = [a for a in alerts if a["alertname"] == "RestoreAgentCloudlySessionDown"]
    assert states == {
        "active": {_key(session), _key(elsewhere)},
        "suppressed": {_key(not_ready)},
    }


def test_a_refused_machine_token_silences_the_session_down_alert(
    alertmanager: Alertmanager,
) -> None:
    """The named cause pages; the session alert it explains does not."""
    alerts = _fired_together(
        "Cloudly refuses the machine token (and the session is down because of it)"
    )
    alertmanager.post(alerts)
    states = alertmanager.silenced(len(alerts), suppressed=1)
    [token] = [a for a in alerts if a["alertname"] == "RestoreAgentMachineTokenRefused"]
    [session] = [a for a in alerts if a["alertname"] == "RestoreAgentCloudlySessionDown"]
    assert states == {"active": {_key(token)}, "suppressed": {_key(session)}}


def test_a_restart_loop_silences_the_down_alert(alertmanager: Alertmanager) -> None:
    """Restarting and Down on one node overlap: the crash loop pages, Down is silenced."""
    alerts = _fired_together(
        "the agent restarts and its scrape fails between starts (Down inhibited)"
    )
    alertmanager.post(alerts)
    states = alertmanager.silenced(len(alerts), suppressed=1)
    [restarting] = [a for a in alerts if a["alertname"] == "RestoreAgentRestarting"]
    [down] = [a for a in alerts if a["alertname"] == "RestoreAgentDown"]
    assert states == {"active": {_key(restarting)}, "suppressed": {_key(down)}}


def test_a_state_disk_that_refuses_writes_silences_its_nodes_not_ready(
    alertmanager: Alertmanager,
) -> None:
    """The named cause pages; NotReady on its node (the agent is not ready because of it) does
    not; NotReady on another node still does."""
    alerts = _fired_together(
        "the state disk refuses writes and the agent is not ready because of it (inhibited)"
    )
    [not_ready] = [a for a in alerts if a["alertname"] == "RestoreAgentNotReady"]
    elsewhere = {**not_ready, "instance": "node-2"}
    alertmanager.post([*alerts, elsewhere])
    states = alertmanager.silenced(len(alerts) + 1, suppressed=1)
    [disk] = [a for a in alerts if a["alertname"] == "RestoreAgentStateUnwritable"]
    assert states == {"active": {_key(disk), _key(elsewhere)}, "suppressed": {_key(not_ready)}}


def test_a_second_agent_with_the_token_silences_its_nodes_not_ready(
    alertmanager: Alertmanager,
) -> None:
    """The named cause pages; NotReady on its node does not."""
    alerts = _fired_together(
        "a second agent with the token and the agent is not ready because of it (inhibited)"
    )
    alertmanager.post(alerts)
    states = alertmanager.silenced(len(alerts), suppressed=1)
    [duplicate] = [a for a in alerts if a["alertname"] == "RestoreAgentDuplicateAgent"]
    [not_ready] = [a for a in alerts if a["alertname"] == "RestoreAgentNotReady"]
    assert states == {"active": {_key(duplicate)}, "suppressed": {_key(not_ready)}}


def test_every_inhibition_rule_has_a_case_here() -> None:
    """Six rules, each silencing in one of the cases above (fleet: session and, by the same
    labels, `depends_on: cloudly`; session; token and enrollment; restarting; state disk and a
    second agent with the token)."""
    rules = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())["inhibit_rules"]
    sources = sorted(rule["source_matchers"][0] for rule in rules)
    assert sources == sorted(
        [
            'alertname="RestoreAgentCloudlyUnreachableFleetWide"',
            'alertname="RestoreAgentCloudlyUnreachableFleetWide"',
            'alertname="RestoreAgentCloudlySessionDown"',
            'alertname=~"RestoreAgentMachineTokenRefused|RestoreAgentEnrollmentFailing"',
            'alertname="RestoreAgentRestarting"',
            'alertname=~"RestoreAgentStateUnwritable|RestoreAgentDuplicateAgent"',
        ]
    )


def test_the_runbook_page_lists_every_inhibition_rule() -> None:
    """docs/operations.md's table of inhibitions names the source alert of every rule here:
    the page an operator reads says which cause silences what."""

    rules = yaml.safe_load(ALERTMANAGER_CONFIG.read_text())["inhibit_rules"]
    text = (ROOT / "docs" / "operations.md").read_text()
    table = text[text.index("| source (firing) | silences | on |") :].split("\n\n")[0]
    documented = {
        name for row in table.splitlines()[2:] for name in re.findall(r"`(\w+)`", row.split("|")[1])
    }
    sources = {
        name
        for rule in rules
        for name in re.findall(r"RestoreAgent\w+", rule["source_matchers"][0])
    }
    assert sources
    assert sources - documented == set()
