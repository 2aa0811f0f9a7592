"""A whole cluster at once: one relay agent staging `--streams` objects concurrently across
`--nodes` nodes, each node's Corestore its own reference Corestore process (`--corestores`;
fewer than nodes: node i uses Corestore i mod N, one process serving several node ids).

One `python -m agent run` holds one session to the stand-in Cloudly (this process); every
stage is its own restore of one `--mib` MiB object on its node, its stream replayed as
typedrequest 3.3.0's initiator sends it (bench/_replay.py: 1 MiB chunk frames, one in flight
per stream, so `--streams` frames in flight on the session). Measured in one run:

1. **single**: `--singles` stages alone, one after another; the median by MB/s is the
   single-stream figure (each is reported: one stage alone swings with the reference
   Corestore's own CPU per GiB, measured 3.4 to 6.4 s, which the aggregate averages out);
2. **cluster**: all `--streams` stages at once, a status round-trip fired every
   `--status-interval-ms` meanwhile, the agent's RSS sampled every 20 ms:
   - aggregate MB/s = all bytes / (first chunk sent -> last stage answered), against single;
   - fairness = the slowest stream's MB/s / the mean stream's MB/s (each stream's own span);
   - memory: peak RSS above idle against the stated bound, per stream
     `window_bytes` (queued frames) + `window` x 1 MiB chunks decoded + `(max_in_flight + 2) x
     chunk_size` (staging), times the streams;
   - status p50/p99/max.

    .venv/bin/python -m bench.cluster [--quick] [--streams 16] [--nodes 8] [--corestores 8]
        [--mib 256] [--form buffer] [--singles 3] [--max-transfers-per-node N]
        [--max-bytes-per-s-per-node B] [--receive-budget-mib M] [--flood N] [--pollers 8]
        [--agent-root DIR] [--json out.json]

`--agent-root DIR` runs the agent of another checkout (its own `.venv`) under this bench: an
older tree measured by the same driver, "before" beside "after".

`--flood N` (issue 34): N stages at once on ONE node (node-1, each its own restore of one
object), beside `--pollers` other nodes (node-2 ...), each polled for its restore's status
every `--status-interval-ms`; `--streams` and `--nodes` are not used. The node's stages move
`max_transfers_per_node` at a time, the rest wait their turn with their stream held.

Control (issue 34): the status polls are control requests; a poll the agent answers `retry`
five times over fails, and is counted (`status refused`), never the end of the run. The agent's
own count of control requests it deferred (its /metrics, `..._request_class_deferred_total`)
is read before and after the phase (None: an agent older than the request classes).
Fairness among streams of equal standing (issue 34). A stage moves once it holds its place on
its node and its buffers of the byte budget; until then it waits its turn holding nothing, its
stream held (its MB/s counts from its first chunk). Streams of equal standing are those moving
at the same time: `fairness_at_once` is, over every stream, the smallest ratio of its MB/s to
the mean MB/s of the streams whose moving span shares at least half of the shorter span with
its own. The slowest / mean over the whole run (`fairness`, each stream's own span) and per
Corestore (node i uses Corestore i mod `--corestores`) are given beside it.

`--nodes 1 --corestores 1 --max-transfers-per-node 4` points every stream at one node: four
move at once, the others wait their turn with their stream held (the replay probes every
`--probe-ms` until the agent lets it send); each stream's MB/s counts from its first chunk
sent, its wait before that is reported apart (`waited`). The limits and the receive budget
default to the agent's own when left out (an agent older than them gets none of the keys).

Targets (issue 34, at every size): no control request refused, status p99 <= 50 ms, peak
<= the byte budget (64 MiB) + 40 MiB above idle, aggregate >= 0.9x single, fairness >= 0.9.
Targets (issue 11): aggregate >= 0.8x single, slowest >= 0.5x mean, memory within the bound;
(issue 17) status p99 <= 100 ms; (issue 25, one byte budget) aggregate >= 0.9x single, peak
<= 100 MiB above idle, status p99 <= 50 ms. The per-stream bound is the tree's own before the
byte budget; with it the agent's bound is the budget (docs/operations.md, "Memory").
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.log import configure_logging
from agent.protocol.connection import ConnectionSettings
from agent.transfers.budget import DEFAULT_BUDGET_BYTES
from bench._control import ControlProbe, deferred_control, merge
from bench._initiator import ChunkSet
from bench._procstat import machine_facts, memory_kib
from bench._replay import ReplayResult, replay_stage
from bench._staging_runs import AgentMetrics, CpuMeter, RssSampler, reset_peak_rss
from bench._staging_world import (
    CLUSTER,
    ROOT,
    TOKEN,
    BenchObject,
    Corestore,
    agent_process,
    corestore_process,
    plan_for,
)
from devstack.cloudly import StandInCloudly, cluster_document
from devstack.driver import METHOD_GET_STATUS, RestoreDriver, RestorePlan

__all__ = ["fairness_at_once", "main", "parse"]

MiB = 2**20
GiB = 2**30
SEED = "cluster"
FRAME_CHUNK = MiB


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


async def prepare_all(cloudly: StandInCloudly, plans: list[RestorePlan]) -> list[RestoreDriver]:
    """A driver per plan, every restore prepared (concurrently)."""
    drivers = [RestoreDriver(cloudly, plan, call_timeout=3600.0) for plan in plans]
    async with asyncio.TaskGroup() as group:
        for driver in drivers:
            group.create_task(driver.prepare())
    return drivers


async def stage_all(
    cloudly: StandInCloudly,
    drivers: list[RestoreDriver],
    chunk_json: tuple[bytes, ...],
    probe_ms: float,
    done: Callable[[RestorePlan], None] = lambda plan: None,
) -> tuple[list[ReplayResult], float, list[tuple[float, float]]]:
    """Replay every driver's stage at once; (results, wall seconds from the start of the first
    to the last answer, each stage's moving span: first chunk sent -> answered, in seconds
    from the start). `done(plan)` as each stage is answered (its staged bytes may go)."""
    started = time.perf_counter()
    ends: dict[int, float] = {}

    async def one(index: int, driver: RestoreDriver) -> ReplayResult:
        result = await replay_stage(
            cloudly,
            driver,
            driver.plan.objects[0],
            chunk_json=chunk_json,
            chunk_size=FRAME_CHUNK,
            probe_interval=probe_ms / 1000,
            timeout=3600.0,
        )
        ends[index] = time.perf_counter() - started
        done(driver.plan)
        return result

    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(one(i, driver)) for i, driver in enumerate(drivers)]
    wall = time.perf_counter() - started
    results = [task.result() for task in tasks]
    spans = [(ends[i] - r.seconds, ends[i]) for i, r in enumerate(results)]
    return results, wall, spans


def fairness_at_once(spans: list[tuple[float, float]], rates: list[float]) -> float:
    """The slowest stream against the streams moving at the same time as it: for each stream,
    its MB/s over the mean MB/s of the streams whose moving span shares at least half of the
    shorter of the two spans with its own (itself among them); the smallest such ratio."""
    worst = 1.0
    for (start, end), rate in zip(spans, rates, strict=True):
        peers = [
            other
            for (s, e), other in zip(spans, rates, strict=True)
            if min(end, e) - max(start, s) >= 0.5 * min(end - start, e - s)
        ]
        worst = min(worst, rate / statistics.mean(peers))
    return worst


async def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    chunks = ChunkSet.generate(SEED, FRAME_CHUNK, 4)
    chunk_json = chunks.encode(args.form)
    obj = BenchObject.make(args.mib * MiB, args.chunk_mib * MiB, seed=SEED.encode())
    nodes = [f"node-{i + 1}" for i in range(args.nodes)]
    counter = 0

    def plans(count: int, on: list[str] | None = None) -> list[RestorePlan]:
        nonlocal counter
        made, among = [], on or nodes
        for index in range(count):
            counter += 1
            made.append(plan_for(f"cluster-{counter}", obj, among[index % len(among)]))
        return made

    async with contextlib.AsyncExitStack() as stack:
        log = stack.enter_context((work / "children.log").open("wb"))
        corestores: list[Corestore] = [
            await stack.enter_async_context(corestore_process(work, log, name=f"cs-{i}"))
            for i in range(args.corestores)
        ]
        document = cluster_document(
            CLUSTER, {node: corestores[i % len(corestores)].url for i, node in enumerate(nodes)}
        )
        cloudly = await stack.enter_async_context(
            StandInCloudly(token=TOKEN, cluster=document, peer_settings=ConnectionSettings())
        )
        child = await stack.enter_async_context(
            agent_process(
                "agent",
                ["agent", "run"],
                work / "agent",
                cloudly,
                chunk_mib=args.chunk_mib,
                window=args.window,
                max_in_flight=args.max_in_flight,
                window_bytes=args.window_mib * MiB,
                corestore=_limits(args),
                checkout=args.agent_root,
                streams=(
                    {}
                    if args.receive_budget_mib is None
                    else {"receive_budget_bytes": args.receive_budget_mib * MiB}
                ),
            )
        )
        pids = {"agent": child.pid, **{f"cs{i}": c.process.pid for i, c in enumerate(corestores)}}

        def drop(done: list[RestorePlan]) -> None:
            for plan in done:
                for corestore in corestores:
                    shutil.rmtree(
                        corestore.data_dir / "staging" / plan.staging_archive_id,
                        ignore_errors=True,
                    )

        def drop_one(plan: RestorePlan) -> None:
            # A stage answered holds its object in its Corestore's staging until dropped: gone
            # at once, 256 stages of 256 MiB never lie on the disk together.
            drop([plan])

        say("warm-up ...")
        warm = plans(1)
        await stage_all(cloudly, await prepare_all(cloudly, warm), chunk_json, args.probe_ms)
        drop(warm)

        singles: list[tuple[ReplayResult, float, dict[str, float]]] = []
        for turn in range(args.singles):
            say(f"one stream alone ({turn + 1} of {args.singles}) ...")
            single_plans = plans(1)
            drivers = await prepare_all(cloudly, single_plans)
            meter = CpuMeter(pids)
            [alone], alone_wall, _ = await stage_all(cloudly, drivers, chunk_json, args.probe_ms)
            singles.append((alone, alone_wall, meter.spent()))
            drop(single_plans)
        # The median stage by MB/s is "single": one stage alone swings with the reference
        # Corestore's own CPU per GiB (3.4 to 6.4 s measured), the aggregate does not.
        single, single_wall, single_cpu = sorted(singles, key=lambda s: s[0].mb_per_s)[
            len(singles) // 2
        ]

        if args.flood:
            say(f"{args.flood} stages at once on {nodes[0]}, {args.pollers} other nodes polled ...")
            many = plans(args.flood, on=nodes[:1])
            polled = plans(args.pollers, on=nodes[1:])
            await prepare_all(cloudly, polled)
        else:
            say(f"{args.streams} streams at once across {args.nodes} nodes ...")
            many = plans(args.streams)
            polled = many[:1]
        drivers = await prepare_all(cloudly, many)
        idle_rss, _ = memory_kib(child.pid)
        reset = reset_peak_rss(child.pid)
        sampler = RssSampler(child.pid, 0.02)
        probes = [
            ControlProbe(
                RestoreDriver(cloudly, plan, call_timeout=60.0), args.status_interval_ms / 1000
            )
            for plan in polled
        ]
        metrics = AgentMetrics.from_log(child.log_path)
        deferred_before = None if metrics is None else await deferred_control(metrics)
        if metrics is not None:
            await metrics.start()
        stop = asyncio.Event()
        async with asyncio.TaskGroup() as group:
            group.create_task(sampler.run(stop))
            for probe in probes:
                group.create_task(probe.run(stop))
            meter = CpuMeter(pids)
            try:
                results, wall, spans = await stage_all(
                    cloudly, drivers, chunk_json, args.probe_ms, drop_one
                )
            finally:
                cpu = meter.spent()
                stop.set()
        _, hwm = memory_kib(child.pid)
        agent_side = None if metrics is None else await metrics.since_start(METHOD_GET_STATUS)
        deferred_after = None if metrics is None else await deferred_control(metrics)
        deferred = (
            None
            if deferred_before is None or deferred_after is None
            else deferred_after - deferred_before
        )
        peak = max(sampler.peak_kib, hwm) if reset else sampler.peak_kib
        drop(many)

    total = sum(r.bytes for r in results)
    rates = [r.mb_per_s for r in results]
    aggregate = total / 1e6 / wall
    mean = statistics.mean(rates)
    by_corestore: dict[int, list[float]] = {}
    for plan, rate in zip(many, rates, strict=True):
        by_corestore.setdefault(nodes.index(plan.node) % args.corestores, []).append(rate)
    status = merge(probes)
    per_stream_bound = args.window_mib + args.window + (args.max_in_flight + 2) * args.chunk_mib
    return {
        "single": {
            "mb_per_s": round(single.mb_per_s, 1),
            "each_mb_per_s": [round(alone.mb_per_s, 1) for alone, _, _ in singles],
            "wall_s": round(single_wall, 2),
            "cpu_s_per_gib": {k: round(v / (single.bytes / GiB), 2) for k, v in single_cpu.items()},
        },
        "cluster": {
            "streams": len(results),
            "nodes": args.nodes,
            "corestores": args.corestores,
            "bytes": total,
            "wall_s": round(wall, 2),
            "aggregate_mb_per_s": round(aggregate, 1),
            "aggregate_over_single": round(aggregate / single.mb_per_s, 2),
            "stream_mb_per_s": [round(r, 1) for r in rates],
            "mean_mb_per_s": round(mean, 1),
            "slowest_mb_per_s": round(min(rates), 1),
            "fairness": round(min(rates) / mean, 2),
            "fairness_at_once": round(fairness_at_once(spans, rates), 2),
            "waited_s": [round(r.waited + r.longest_pause, 2) for r in results],
            "moving_mb_per_s": [round(r.moving_mb_per_s, 1) for r in results],
            "moving_fairness": round(
                min(r.moving_mb_per_s for r in results)
                / statistics.mean(r.moving_mb_per_s for r in results),
                2,
            ),
            "cpu_s_per_gib": {k: round(v / (total / GiB), 2) for k, v in cpu.items()},
            "idle_rss_mib": round(idle_rss / 1024, 1),
            "peak_rss_mib": round(peak / 1024, 1),
            "rss_above_idle_mib": round((peak - idle_rss) / 1024, 1),
            "memory_bound_mib": per_stream_bound * len(results),
            "per_stream_bound_mib": per_stream_bound,
            "hwm_reset": reset,
            "status": status,
            "control_deferred": deferred,
            "fairness_by_corestore": {
                str(cs): round(min(each) / statistics.mean(each), 2)
                for cs, each in sorted(by_corestore.items())
            },
            "flood": args.flood,
            "pollers": len(probes),
            "budget_mib": DEFAULT_BUDGET_BYTES // MiB,
            "agent_side": agent_side,
        },
    }


def _within(buckets: dict[str, int]) -> str:
    """A histogram's cumulative buckets as "5 ms 90 %, 10 ms 99 %, ..." of its count."""
    total = buckets.get("+Inf", 0)
    if not total:
        return "(none)"
    bounds = sorted((float(le), count) for le, count in buckets.items() if le != "+Inf")
    shown = [f"{bound * 1000:g} ms {100 * count / total:.1f} %" for bound, count in bounds[:6]]
    return f"{', '.join(shown)} of {total}"


def _limits(args: argparse.Namespace) -> dict[str, int]:
    """The `[corestore]` keys of the per-node transfer limits given on the command line."""
    limits = {}
    if args.max_transfers_per_node is not None:
        limits["max_transfers_per_node"] = args.max_transfers_per_node
    if args.max_bytes_per_s_per_node is not None:
        limits["max_bytes_per_s_per_node"] = args.max_bytes_per_s_per_node
    return limits


def report(result: dict[str, Any], facts: dict[str, str], args: argparse.Namespace) -> None:
    single, cluster = result["single"], result["cluster"]
    print("\nmachine: " + ", ".join(f"{k} {v}" for k, v in facts.items()))
    if args.agent_root != ROOT:
        print(f"agent: the checkout at {args.agent_root} (its own .venv)")
    limits = ", ".join(f"{k} {v}" for k, v in _limits(args).items()) or "default limits"
    budget = "default" if args.receive_budget_mib is None else f"{args.receive_budget_mib} MiB"
    print(
        f"{cluster['streams']} streams x {args.mib} MiB, {args.form} form, {args.nodes} nodes on "
        f"{args.corestores} reference Corestores; agent chunk {args.chunk_mib} MiB, "
        f"max_in_flight {args.max_in_flight}, window {args.window} / {args.window_mib} MiB; "
        f"{limits}; receive budget {budget}\n"
    )
    print("| | MB/s | wall s | CPU s/GiB |\n|---|---:|---:|---|")
    cpu1 = ", ".join(f"{k} {v}" for k, v in single["cpu_s_per_gib"].items())
    print(f"| one stream alone (median) | {single['mb_per_s']} | {single['wall_s']} | {cpu1} |")
    cpu = ", ".join(f"{k} {v}" for k, v in cluster["cpu_s_per_gib"].items())
    print(
        f"| {cluster['streams']} at once (aggregate) | {cluster['aggregate_mb_per_s']} "
        f"| {cluster['wall_s']} | {cpu} |"
    )
    status = cluster["status"]
    each = single["each_mb_per_s"]
    if cluster["flood"]:
        print(
            f"flood: {cluster['flood']} stages at once on one node, {cluster['pollers']} other "
            "nodes polled for their status"
        )
    print(
        f"\none stream alone, each of {len(each)} stages: {each} MB/s; aggregate over the "
        f"slowest {cluster['aggregate_mb_per_s'] / min(each):.2f}, over the fastest "
        f"{cluster['aggregate_mb_per_s'] / max(each):.2f}"
    )
    print(
        f"aggregate / single {cluster['aggregate_over_single']}; streams MB/s mean "
        f"{cluster['mean_mb_per_s']}, slowest {cluster['slowest_mb_per_s']} (fairness "
        f"{cluster['fairness']}); per stream: {cluster['stream_mb_per_s']}"
    )
    waited = sorted(cluster["waited_s"])
    print(
        f"waited (before the first chunk + the longest pause): median "
        f"{statistics.median(waited):.2f} s, longest {waited[-1]:.2f} s "
        f"({sum(1 for w in waited if w >= 1.0)} streams 1 s or more); without its longest "
        f"pause each stream moved at {cluster['moving_mb_per_s']} MB/s (slowest / mean "
        f"{cluster['moving_fairness']})"
    )
    print(
        f"RSS idle {cluster['idle_rss_mib']} MiB, peak {cluster['peak_rss_mib']} MiB, above idle "
        f"{cluster['rss_above_idle_mib']} MiB; stated bound {cluster['memory_bound_mib']} MiB "
        f"({cluster['per_stream_bound_mib']} MiB per stream)"
    )
    print(
        f"status during the stages: n {status.get('count')}, p50 {status.get('p50_ms', 0):.1f} ms, "
        f"p99 {status.get('p99_ms', 0):.1f} ms, max {status.get('max_ms', 0):.1f} ms; refused "
        f"(five retry answers in a row) {status['refused']}; control requests the agent "
        f"deferred {cluster['control_deferred']}"
    )
    print(
        f"slowest / mean per Corestore: {cluster['fairness_by_corestore']}; against the streams "
        f"moving at the same time: {cluster['fairness_at_once']}"
    )
    agent_side = cluster.get("agent_side")
    if agent_side:
        answered = _within(agent_side["status"])
        lag = _within(agent_side["loop_lag"])
        print(
            "the agent's own account of the same phase (its /metrics): status answered, once "
            f"read, within {answered}; its event loop woke late by at most {lag}"
        )
    fairness = cluster["fairness_at_once"]
    above = cluster["rss_above_idle_mib"]
    verdicts = {
        # issue 34, at every size
        "no control request refused": status["refused"] == 0 and not cluster["control_deferred"],
        "peak <= byte budget + 40 MiB above idle": above <= cluster["budget_mib"] + 40,
        "fairness >= 0.9 (among the streams moving at once)": fairness >= 0.9,
        "aggregate >= 0.8x single": cluster["aggregate_over_single"] >= 0.8,
        "slowest >= 0.5x mean": cluster["fairness"] >= 0.5,
        "memory within the bound": cluster["rss_above_idle_mib"] <= cluster["memory_bound_mib"],
        "status p99 <= 100 ms": status.get("p99_ms", 0) <= 100,
        # issue 25: one byte budget for the whole agent
        "aggregate >= 0.9x single": cluster["aggregate_over_single"] >= 0.9,
        "peak <= 100 MiB above idle": cluster["rss_above_idle_mib"] <= 100,
        "status p99 <= 50 ms": status.get("p99_ms", 0) <= 50,
    }
    print("\ntargets:")
    for name, ok in verdicts.items():
        print(f"  {'PASS' if ok else 'MISS'}  {name}")
    result["targets"] = verdicts


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line's options, checked (what `main` runs with)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: 4 streams, 2 nodes")
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--corestores", type=int, default=8)
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--form", default="buffer", choices=["buffer", "base64"])
    parser.add_argument("--chunk-mib", type=int, default=4)
    parser.add_argument("--max-in-flight", type=int, default=4)
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--window-mib", type=int, default=8)
    parser.add_argument(
        "--singles", type=int, default=3, help="stages alone; the median one is 'single'"
    )
    parser.add_argument("--probe-ms", type=float, default=50.0)
    parser.add_argument("--status-interval-ms", type=float, default=20.0)
    parser.add_argument(
        "--max-transfers-per-node", type=int, default=None, help="the agent's default if left out"
    )
    parser.add_argument("--max-bytes-per-s-per-node", type=int, default=None)
    parser.add_argument(
        "--receive-budget-mib", type=int, default=None, help="the agent's default if left out"
    )
    parser.add_argument("--flood", type=int, default=0, help="N stages at once on one node")
    parser.add_argument("--pollers", type=int, default=8, help="with --flood: nodes polled")
    parser.add_argument(
        "--agent-root",
        type=Path,
        default=ROOT,
        help="the checkout whose agent runs, with its own .venv (an older tree: 'before')",
    )
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.singles < 1:
        parser.error("--singles must be at least 1")
    if args.flood < 0 or args.pollers < 1:
        parser.error("--flood must not be negative, --pollers at least 1")
    if args.flood:
        args.nodes = args.pollers + 1
    if args.quick:
        args.streams, args.nodes, args.corestores, args.mib = 4, 2, 2, 16
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    configure_logging("console", "warning", sys.stderr)
    facts = machine_facts()
    facts["loadavg_at_start"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    work = Path(tempfile.mkdtemp(prefix="bench-cluster-", dir=args.dir))
    try:
        result = asyncio.run(run(args, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    facts["loadavg_at_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    report(result, facts, args)
    if args.json is not None:
        args.json.write_text(json.dumps({"machine": facts, **result}, indent=2) + "\n")


if __name__ == "__main__":
    main()
