"""The operator's view of a restore under way: metrics move, /v1/restores and `status` show it."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agent.corestore.routes import RouteName
from agent.entry.cli import main
from devstack.driver import RestorePlan


async def _get(stack: Any, path: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as http, http.get(f"http://{stack.health}{path}") as answer:
        return answer.status, await answer.text()


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a Prometheus text: (name, labels) -> value."""
    samples = {}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        series, value = line.rsplit(" ", 1)
        name, _, label_text = series.partition("{")
        labels = frozenset(
            (key, raw.strip('"'))
            for key, raw in (
                pair.split("=", 1) for pair in label_text.rstrip("}").split(",") if pair
            )
        )
        samples[(name, labels)] = float(value)
    return samples


def _value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


async def test_metrics_move_while_an_archive_is_staged(stack: Any, plan: RestorePlan) -> None:
    """Mid-stage /metrics already counts staged and streamed bytes, chunk PUTs with their
    latency, the chunk Corestore refused once (a retry) and one restore `staging`; at the end
    every byte of the manifest is counted as staged and verified exactly once."""
    total = sum(spec.size for spec in plan.objects)
    # Chunk 10 is refused once (503: the client sends it again); chunk 20 waits 2 s, so the
    # scrape below lands mid-stage whatever the machine's speed.
    stack.on_hit(RouteName.PUT_CHUNK, 10, lambda: stack.faults.fail_next(RouteName.PUT_CHUNK))
    stack.on_hit(RouteName.PUT_CHUNK, 21, lambda: stack.faults.delay_next(RouteName.PUT_CHUNK, 2))
    driver = stack.driver(plan)
    async with stack.agent(chunk_size=64 * 1024):
        await driver.prepare()
        staging = asyncio.create_task(driver.stage_all())
        await stack.wait_hits(RouteName.PUT_CHUNK, 21)
        mid = _samples((await _get(stack, "/metrics"))[1])
        await staging
        final = _samples((await _get(stack, "/metrics"))[1])
    staged = "restore_agent_staged_bytes_total"
    assert 0 < _value(mid, staged) < total
    assert 0 < _value(mid, "restore_agent_stream_bytes_total", direction="in") < total
    assert _value(mid, "restore_agent_restores", status="staging") == 1
    chunk_ok = {"route": "put-chunk", "outcome": "ok"}
    assert _value(mid, "restore_agent_corestore_request_duration_seconds_count", **chunk_ok) == 19
    assert _value(mid, "restore_agent_chunk_retries_total", reason="unavailable") == 1
    assert _value(final, staged) == total
    assert _value(final, "restore_agent_verified_bytes_total") == total
    assert _value(final, "restore_agent_stream_bytes_total", direction="in") == total
    stage_ok = {"method": "stageIsolatedRestoreArchive", "code": "ok"}
    assert _value(final, "restore_agent_requests_total", **stage_ok) == len(plan.objects)
    assert _value(
        final, "restore_agent_store_mutation_duration_seconds_count", op="stage", outcome="ok"
    ) == (len(plan.objects))
    assert _value(final, "restore_agent_chunk_retries_total", reason="unavailable") == 1


@pytest.fixture
def status_config(tmp_path: Path) -> Path:
    """A config file for `restore-agent status`: only the health section matters to it."""
    path = tmp_path / "status.toml"
    for name in ("machine-token", "corestore-credential"):
        (tmp_path / name).write_text("unused-secret-value\n")
        (tmp_path / name).chmod(0o600)
    return path


def _write_status_config(path: Path, address: str) -> None:
    path.write_text(
        '[cloudly]\nurl = "https://cloudly.example"\ntoken_file = "machine-token"\n'
        f'[health]\nlisten = "{address}"\n'
    )


async def _status(
    stack: Any, config: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, int, Any]:
    """`restore-agent status` against the running agent, as a table and with `--json`: (exit,
    table, exit, the parsed JSON)."""
    _write_status_config(config, stack.health)
    capsys.readouterr()
    table_exit = await asyncio.to_thread(main, ["status", "--config", str(config)])
    table = capsys.readouterr().out
    json_exit = await asyncio.to_thread(main, ["status", "--config", str(config), "--json"])
    return table_exit, table, json_exit, json.loads(capsys.readouterr().out)


async def test_restores_and_the_status_command_show_each_restore_without_a_secret(
    stack: Any,
    plan: RestorePlan,
    status_config: Path,
    capsys: pytest.CaptureFixture[str],
    captured_logs: Any,  # the agent's log lines go there, not into the command's output
) -> None:
    """/v1/restores has one row per key (status, revision, age, staging progress in bytes);
    `restore-agent status` prints it as a table and `--json` as data; no grant, token or JWT
    appears in any of them."""
    driver = stack.driver(plan)
    async with stack.agent():
        await driver.prepare()
        await driver.stage_all()
        code, body = await _get(stack, "/v1/restores")
        table_exit, table, json_exit, as_json = await _status(stack, status_config, capsys)
    [row] = json.loads(body)["restores"]
    total = sum(spec.size for spec in plan.objects)
    assert code == 200
    assert row["clusterId"] == plan.cluster_id
    assert row["restoreId"] == plan.restore_id
    assert row["status"] == "staging"
    assert row["revision"] == driver.revision
    assert row["progress"] == {
        "done": total,
        "total": total,
        "unit": "bytes",
        "objects": {"done": len(plan.objects), "total": len(plan.objects)},
    }
    assert table_exit == json_exit == 0
    assert re.match(r"agent:    ready \(version .+, up \d+ s\)\nsession:  connected for ", table)
    key = f"{plan.cluster_id}/{plan.node}/{plan.restore_id}"
    [line] = [line for line in table.splitlines() if line.startswith(key)]
    assert line.split()[1:4] == ["staging", str(driver.revision), "100%"]
    assert as_json["ready"] is True
    assert as_json["restores"] == [{**row, "ageSeconds": as_json["restores"][0]["ageSeconds"]}]
    assert stack.leaked(body + table + json.dumps(as_json), driver) == []


async def test_the_status_command_shows_relay_jobs_as_the_endpoint_does(
    stack: Any,
    status_config: Path,
    capsys: pytest.CaptureFixture[str],
    captured_logs: Any,  # the agent's log lines go there, not into the command's output
) -> None:
    """After a service backup, /v1/jobs has its row; `restore-agent status` prints it in its
    jobs table and `--json` carries the same row, with the same node key name as restores."""
    stack.corestore.services.write_database("svc-app", [b"a small database"])
    service = {"id": "svc-app", "data": {"name": "app", "image": "app:1"}}
    async with stack.agent():
        await stack.cloudly.call_agent(
            "backupClusterService",
            {"nodeId": "node-e2e", "backupId": "bk-ops", "service": service},
            timeout=60,
        )
        code, body = await _get(stack, "/v1/jobs")
        table_exit, table, json_exit, as_json = await _status(stack, status_config, capsys)
    [row] = json.loads(body)["jobs"]
    assert (code, table_exit, json_exit) == (200, 0, 0)
    assert (row["kind"], row["status"], row["backupId"]) == ("backup", "succeeded", "bk-ops")
    assert "jobs:     1\n" in table
    [line] = [line for line in table.splitlines() if "/bk-ops" in line]
    assert line.split()[:4] == [
        f"{row['clusterId']}/{row['nodeId']}/bk-ops",
        "backup",
        "svc-app",
        "succeeded",
    ]
    assert as_json["jobs"] == [{**row, "ageSeconds": as_json["jobs"][0]["ageSeconds"]}]


async def test_every_panel_and_alert_names_a_metric_a_running_agent_exports(
    stack: Any, plan: RestorePlan
) -> None:
    """The dashboard and the alert rules against real scrapes of a running agent: mid-stage
    (a transfer moves), after it, and with Cloudly gone (the outage's gauges). Every series a
    panel, a dashboard variable or an alert names is in one of them, with the labels it
    matches on."""
    from tests.test_ops_rules import (  # the parser the unit checks share
        SCRAPE_SERIES,
        TARGET_LABELS,
        every_expression,
        exposition_series,
        matched_labels,
        metric_names,
        template_metrics,
    )

    stack.on_hit(RouteName.PUT_CHUNK, 5, lambda: stack.faults.delay_next(RouteName.PUT_CHUNK, 1))
    driver = stack.driver(plan)
    scrapes = []
    async with stack.agent(chunk_size=64 * 1024, cloudly={"ping_interval_s": 0.2}) as status:
        await status.wait_until(lambda s: s.last_pong_at is not None)  # the keepalive's gauge
        await driver.prepare()
        staging = asyncio.create_task(driver.stage_all())
        await stack.wait_hits(RouteName.PUT_CHUNK, 5)
        scrapes.append((await _get(stack, "/metrics"))[1])
        await staging
        scrapes.append((await _get(stack, "/metrics"))[1])
        await stack.cloudly.stop()
        # The outage's gauge exists once the status holds the outage (a scrape reads it).
        await status.wait_until(lambda s: s.unreachable_since is not None)
        scrapes.append((await _get(stack, "/metrics"))[1])
    exposed: dict[str, set[str]] = {}
    for text in scrapes:
        for name, labels in exposition_series(text).items():
            exposed.setdefault(name, set()).update(labels)
    missing = {
        (where, name)
        for where, expression in every_expression()
        for name in metric_names(expression)
        if name not in exposed and name not in SCRAPE_SERIES
    } | {("variable", name) for name in template_metrics() - set(exposed)}
    assert missing == set()
    unknown = {
        (where, name, label)
        for where, expression in every_expression()
        for name, labels in matched_labels(expression).items()
        if name in exposed
        for label in labels - exposed[name] - TARGET_LABELS
    }
    assert unknown == set()
    assert "restore_agent_transfers_moving" in exposed
    assert "restore_agent_transfer_wait_duration_seconds_bucket" in exposed
