"""Cloudly's control during a cluster benchmark (issue 34): status polls that count the ones the
agent turned away instead of ending the run, and the agent's own count of control requests it
deferred (its /metrics)."""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from agent.errors import CallFailed
from bench._staging_runs import AgentMetrics
from devstack.driver import RestoreDriver

__all__ = ["ControlProbe", "deferred_control", "merge"]


@dataclass(slots=True)
class ControlProbe:
    """Polls one restore's status until stopped: every round trip in ms, and each poll that
    failed (the agent answered `retry` until the driver gave up) counted, not raised."""

    driver: RestoreDriver
    interval_s: float
    latencies_ms: list[float] = field(default_factory=list)
    refused: int = 0

    async def run(self, stop: asyncio.Event) -> None:
        """Poll until `stop` is set (one request in flight at a time, `interval_s` apart)."""
        while not stop.is_set():
            started = time.perf_counter()
            try:
                await self.driver.status()
            except CallFailed:
                self.refused += 1
            else:
                self.latencies_ms.append((time.perf_counter() - started) * 1000)
            # Pacing, not synchronisation: the next poll goes out `interval_s` later.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval_s):
                    await stop.wait()


def merge(probes: list[ControlProbe]) -> dict[str, Any]:
    """count, p50, p99, max (ms) over every probe's answered polls; `refused` polls."""
    values = sorted(v for probe in probes for v in probe.latencies_ms)
    refused = sum(probe.refused for probe in probes)
    if not values:
        return {"count": 0, "refused": refused}
    p99 = values[min(len(values) - 1, round(0.99 * (len(values) - 1)))]
    return {
        "count": len(values),
        "p50_ms": statistics.median(values),
        "p99_ms": p99,
        "max_ms": values[-1],
        "refused": refused,
    }


async def deferred_control(metrics: AgentMetrics) -> int | None:
    """The agent's count of control requests it deferred (None: it has no such metric)."""
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://{metrics.address}/metrics") as response,
    ):
        text = await response.text()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (
                sample.name == "restore_agent_request_class_deferred_total"
                and sample.labels.get("class") == "control"
            ):
                return int(sample.value)
    return None
