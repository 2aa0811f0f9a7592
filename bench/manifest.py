"""Per-object cost of staging as the manifest grows: the same bytes as 10, 1,000, 10,000 objects.

One agent process (`python -m agent run --config F`, of this checkout or of `--checkout`'s),
the reference Corestore as its own process, a stand-in Cloudly in this process driving whole
isolated restores with `devstack.driver.RestoreDriver` (prepare, stage every object, execute
until `ready`, cleanup until `cleaned`), all on 127.0.0.1. For each manifest size `n` the
archive holds `--total-bytes` bytes as `n` equal objects under one database mapping; the
smallest manifest is restored `--small-repeat` times (fresh restore ids) so that its staged
objects are enough CPU ticks to count.

Per size it reports the agent's CPU seconds spent while the objects were staged (from
/proc/<pid>/stat, over the stage calls only) divided by the objects staged, the stage calls'
p50/p99 latency, the status round-trips fired at the same agent meanwhile (one in flight,
every `--status-interval-ms`), and each phase's wall time of one restore. The last line is

    per-object overhead 10000/10: X.XX

the agent CPU per staged object of the largest manifest over that of the smallest, same run:
a per-request cost that grows with the manifest shows as a ratio above 1. The figures and the
commands that made them are in docs/benchmarks.md. Run from the repository root:

    .venv/bin/python -m bench.manifest [--sizes 10,1000,10000] [--total-bytes 1000000]
        [--small-repeat 20] [--form buffer] [--checkout PATH] [--json out.json] [--keep]

`--checkout` runs another checkout's agent (with its own `.venv`) against this checkout's
stand-ins, to measure an older agent the same way. The work directory goes under `--dir`
(default: the system temp dir), never the repository.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.log import configure_logging
from bench._procstat import cpu_seconds, machine_facts
from bench._staging_runs import StatusProbe
from bench._staging_world import (
    CLUSTER,
    NODE,
    ROOT,
    Corestore,
    CycledObject,
    agent_process,
    corestore_process,
    quiet_stand_in_logs,
    say,
    work_directory,
)
from bench.staging import cloudly_for
from devstack.cloudly import StandInCloudly
from devstack.driver import MappingSpec, RestoreDriver, RestorePlan

__all__ = ["main"]

SNAPSHOT = "snap-db"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,1000,10000", help="manifest sizes, smallest first")
    parser.add_argument(
        "--total-bytes", type=int, default=1_000_000, help="archive bytes at every size"
    )
    parser.add_argument(
        "--small-repeat", type=int, default=20, help="restores of the smallest manifest"
    )
    parser.add_argument("--form", default="buffer", help="chunk form Cloudly sends")
    parser.add_argument("--chunk-mib", type=int, default=4, help="[corestore] chunk_size")
    parser.add_argument("--status-interval-ms", type=float, default=50.0)
    parser.add_argument("--checkout", type=Path, default=ROOT, help="the agent's checkout")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    parser.add_argument(
        "--dir", type=Path, help="where the work directory goes (default: the system temp dir)"
    )
    args = parser.parse_args(argv)
    args.sizes = [int(size) for size in args.sizes.split(",") if size]
    if sorted(args.sizes) != args.sizes or len(args.sizes) < 2:
        parser.error("--sizes: at least two, smallest first")
    return args


def archive(restore_id: str, objects: int, total_bytes: int) -> RestorePlan:
    """`total_bytes` as `objects` equal objects of one snapshot (one database mapping)."""
    size = total_bytes // objects
    seed = b"bench manifest %d" % size
    digest = hashlib.sha256(b"".join(CycledObject("x", size, seed).blocks())).hexdigest()
    specs = tuple(
        CycledObject(f"{SNAPSHOT}/part-{index:06d}.bin", size, seed, digest)
        for index in range(objects)
    )
    return RestorePlan(
        CLUSTER,
        NODE,
        (MappingSpec("map-db", "database", SNAPSHOT, "app", "mongodb"),),
        specs,
        restore_id=restore_id,
        scratch_namespace_id=f"scratch-{restore_id}",
        staging_archive_id=f"staging-{restore_id}",
    )


@dataclass(slots=True)
class SizeRun:
    """Every restore of one manifest size."""

    objects: int
    object_bytes: int
    restores: int = 0
    staged: int = 0
    agent_cpu_s: float = 0.0  # over the stage calls only
    corestore_cpu_s: float = 0.0
    stage_ms: list[float] = field(default_factory=list)
    status_ms: list[float] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)  # the last restore's wall seconds
    prepare_agent_cpu_s: float = 0.0

    @property
    def cpu_ms_per_object(self) -> float:
        """Agent CPU milliseconds per staged object."""
        return self.agent_cpu_s * 1000 / self.staged

    def summary(self) -> dict[str, Any]:
        """The figures of this size."""
        return {
            "objects": self.objects,
            "object_bytes": self.object_bytes,
            "restores": self.restores,
            "staged": self.staged,
            "agent_cpu_s": self.agent_cpu_s,
            "agent_cpu_ms_per_object": self.cpu_ms_per_object,
            "corestore_cpu_ms_per_object": self.corestore_cpu_s * 1000 / self.staged,
            "stage_p50_ms": _quantile(self.stage_ms, 0.5),
            "stage_p99_ms": _quantile(self.stage_ms, 0.99),
            "status_count": len(self.status_ms),
            "status_p50_ms": _quantile(self.status_ms, 0.5),
            "status_p99_ms": _quantile(self.status_ms, 0.99),
            "prepare_agent_cpu_s": self.prepare_agent_cpu_s,
            "phases_s": self.phases,
        }


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def restore_once(
    cloudly: StandInCloudly,
    plan: RestorePlan,
    pids: dict[str, int],
    run: SizeRun,
    status_interval_s: float,
) -> None:
    """One whole restore of `plan`; its figures added to `run`."""
    driver = RestoreDriver(cloudly, plan, call_timeout=600.0)
    phases: dict[str, float] = {}
    started = time.perf_counter()
    agent_before = cpu_seconds(pids["agent"])
    state = await driver.prepare()
    run.prepare_agent_cpu_s = cpu_seconds(pids["agent"]) - agent_before
    phases["prepare"] = time.perf_counter() - started
    if state["status"] != "prepared":
        raise RuntimeError(f"prepare ended {state['status']}: {state.get('lastErrorMessage')}")

    probe = StatusProbe(RestoreDriver(cloudly, plan), status_interval_s)
    stop = asyncio.Event()
    staging = time.perf_counter()
    agent_before, corestore_before = cpu_seconds(pids["agent"]), cpu_seconds(pids["corestore"])
    async with asyncio.TaskGroup() as group:
        group.create_task(probe.run(stop))
        try:
            for spec in plan.objects:
                one = time.perf_counter()
                await driver.stage(spec)
                run.stage_ms.append((time.perf_counter() - one) * 1000)
        finally:
            stop.set()
    run.agent_cpu_s += cpu_seconds(pids["agent"]) - agent_before
    run.corestore_cpu_s += cpu_seconds(pids["corestore"]) - corestore_before
    run.staged += len(plan.objects)
    run.status_ms.extend(probe.latencies_ms)
    phases["stage"] = time.perf_counter() - staging

    mark = time.perf_counter()
    await driver.execute()
    state = await driver.wait_until({"ready", "failed"}, timeout=1800.0)
    if state["status"] != "ready":
        raise RuntimeError(f"execute ended {state['status']}: {state.get('lastErrorMessage')}")
    phases["execute"] = time.perf_counter() - mark
    mark = time.perf_counter()
    await driver.cleanup()
    state = await driver.wait_until({"cleaned", "cleanup-failed"}, timeout=1800.0)
    if state["status"] != "cleaned":
        raise RuntimeError(f"cleanup ended {state['status']}: {state.get('lastErrorMessage')}")
    phases["cleanup"] = time.perf_counter() - mark
    phases["total"] = time.perf_counter() - started
    run.phases = phases
    run.restores += 1


async def run_all(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Every size in order, on one agent; the figures as one dict."""
    runs: list[SizeRun] = []
    with (work / "corestore.log").open("wb") as log:
        async with (
            corestore_process(work, log) as corestore,
            cloudly_for(corestore, args.form) as cloudly,
            agent_process(
                "agent",
                ["agent", "run"],
                work / "agent",
                cloudly,
                chunk_mib=args.chunk_mib,
                window=16,
                checkout=args.checkout,
            ) as agent,
        ):
            pids = {"agent": agent.pid, "corestore": corestore.process.pid}
            for objects in args.sizes:
                runs.append(await measure_size(args, cloudly, corestore, pids, objects))
    smallest, largest = runs[0], runs[-1]
    return {
        "args": {k: str(v) for k, v in vars(args).items() if k != "json"},
        "sizes": [run.summary() for run in runs],
        "ratio": largest.cpu_ms_per_object / smallest.cpu_ms_per_object,
    }


async def measure_size(
    args: argparse.Namespace,
    cloudly: StandInCloudly,
    corestore: Corestore,
    pids: dict[str, int],
    objects: int,
) -> SizeRun:
    """Restore the archive as `objects` objects (the smallest size `--small-repeat` times)."""
    run = SizeRun(objects, args.total_bytes // objects)
    repeat = args.small_repeat if objects == args.sizes[0] else 1
    say(f"{objects} objects of {run.object_bytes} bytes, {repeat} restore(s)")
    for index in range(repeat):
        plan = archive(f"bench-manifest-{objects}-{index}", objects, args.total_bytes)
        await restore_once(cloudly, plan, pids, run, args.status_interval_ms / 1000)
        drop_archive(corestore, plan)
        say(f"  restore {index + 1}: {run.phases['total']:.1f} s, {run.cpu_ms_per_object:.2f} ms")
    return run


def drop_archive(corestore: Corestore, plan: RestorePlan) -> None:
    """What a cleaned restore may leave of the bench's own temporary Corestore."""
    shutil.rmtree(corestore.data_dir / "staging" / plan.staging_archive_id, ignore_errors=True)


def report(results: dict[str, Any], command: str, elapsed: float) -> list[str]:
    """The figures as markdown lines (what docs/benchmarks.md quotes)."""
    facts = results["machine"]
    lines = [
        f"command: `{command}`",
        "",
        f"machine: nproc {facts['nproc']}, {facts['cpu']}, Linux {facts['kernel']}, "
        f"Python {facts['python']}; wall time {elapsed:.0f} s",
        "",
        "| objects | bytes each | restores | agent CPU ms/object | Corestore CPU ms/object "
        "| stage p50 ms | stage p99 ms | status p50 ms | status p99 ms (count) "
        "| prepare agent CPU s |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for size in results["sizes"]:
        lines.append(
            f"| {size['objects']} | {size['object_bytes']} | {size['restores']} "
            f"| {size['agent_cpu_ms_per_object']:.2f} | {size['corestore_cpu_ms_per_object']:.2f} "
            f"| {size['stage_p50_ms']:.1f} | {size['stage_p99_ms']:.1f} "
            f"| {size['status_p50_ms']:.1f} | {size['status_p99_ms']:.1f} "
            f"({size['status_count']}) | {size['prepare_agent_cpu_s']:.2f} |"
        )
    largest = results["sizes"][-1]
    phases = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in largest["phases_s"].items())
    smallest = results["sizes"][0]
    lines += [
        "",
        f"whole {largest['objects']}-object restore: {phases}",
        "",
        f"per-object overhead {largest['objects']}/{smallest['objects']}: {results['ratio']:.2f}",
    ]
    return lines


def main(argv: list[str] | None = None) -> None:
    """Parse the flags, measure every size, print the figures."""
    args = parse(argv)
    configure_logging("console", "warning", sys.stderr)
    quiet_stand_in_logs()
    command = " ".join([".venv/bin/python -m bench.manifest", *(argv or sys.argv[1:])])
    started = time.perf_counter()
    with work_directory("manifest", args.dir, keep=args.keep) as work:
        results = asyncio.run(run_all(args, work))
    results["machine"] = machine_facts()
    results["command"] = command
    print("\n".join(report(results, command, time.perf_counter() - started)))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
