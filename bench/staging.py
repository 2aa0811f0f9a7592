"""Isolated-restore staging benchmarks: throughput vs a pass-through baseline, RSS, status, CAS.

One run, on this machine, four figures:

1. Staging throughput, stand-in Cloudly stream -> agent -> reference Corestore, one object of
   `--mib` MiB, per chunk form (`--forms`, default base64 and Buffer), against the pass-through
   baseline (bench/_staging_passthrough.py: the same composition root, session, stream window,
   rechunking and Corestore client, but no sha256 and no store) measured in the same run:
   one `--warmup-mib` warm-up stage per child, then `--repeat` pairs alternating which goes
   first. Reported: MB/s of both (first chunk written -> reply; both replies come after
   Corestore's commit), the ratio of the medians agent/baseline (target >= 0.8), the baseline
   without Corestore's commit too, and CPU s/GiB of the child, Corestore and Cloudly.
2. Peak RSS of the agent process (`python -m agent run --config F`, a fresh one) while staging
   `--rss-mib` MiB in `--rss-form`: idle VmRSS after connect + prepare, VmHWM reset
   (`clear_refs` 5) before the stage, peak = max(VmHWM after, VmRSS sampled every 20 ms);
   target <= 100 MiB above idle.
3. Status round-trips (`coreflowGetIsolatedRestoreStatus` from the stand-in, one in flight,
   every `--status-interval-ms`) while a stage runs on the same session: during the RSS stage,
   and during an extra `--status-mib` MiB stage in `--status-form`; p50/p99/max ms and count.
4. Durable CAS mutations/s of the revision store (bench/cas.py's `measure`).

Cloudly's side is `devstack.driver.RestoreDriver` on a `StandInCloudly` in this process
(objects: `_staging_world.CycledObject`); the reference Corestore and the agent (or the
baseline) run as their own processes, all on 127.0.0.1. The work directory (configs, logs,
state, Corestore data) goes under `--dir` (default: the system temp dir), never the repository.
Run from the repository root:

    .venv/bin/python -m bench.staging [--quick] [--mib 512] [--rss-mib 2048] [--status-mib 512]
        [--forms base64,buffer] [--repeat 3] [--piece-kib 1024] [--json out.json] [--keep]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

from agent.corestore.client import CorestoreClient
from agent.log import configure_logging
from agent.protocol.chunks import ChunkForm
from agent.protocol.connection import ConnectionSettings, StreamSettings
from agent.secret import Secret
from bench._procstat import machine_facts, memory_kib
from bench._staging_report import report
from bench._staging_runs import (
    RssSampler,
    StageRun,
    StatusProbe,
    reset_peak_rss,
    stage_agent,
    stage_baseline,
)
from bench._staging_world import (
    BEARER,
    CLUSTER,
    NODE,
    TOKEN,
    AgentProcess,
    BenchObject,
    Corestore,
    agent_process,
    corestore_process,
    plan_for,
    quiet_stand_in_logs,
    say,
    work_directory,
)
from bench.cas import measure as measure_cas
from devstack.cloudly import StandInCloudly, cluster_document
from devstack.driver import RestoreDriver, RestorePlan

__all__ = ["main"]

MiB = 2**20
AGENT = ["agent", "run"]
BASELINE = ["bench._staging_passthrough"]


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags (`--quick` shrinks every size that was not given explicitly)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (small sizes)")
    parser.add_argument("--mib", type=int, help="throughput object size (default 512)")
    parser.add_argument(
        "--warmup-mib", type=int, help="warm-up stage per throughput child, 0: none (default 16)"
    )
    parser.add_argument("--rss-mib", type=int, help="RSS object size (default 2048)")
    parser.add_argument(
        "--status-mib", type=int, help="extra status-probe stage, 0: none (default 512)"
    )
    parser.add_argument("--forms", default="base64,buffer", help="chunk forms Cloudly sends")
    parser.add_argument("--rss-form", default="buffer", help="chunk form of the RSS stage")
    parser.add_argument("--status-form", default="base64", help="chunk form of the status stage")
    parser.add_argument("--repeat", type=int, help="agent/baseline pairs per form (default 3)")
    parser.add_argument("--chunk-mib", type=int, default=4, help="[corestore] chunk_size")
    parser.add_argument(
        "--piece-kib", type=int, default=1024, help="bytes per stream write (<= 1024 KiB)"
    )
    parser.add_argument("--window", type=int, default=16, help="[streams] window")
    parser.add_argument("--status-interval-ms", type=float, default=20.0)
    parser.add_argument("--cas-mutations", type=int, help="bench/cas.py mutations (default 2000)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    parser.add_argument(
        "--dir", type=Path, help="where the work directory goes (default: the system temp dir)"
    )
    args = parser.parse_args(argv)
    defaults = (
        {
            "mib": 32,
            "warmup_mib": 4,
            "rss_mib": 128,
            "status_mib": 32,
            "repeat": 1,
            "cas_mutations": 200,
        }
        if args.quick
        else {
            "mib": 512,
            "warmup_mib": 16,
            "rss_mib": 2048,
            "status_mib": 512,
            "repeat": 3,
            "cas_mutations": 2000,
        }
    )
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.forms = [form for form in args.forms.split(",") if form]
    return args


@contextlib.asynccontextmanager
async def cloudly_for(corestore: Corestore, form: str) -> AsyncIterator[StandInCloudly]:
    """A stand-in Cloudly sending stream chunks in `form`, serving one cluster of one node."""
    document = cluster_document(CLUSTER, {NODE: corestore.url})
    async with StandInCloudly(
        token=TOKEN,
        cluster=document,
        peer_settings=ConnectionSettings(streams=StreamSettings(chunk_form=cast(ChunkForm, form))),
    ) as cloudly:
        yield cloudly


def drop_staged(corestore: Corestore, plan: RestorePlan) -> None:
    """Free the disk an object took (the bench's own temporary Corestore directory)."""
    shutil.rmtree(corestore.data_dir / "staging" / plan.staging_archive_id, ignore_errors=True)


class Bench:
    """The shared state of one run."""

    def __init__(self, args: argparse.Namespace, work: Path, corestore: Corestore) -> None:
        self.args = args
        self.work = work
        self.corestore = corestore
        self.runs = 0

    def pids(self, child: AgentProcess) -> dict[str, int]:
        """The processes whose CPU a run charges: the child and Corestore."""
        return {"child": child.pid, "corestore": self.corestore.process.pid}

    def plan(self, obj: BenchObject, kind: str) -> RestorePlan:
        """A restore of its own for every stage (fresh ids, fresh staging archive)."""
        self.runs += 1
        return plan_for(f"bench-{kind}-{self.runs}", obj)

    def driver(self, cloudly: StandInCloudly, plan: RestorePlan) -> RestoreDriver:
        """The stand-in's driver of `plan`, writing `--piece-kib` pieces."""
        return RestoreDriver(
            cloudly, plan, piece_size=self.args.piece_kib * 1024, call_timeout=1800.0
        )

    @contextlib.asynccontextmanager
    async def child(
        self, name: str, module: list[str], cloudly: StandInCloudly
    ) -> AsyncIterator[AgentProcess]:
        self.runs += 1
        directory = self.work / f"{self.runs:02d}-{name}"
        async with agent_process(
            name,
            module,
            directory,
            cloudly,
            chunk_mib=self.args.chunk_mib,
            window=self.args.window,
        ) as child:
            yield child

    async def throughput(self, form: str) -> list[StageRun]:
        """A warm-up stage through each path, then `repeat` agent/baseline pairs of one form,
        alternating which goes first. Warm-up runs are returned with `warmup` set."""
        obj = BenchObject.make(self.args.mib * MiB, self.args.chunk_mib * MiB)
        warm = BenchObject.make(self.args.warmup_mib * MiB, self.args.chunk_mib * MiB)
        runs: list[StageRun] = []
        async with (
            cloudly_for(self.corestore, form) as to_agent,
            cloudly_for(self.corestore, form) as to_baseline,
            self.child(f"agent-{form}", AGENT, to_agent) as agent,
            self.child(f"baseline-{form}", BASELINE, to_baseline) as baseline,
            CorestoreClient(self.corestore.url, Secret(BEARER)) as client,
        ):

            async def one(path: str, staged: BenchObject) -> StageRun:
                plan = self.plan(staged, path)
                if path == "agent":
                    driver = self.driver(to_agent, plan)
                    await driver.prepare()
                    run = await stage_agent(driver, self.pids(agent), form)
                else:
                    piece = self.args.piece_kib * 1024
                    pids = self.pids(baseline)
                    run = await stage_baseline(to_baseline, plan, staged, pids, form, client, piece)
                drop_staged(self.corestore, plan)
                return run

            if self.args.warmup_mib:
                for path in ("agent", "baseline"):
                    run = await one(path, warm)
                    run.warmup = True
                    say(f"  {form:6} {path:8} {run.mb_per_s:7.1f} MB/s (warm-up)")
                    runs.append(run)
            for index in range(self.args.repeat):
                order = ("agent", "baseline") if index % 2 == 0 else ("baseline", "agent")
                for path in order:
                    run = await one(path, obj)
                    say(f"  {form:6} {path:8} {run.mb_per_s:7.1f} MB/s ({run.seconds:.1f} s)")
                    runs.append(run)
        return runs

    async def rss(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """A fresh agent: idle RSS, then the peak while one large object stages; status
        round-trips are fired at the same agent meanwhile."""
        form = self.args.rss_form
        obj = BenchObject.make(self.args.rss_mib * MiB, self.args.chunk_mib * MiB)
        async with (
            cloudly_for(self.corestore, form) as cloudly,
            self.child(f"agent-rss-{form}", AGENT, cloudly) as agent,
        ):
            plan = self.plan(obj, "rss")
            connected_rss, _ = memory_kib(agent.pid)
            driver = self.driver(cloudly, plan)
            await driver.prepare()
            idle_rss, idle_hwm = memory_kib(agent.pid)
            reset = reset_peak_rss(agent.pid)
            sampler = RssSampler(agent.pid, 0.02)
            probe = StatusProbe(self.driver(cloudly, plan), self.args.status_interval_ms / 1000)
            run = await stage_agent(driver, self.pids(agent), form, sampler=sampler, probe=probe)
            _, hwm = memory_kib(agent.pid)
            drop_staged(self.corestore, plan)
        peak = max(sampler.peak_kib, hwm) if reset else sampler.peak_kib
        rss = {
            "form": form,
            "bytes": obj.size,
            "mb_per_s": run.mb_per_s,
            "connected_rss_kib": connected_rss,
            "idle_rss_kib": idle_rss,
            "idle_hwm_kib": idle_hwm,
            "hwm_reset": reset,
            "hwm_after_kib": hwm,
            "sampled_peak_kib": sampler.peak_kib,
            "samples": sampler.samples,
            "peak_kib": peak,
            "above_idle_kib": peak - idle_rss,
        }
        return rss, {"form": form, "bytes": obj.size, "mb_per_s": run.mb_per_s, **probe.summary()}

    async def status(self) -> dict[str, Any]:
        """Status round-trips while a stage runs on the same session (no RSS sampling)."""
        form = self.args.status_form
        obj = BenchObject.make(self.args.status_mib * MiB, self.args.chunk_mib * MiB)
        async with (
            cloudly_for(self.corestore, form) as cloudly,
            self.child(f"agent-status-{form}", AGENT, cloudly) as agent,
        ):
            plan = self.plan(obj, "status")
            probe = StatusProbe(self.driver(cloudly, plan), self.args.status_interval_ms / 1000)
            driver = self.driver(cloudly, plan)
            await driver.prepare()
            run = await stage_agent(driver, self.pids(agent), form, probe=probe)
            drop_staged(self.corestore, plan)
        return {"form": form, "bytes": obj.size, "mb_per_s": run.mb_per_s, **probe.summary()}


async def run_all(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Every measurement, in order; the figures as one dict."""
    results: dict[str, Any] = {"args": {k: v for k, v in vars(args).items() if k != "json"}}
    with (work / "corestore.log").open("wb") as log:
        async with corestore_process(work, log) as corestore:
            bench = Bench(args, work, corestore)
            throughput: dict[str, list[dict[str, Any]]] = {}
            for form in args.forms:
                say(f"throughput, {form} form, {args.mib} MiB x {args.repeat}")
                throughput[form] = [_row(run) for run in await bench.throughput(form)]
            results["throughput"] = throughput
            say(f"peak RSS and status round-trips, {args.rss_form} form, {args.rss_mib} MiB")
            results["rss"], during_rss = await bench.rss()
            results["status"] = [during_rss]
            if args.status_mib:
                say(f"status round-trips, {args.status_form} form, {args.status_mib} MiB")
                results["status"].append(await bench.status())
    say(f"durable CAS, {args.cas_mutations} mutations")
    cas_dir = Path(tempfile.mkdtemp(prefix="cas-", dir=work))
    sequential, concurrent = await measure_cas(cas_dir / "state", args.cas_mutations)
    results["cas"] = {"sequential_per_s": sequential, "concurrent_8_keys_per_s": concurrent}
    return results


def _row(run: StageRun) -> dict[str, Any]:
    return {
        "path": run.path,
        "warmup": run.warmup,
        "bytes": run.bytes,
        "seconds": run.seconds,
        "mb_per_s": run.mb_per_s,
        "forward_mb_per_s": run.forward_mb_per_s,
        "commit_s": run.commit_s,
        **{f"cpu_{who}_s_per_gib": run.cpu_s_per_gib(who) for who in run.cpu_s},
    }


def main(argv: list[str] | None = None) -> None:
    """Parse the flags, measure everything, print the figures."""
    args = parse(argv)
    configure_logging("console", "warning", sys.stderr)
    quiet_stand_in_logs()
    command = " ".join([".venv/bin/python -m bench.staging", *(argv or sys.argv[1:])])
    started = time.perf_counter()
    with work_directory("staging", args.dir, keep=args.keep) as work:
        results = asyncio.run(run_all(args, work))
    results["machine"] = machine_facts()
    results["command"] = command
    elapsed = time.perf_counter() - started
    print("\n".join(report(results, command, elapsed)))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
