"""Memory comes back: an agent's resident size fresh, after refused frames, and after work.

For each tree (this checkout, and `--baseline-root DIR` with its own `.venv` when given), in
turn, one `python -m agent run` against a reference Corestore and the stand-in Cloudly in this
process:

1. **fresh idle**: VmRSS once connected and `--settle-s` seconds quiet;
2. **refused frames**: `--refused` stages at once, each sent one Buffer-form chunk frame of
   `--refused-mib` MiB whose array holds no bytes (`1000,1000,...`): the agent takes each frame,
   decodes it, refuses it (the stream breaks, the stage fails). Reported: the peak above the
   idle before (VmHWM reset first, 20 ms samples) and what is still held `--kept-s` seconds
   after the last refusal; `--refused-rounds` rounds;
3. **idle after work**: one `--mib` MiB Buffer-form stage (replayed as typedrequest 3.3.0
   sends it), then VmRSS `--kept-s` and `--after-s` seconds after it ended, against fresh idle.

    .venv/bin/python -m bench.memory [--baseline-root DIR] [--refused 8] [--refused-mib 15]
        [--refused-rounds 3] [--mib 256] [--kept-s 5] [--after-s 30] [--json out.json]

Targets (issue 25): 8 refused 15 MiB frames keep <= 30 MiB after 5 s; idle after work within
20 MiB of fresh idle (after 30 s).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from agent.errors import CallFailed
from agent.log import configure_logging
from agent.protocol.connection import ConnectionSettings
from bench._initiator import ChunkSet
from bench._procstat import machine_facts, memory_kib
from bench._replay import replay_stage
from bench._staging_runs import RssSampler, reset_peak_rss
from bench._staging_world import (
    CLUSTER,
    NODE,
    ROOT,
    TOKEN,
    BenchObject,
    agent_process,
    corestore_process,
    plan_for,
)
from devstack.cloudly import StandInCloudly, cluster_document
from devstack.driver import RestoreDriver

__all__ = ["main"]

MiB = 2**20
SEED = "memory"


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def rss_mib(pid: int) -> float:
    return round(memory_kib(pid)[0] / 1024, 1)


def bad_frame(mib: int) -> bytes:
    """A Buffer-form chunk whose array is `mib` MiB of `1000,` (no byte fits it)."""
    count = mib * MiB // 5
    return b'{"type":"Buffer","data":[' + b"1000," * (count - 1) + b"1000]}"


async def refused_round(
    cloudly: StandInCloudly, pid: int, count: int, frame: bytes, names: list[str], kept_s: float
) -> dict[str, float]:
    """`count` stages at once, each refused at its one bad chunk frame."""
    obj = BenchObject.make(MiB, MiB, seed=SEED.encode())
    drivers = []
    for _ in range(count):
        names.append(f"refused-{len(names)}")
        driver = RestoreDriver(cloudly, plan_for(names[-1], obj, NODE), call_timeout=600.0)
        await driver.prepare()
        drivers.append(driver)
    idle = memory_kib(pid)[0]
    reset = reset_peak_rss(pid)
    sampler = RssSampler(pid, 0.02)
    stop = asyncio.Event()
    refused = 0

    async def one(driver: RestoreDriver) -> None:
        nonlocal refused
        try:
            await replay_stage(
                cloudly,
                driver,
                driver.plan.objects[0],
                chunk_json=(frame,),
                chunk_size=MiB,
                probe_interval=0.05,
                timeout=600.0,
            )
        except (CallFailed, RuntimeError):
            refused += 1

    async with asyncio.TaskGroup() as group:
        group.create_task(sampler.run(stop))
        try:
            await asyncio.gather(*(one(driver) for driver in drivers))
        finally:
            stop.set()
    peak = max(sampler.peak_kib, memory_kib(pid)[1]) if reset else sampler.peak_kib
    await asyncio.sleep(kept_s)
    kept = memory_kib(pid)[0]
    return {
        "refused": refused,
        "idle_mib": round(idle / 1024, 1),
        "peak_above_mib": round((peak - idle) / 1024, 1),
        "kept_above_mib": round((kept - idle) / 1024, 1),
    }


async def run_tree(args: argparse.Namespace, work: Path, tree: str, root: Path) -> dict[str, Any]:
    chunks = ChunkSet.generate(SEED, MiB, 4)
    chunk_json = chunks.encode("buffer")
    obj = BenchObject.make(args.mib * MiB, 4 * MiB, seed=SEED.encode())
    names: list[str] = []
    result: dict[str, Any] = {"tree": tree}
    async with contextlib.AsyncExitStack() as stack:
        log = stack.enter_context((work / f"{tree}-children.log").open("wb"))
        corestore = await stack.enter_async_context(corestore_process(work, log, name=f"cs-{tree}"))
        document = cluster_document(CLUSTER, {NODE: corestore.url})
        cloudly = await stack.enter_async_context(
            StandInCloudly(token=TOKEN, cluster=document, peer_settings=ConnectionSettings())
        )
        child = await stack.enter_async_context(
            agent_process(tree, ["agent", "run"], work / tree, cloudly, chunk_mib=4, window=16,
                          checkout=root)
        )  # fmt: skip
        pid = child.pid
        await asyncio.sleep(args.settle_s)
        result["fresh_idle_mib"] = fresh = rss_mib(pid)
        say(f"{tree}: fresh idle {fresh} MiB")
        frame = bad_frame(args.refused_mib)
        rounds = []
        for number in range(args.refused_rounds):
            outcome = await refused_round(cloudly, pid, args.refused, frame, names, args.kept_s)
            say(f"{tree}: refused round {number + 1}: {outcome}")
            rounds.append(outcome)
        result["refused"] = rounds
        say(f"{tree}: one {args.mib} MiB stage ...")
        names.append("work")
        driver = RestoreDriver(cloudly, plan_for("work", obj, NODE), call_timeout=3600.0)
        await driver.prepare()
        idle_before = rss_mib(pid)
        started = time.perf_counter()
        await replay_stage(
            cloudly,
            driver,
            driver.plan.objects[0],
            chunk_json=chunk_json,
            chunk_size=MiB,
            probe_interval=0.05,
            timeout=3600.0,
        )
        result["work_s"] = round(time.perf_counter() - started, 1)
        result["idle_before_work_mib"] = idle_before
        _, hwm = memory_kib(pid)
        result["work_hwm_mib"] = round(hwm / 1024, 1)
        await asyncio.sleep(args.kept_s)
        result["after_work_kept_s_mib"] = rss_mib(pid)
        await asyncio.sleep(max(0.0, args.after_s - args.kept_s))
        result["after_work_mib"] = after = rss_mib(pid)
        result["after_work_above_fresh_mib"] = round(after - fresh, 1)
        say(f"{tree}: idle after work {after} MiB ({after - fresh:+.1f} against fresh)")
        for name in names:
            shutil.rmtree(corestore.data_dir / "staging" / f"staging-{name}", ignore_errors=True)
    return result


def report(results: list[dict[str, Any]], facts: dict[str, str], args: argparse.Namespace) -> None:
    print("\nmachine: " + ", ".join(f"{k} {v}" for k, v in facts.items()))
    print(
        f"{args.refused} refused chunk frames of {args.refused_mib} MiB at once, "
        f"{args.refused_rounds} rounds; a {args.mib} MiB Buffer-form stage; kept after "
        f"{args.kept_s:g} s, idle after {args.after_s:g} s\n"
    )
    print(
        "| tree | fresh idle MiB | refused: peak above idle MiB (rounds) | refused: kept after "
        f"{args.kept_s:g} s MiB (rounds) | idle after work, {args.kept_s:g} s / {args.after_s:g} "
        "s MiB | after work above fresh MiB |"
    )
    print("|---|---:|---|---|---|---:|")
    for result in results:
        peaks = ", ".join(str(r["peak_above_mib"]) for r in result["refused"])
        kept = ", ".join(str(r["kept_above_mib"]) for r in result["refused"])
        print(
            f"| {result['tree']} | {result['fresh_idle_mib']} | {peaks} | {kept} | "
            f"{result['after_work_kept_s_mib']} / {result['after_work_mib']} | "
            f"{result['after_work_above_fresh_mib']} |"
        )
    print("\ntargets:")
    for result in results:
        worst_kept = max(r["kept_above_mib"] for r in result["refused"])
        verdicts = {
            f"refused frames keep <= 30 MiB after {args.kept_s:g} s": worst_kept <= 30,
            "idle after work within 20 MiB of fresh idle": result["after_work_above_fresh_mib"]
            <= 20,
        }
        for name, ok in verdicts.items():
            print(f"  {'PASS' if ok else 'MISS'}  {result['tree']}: {name}")
        result["targets"] = verdicts


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-root", type=Path, default=None)
    parser.add_argument("--refused", type=int, default=8)
    parser.add_argument("--refused-mib", type=int, default=15)
    parser.add_argument("--refused-rounds", type=int, default=3)
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--settle-s", type=float, default=3.0)
    parser.add_argument("--kept-s", type=float, default=5.0)
    parser.add_argument("--after-s", type=float, default=30.0)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    configure_logging("console", "warning", sys.stderr)
    facts = machine_facts()
    facts["loadavg_at_start"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    work = Path(tempfile.mkdtemp(prefix="bench-memory-", dir=args.dir))
    trees = [("agent", ROOT)]
    if args.baseline_root is not None:
        trees.append(("old agent", args.baseline_root.resolve()))
    try:
        results = [
            asyncio.run(run_tree(args, work, name.replace(" ", "-"), root)) for name, root in trees
        ]
    finally:
        shutil.rmtree(work, ignore_errors=True)
    facts["loadavg_at_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    report(results, facts, args)
    if args.json is not None:
        args.json.write_text(json.dumps({"machine": facts, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
