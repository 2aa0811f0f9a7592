"""One measured stage each, driven from the stand-in Cloudly (the bench process is Cloudly).

- `stage_agent()`: prepare, then `stageIsolatedRestoreArchive` with the object on a
  VirtualStream the stand-in initiates; optionally fires `coreflowGetIsolatedRestoreStatus`
  at the same agent while the stage runs (`StatusProbe`) and samples the agent's RSS
  (`RssSampler`).
- `stage_baseline()`: the same bytes on the same kind of stream into `benchForward`
  (bench/_staging_passthrough.py); the staging archive is prepared at Corestore directly.

Timing runs from the first chunk written to the outer reply (the reply comes after Corestore's
commit in both). CPU seconds of the child over the same span come from /proc/<pid>/stat.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.contracts.isolatedrestore import METHOD_GET_STATUS, METHOD_PREPARE, METHOD_STAGE
from agent.corestore.client import CorestoreClient
from agent.devstack.cloudly import StandInCloudly
from agent.secret import Secret
from bench._procstat import cpu_seconds, memory_kib
from bench._staging_passthrough import METHOD_FORWARD
from bench._staging_world import Restore, grant

__all__ = [
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

    cloudly: StandInCloudly
    restore: Restore
    interval_s: float
    latencies_ms: list[float] = field(default_factory=list)
    errors: int = 0

    async def run(self, stop: asyncio.Event) -> None:
        """Probe until `stop` is set (one request in flight at a time, `interval_s` apart)."""
        while not stop.is_set():
            started = time.perf_counter()
            reply = await self.cloudly.call_agent(METHOD_GET_STATUS, self.restore.status(), 30.0)
            self.latencies_ms.append((time.perf_counter() - started) * 1000)
            if reply.get("found") is not True:
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


async def _send(cloudly: StandInCloudly, restore: Restore, call: asyncio.Task[dict[str, Any]],
                sink: Any) -> dict[str, Any]:
    for index in range(restore.obj.size // len(restore.obj.blocks[0])):
        await sink.write(restore.obj.blocks[index % len(restore.obj.blocks)])
    await sink.close()
    return await call


async def stage_agent(
    cloudly: StandInCloudly,
    restore: Restore,
    pids: dict[str, int],
    form: str,
    *,
    probe: StatusProbe | None = None,
    sampler: RssSampler | None = None,
) -> StageRun:
    """Prepare and stage `restore`'s object through the agent (`pids["child"]`)."""
    prepared = await cloudly.call_agent(METHOD_PREPARE, restore.prepare(), 120.0)
    revision = int(prepared["state"]["revision"])
    marker, sink = cloudly.open_send_stream()
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as group:
        for watcher in (probe, sampler):
            if watcher is not None:
                group.create_task(watcher.run(stop))
        started, meter = time.perf_counter(), CpuMeter(pids)
        call = group.create_task(
            cloudly.call_agent(METHOD_STAGE, restore.stage(revision, marker), _STAGE_TIMEOUT_S)
        )
        try:
            reply = await _send(cloudly, restore, call, sink)
        finally:
            seconds, cpu = time.perf_counter() - started, meter.spent()
            stop.set()
    state = reply["state"]
    if (state["status"], state["revision"]) != ("staging", revision + 1):
        raise RuntimeError(f"the stage ended in {state['status']} at {state['revision']}")
    return StageRun("agent", form, restore.obj.size, seconds, cpu, reply)


async def stage_baseline(
    cloudly: StandInCloudly,
    restore: Restore,
    pids: dict[str, int],
    form: str,
    corestore: CorestoreClient,
) -> StageRun:
    """Prepare the archive at Corestore, then push the same bytes through `benchForward`."""
    await corestore.prepare_restore(
        restore.restore_id,
        scratch_namespace_id=restore.scratch_id,
        staging_archive_id=restore.archive_id,
        resource_mappings=[restore.mapping],
        archive_manifest={"objects": [restore.entry]},
        grant=Secret(grant()),
    )
    marker, sink = cloudly.open_send_stream()
    started, meter = time.perf_counter(), CpuMeter(pids)
    call = asyncio.create_task(
        cloudly.call_agent(METHOD_FORWARD, restore.forward(corestore.endpoint, marker),
                           _STAGE_TIMEOUT_S)
    )
    try:
        reply = await _send(cloudly, restore, call, sink)
    finally:
        if not call.done():
            call.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await call
    seconds, cpu = time.perf_counter() - started, meter.spent()
    if reply["bytes"] != restore.obj.size:
        raise RuntimeError(f"the baseline forwarded {reply['bytes']} of {restore.obj.size} bytes")
    return StageRun(
        "baseline", form, restore.obj.size, seconds, cpu, reply, commit_s=reply["commitSeconds"]
    )
