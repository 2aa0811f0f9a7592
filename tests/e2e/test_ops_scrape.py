"""Scraping the agents as docs/operations.md, "Scraping the agents", says: the agent serves
/metrics alone on `[health] metrics_listen`, and a real Prometheus with the shipped scrape job
(ops/prometheus/scrape.yml) scrapes it as `job="restore-agent"` with `instance` its node's name,
which the rules, the inhibitions and the dashboard key on."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.config import Config
from agent.entry import app
from agent.watch.status import AgentStatus, SessionState

ROOT = Path(__file__).resolve().parents[2]
SCRAPE = ROOT / "ops" / "prometheus" / "scrape.yml"
NODE, CLUSTER = "relay-1.cluster-a", "cluster-a"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _tool(name: str) -> str:
    """`name` on PATH; in CI a missing one fails, elsewhere it skips, loudly."""
    found = shutil.which(name)
    if found is not None:
        return found
    message = f"{name} is not installed (Debian: apt-get install prometheus): NOT checked"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:  # noqa: S310  # a test's own URL
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""


async def _with_metrics_listen(
    stack: Any, scrape_port: int
) -> tuple[AgentStatus, asyncio.Event, Config]:
    data = stack.config_data()
    data["health"]["metrics_listen"] = f"127.0.0.1:{scrape_port}"
    return AgentStatus(), asyncio.Event(), Config.model_validate(data)


async def test_the_metrics_listener_serves_the_metrics_alone(stack: Any) -> None:
    """/metrics answers on metrics_listen; the node's state (/readyz, /v1/restores) does not."""
    port = _free_port()
    status, stop, config = await _with_metrics_listen(stack, port)
    async with asyncio.TaskGroup() as group:
        group.create_task(app.run(config, stop=stop, status=status))
        try:
            async with asyncio.timeout(15):
                await status.wait_until(lambda s: s.state is SessionState.CONNECTED)
            base = f"http://127.0.0.1:{port}"
            metrics = await asyncio.to_thread(_get, f"{base}/metrics")
            restores = await asyncio.to_thread(_get, f"{base}/v1/restores")
            ready = await asyncio.to_thread(_get, f"{base}/readyz")
        finally:
            stop.set()
    assert metrics[0] == 200
    assert "restore_agent_build_info{" in metrics[1]
    assert (restores[0], ready[0]) == (404, 404)


def _prometheus_config(tmp_path: Path, scrape_port: int) -> Path:
    """The shipped scrape job, its targets file in `tmp_path`, scraped every second."""
    targets = tmp_path / "restore-agent-targets.yml"
    entry = {"targets": [f"127.0.0.1:{scrape_port}"], "labels": {"node": NODE, "cluster": CLUSTER}}
    targets.write_text(yaml.safe_dump([entry]))
    shipped = yaml.safe_load(SCRAPE.read_text())
    [job] = shipped["scrape_configs"]
    job["file_sd_configs"] = [{"files": [str(targets)]}]
    job["scrape_interval"], job["scrape_timeout"] = "1s", "1s"
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(shipped))
    return path


def test_promtool_accepts_the_scrape_job() -> None:
    promtool = _tool("promtool")
    done = subprocess.run(  # a fixed argument list
        [promtool, "check", "config", str(SCRAPE)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


async def test_prometheus_scrapes_the_agent_as_its_node(stack: Any, tmp_path: Path) -> None:
    """A real Prometheus with ops/prometheus/scrape.yml: `up` of the job restore-agent is 1
    for instance=<the node's name> (not an address), with the node's cluster."""
    binary = _tool("prometheus")
    scrape_port, web_port = _free_port(), _free_port()
    status, stop, config = await _with_metrics_listen(stack, scrape_port)
    query = urllib.parse.urlencode({"query": 'up{job="restore-agent"}'})
    url = f"http://127.0.0.1:{web_port}/api/v1/query?{query}"
    found: list[dict[str, Any]] = []
    async with asyncio.TaskGroup() as group:
        group.create_task(app.run(config, stop=stop, status=status))
        prometheus = await asyncio.create_subprocess_exec(
            binary,
            f"--config.file={_prometheus_config(tmp_path, scrape_port)}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{web_port}",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        try:
            async with asyncio.timeout(60):
                while not found:
                    await asyncio.sleep(0.5)  # polling another process's API, not a test's own
                    try:
                        code, body = await asyncio.to_thread(_get, url)
                    except OSError:
                        continue  # Prometheus still starting
                    if code == 200:
                        found = json.loads(body)["data"]["result"]
        finally:
            prometheus.terminate()
            await prometheus.wait()
            stop.set()
    [series] = found
    assert series["metric"]["instance"] == NODE
    assert (series["metric"]["job"], series["metric"]["cluster"]) == ("restore-agent", CLUSTER)
    assert series["value"][1] == "1"
