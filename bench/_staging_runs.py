"""One measured stage each, driven from the stand-in Cloudly (the bench process is Cloudly).

- `stage_agent()`: `devstack.driver.RestoreDriver` prepares, then stages the object on a
  VirtualStream the stand-in initiates; optionally a second driver of the same restore fires
  `coreflowGetIsolatedRestoreStatus` at the same agent while the stage runs (`StatusProbe`),
  and the agent's RSS is sampled (`RssSampler`).
- `stage_baseline()`: the same pieces on the same kind of stream into `benchForward`
  (bench/_staging_passthrough.py), written the way the driver writes them; the staging
  archive is prepared at Corestore directly.

Timing runs from the first chunk written to the outer reply (the reply comes after Corestore's
commit in both). CPU seconds of the child over the same span come from /proc/<pid>/stat.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from agent.corestore.client import CorestoreClient
from agent.secret import Secret
from bench._procstat import cpu_seconds, memory_kib
from bench._staging_passthrough import METHOD_FORWARD
from bench._staging_world import BenchObject, forward_body
from devstack.cloudly import StandInCloudly
from devstack.driver import RestoreDriver, RestorePlan, fake_grant

__all__ = [
    "AgentMetrics",
    "CpuMeter",
    "RssSampler",
    "StageRun",
    "StatusProbe",
    "reset_peak_rss",
    "stage_agent",
    "stage_baseline",
]

_STAGE_TIMEOUT_S = 1800.0


@dataclass(slots=True)
class StageRun:
    """One object through one path."""

    path: str  # "agent" or "baseline"
    form: str
    bytes: int
    seconds: float
    cpu_s: dict[str, float]  # CPU seconds over the span: "child", "corestore", "cloudly"
    reply: dict[str, Any]
    commit_s: float | None = None  # the baseline's Corestore commit (re-hash), from its reply
    warmup: bool = False  # a warm-up stage, not a figure

    @property
    def mb_per_s(self) -> float:
        """Decimal MB/s, first chunk -> reply."""
        return self.bytes / 1e6 / self.seconds

    @property
    def forward_mb_per_s(self) -> float:
        """Decimal MB/s without the commit (the baseline only; else `mb_per_s`)."""
        seconds = self.seconds - (self.commit_s or 0.0)
        return self.bytes / 1e6 / seconds

    def cpu_s_per_gib(self, who: str = "child") -> float:
        """CPU seconds per GiB moved of `who` ("child", "corestore" or "cloudly")."""
        return self.cpu_s[who] / (self.bytes / 2**30)


class CpuMeter:
    """CPU seconds of several processes over one span (this process is "cloudly")."""

    def __init__(self, pids: dict[str, int]) -> None:
        self._pids = {**pids, "cloudly": os.getpid()}
        self._started = {name: cpu_seconds(pid) for name, pid in self._pids.items()}

    def spent(self) -> dict[str, float]:
        """CPU seconds each process used since the meter was made."""
        return {name: cpu_seconds(pid) - self._started[name] for name, pid in self._pids.items()}


@dataclass(slots=True)
class StatusProbe:
    """Fires status requests at the agent until stopped; keeps every round-trip in ms."""

    driver: RestoreDriver  # its own driver: the stage's driver keeps its own revision
    interval_s: float
    latencies_ms: list[float] = field(default_factory=list)
    errors: int = 0

    async def run(self, stop: asyncio.Event) -> None:
        """Probe until `stop` is set (one request in flight at a time, `interval_s` apart)."""
        while not stop.is_set():
            started = time.perf_counter()
            state = await self.driver.status()
            self.latencies_ms.append((time.perf_counter() - started) * 1000)
            if state is None:
                self.errors += 1
            # Pacing, not synchronisation: the next probe goes out `interval_s` later.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval_s):
                    await stop.wait()

    def summary(self) -> dict[str, float | int]:
        """count, p50, p99, max (ms)."""
        values = sorted(self.latencies_ms)
        if not values:
            return {"count": 0}
        p99 = values[min(len(values) - 1, round(0.99 * (len(values) - 1)))]
        return {
            "count": len(values),
            "p50_ms": statistics.median(values),
            "p99_ms": p99,
            "max_ms": values[-1],
            "not_found": self.errors,
        }


@dataclass(slots=True)
class AgentMetrics:
    """The agent's own histograms over a phase, read from its `/metrics` before and after:
    how long it took to answer the status probe's requests once they were read
    (`request_duration_seconds`), and how late its event loop woke (`event_loop_lag_seconds`).
    What a status round trip spent outside those (queued in the TCP stream, in Cloudly's
    process) is the probe's figure less the agent's."""

    address: str
    before: dict[tuple[str, str, str], float] = field(default_factory=dict)

    @classmethod
    def from_log(cls, log_path: Path) -> AgentMetrics | None:
        """The agent whose JSON log is `log_path`: its health address (None: not logged)."""
        for line in log_path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                if isinstance(entry, dict) and entry.get("event") == "health_listening":
                    return cls(str(entry["address"]))
        return None

    async def scrape(self) -> dict[tuple[str, str, str], float]:
        """Every histogram bucket: (metric, method label, le) -> cumulative count."""
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://{self.address}/metrics") as response,
        ):
            text = await response.text()
        buckets: dict[tuple[str, str, str], float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    key = (sample.name, sample.labels.get("method", ""), sample.labels["le"])
                    buckets[key] = sample.value
        return buckets

    async def start(self) -> None:
        """Mark the phase's start."""
        self.before = await self.scrape()

    async def since_start(self, method: str) -> dict[str, dict[str, int]]:
        """For the phase: `status` (answers of `method` within each bucket's bound, cumulative)
        and `loop_lag` (the loop's wakes within each bound)."""
        after = await self.scrape()
        result: dict[str, dict[str, int]] = {"status": {}, "loop_lag": {}}
        for (name, label, le), value in after.items():
            spent = int(value - self.before.get((name, label, le), 0))
            if name == "restore_agent_request_duration_seconds_bucket" and label == method:
                result["status"][le] = spent
            elif name == "restore_agent_event_loop_lag_seconds_bucket":
                result["loop_lag"][le] = spent
        return result


@dataclass(slots=True)
class RssSampler:
    """Samples a process's VmRSS every `interval_s` until stopped."""

    pid: int
    interval_s: float
    peak_kib: int = 0
    samples: int = 0

    async def run(self, stop: asyncio.Event) -> None:
        """Sample until `stop` is set."""
        while not stop.is_set():
            rss, _ = memory_kib(self.pid)
            self.peak_kib = max(self.peak_kib, rss)
            self.samples += 1
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval_s):
                    await stop.wait()


def reset_peak_rss(pid: int) -> bool:
    """Reset VmHWM to the current RSS (`clear_refs` 5; needs the right to write it)."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    except OSError:
        return False
    return True


async def stage_agent(
    driver: RestoreDriver,
    pids: dict[str, int],
    form: str,
    *,
    probe: StatusProbe | None = None,
    sampler: RssSampler | None = None,
) -> StageRun:
    """Stage the plan's one object through the agent (`pids["child"]`); prepared already."""
    revision = driver.revision
    spec = driver.plan.objects[0]
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as group:
        for watcher in (probe, sampler):
            if watcher is not None:
                group.create_task(watcher.run(stop))
        started, meter = time.perf_counter(), CpuMeter(pids)
        try:
            state = await driver.stage(spec)
        finally:
            seconds, cpu = time.perf_counter() - started, meter.spent()
            stop.set()
    if (state["status"], state["revision"]) != ("staging", revision + 1):
        raise RuntimeError(f"the stage ended in {state['status']} at {state['revision']}")
    return StageRun("agent", form, spec.size, seconds, cpu, state)


async def stage_baseline(
    cloudly: StandInCloudly,
    plan: RestorePlan,
    obj: BenchObject,
    pids: dict[str, int],
    form: str,
    corestore: CorestoreClient,
    piece_size: int,
) -> StageRun:
    """Prepare the archive at Corestore, then push the same pieces through `benchForward`."""
    await corestore.prepare_restore(
        plan.restore_id,
        scratch_namespace_id=plan.scratch_namespace_id,
        staging_archive_id=plan.staging_archive_id,
        resource_mappings=[mapping.to_wire() for mapping in plan.mappings],
        archive_manifest={"objects": [obj.spec.entry()]},
        grant=Secret(fake_grant()),
    )
    marker, sink = cloudly.open_send_stream()
    body = forward_body(plan, obj, corestore.endpoint, marker)
    started, meter = time.perf_counter(), CpuMeter(pids)
    async with asyncio.TaskGroup() as group:
        call = group.create_task(cloudly.call_agent(METHOD_FORWARD, body, _STAGE_TIMEOUT_S))
        for piece in obj.spec.pieces(piece_size):
            await sink.write(piece)
        await sink.close()
    seconds, cpu = time.perf_counter() - started, meter.spent()
    reply = call.result()
    if reply["bytes"] != obj.size:
        raise RuntimeError(f"the baseline forwarded {reply['bytes']} of {obj.size} bytes")
    return StageRun(
        "baseline", form, obj.size, seconds, cpu, reply, commit_s=reply["commitSeconds"]
    )
