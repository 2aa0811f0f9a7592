"""The byte path end to end: pre-encoded chunk frames -> the agent -> Corestore, against the JS
responder (typedrequest 3.3.0) on the same frames, in one run.

For each Corestore (`--corestores`: the reference one, which writes and fdatasyncs every chunk
and commits by re-hashing the object, and the discarding one, which verifies each chunk's
sha256 and throws it away) and each chunk form (`--forms`: the Buffer form
`{"type":"Buffer","data":[..]}` and base64 `{"type":"EncodedBuffer","data":"base64:.."}`):

- **agent**: `python -m agent run` (production settings unless a flag says) stages one
  `--mib` MiB object; the stand-in Cloudly in this process sends `stageIsolatedRestoreArchive`
  and bench/_replay.py replays the stream's frames, one in flight, 1 MiB chunks, exactly as
  typedrequest 3.3.0's initiator sends them. MB/s runs from the first chunk sent to the stage's
  reply, which comes after Corestore's commit (the object's sha256 checked, every chunk's too);
- **old agent** (`--baseline-root DIR`, a checkout with its own `.venv`, e.g. a worktree of the
  code before this change): the same, side by side;
- **JS**: bench/node_responder.mjs (the library's responder, hashing what arrives) gets the same
  frames from bench/_initiator.py. Only the Buffer form: 3.3.0 cannot read base64 chunks.

`--repeat` rounds alternate the order. Then, per form, a fresh agent stages `--rss-mib` MiB
into the reference Corestore while `coreflowGetIsolatedRestoreStatus` is fired at it every
`--status-interval-ms` on the same session (p50/p99/max), and its RSS is sampled: idle VmRSS
after connect + prepare, VmHWM reset (`clear_refs` 5), peak = max(VmHWM after, samples).

    .venv/bin/python -m bench.bytepath [--quick] [--mib 512] [--rss-mib 2048] [--repeat 2]
        [--forms buffer,base64] [--corestores reference,discard] [--baseline-root DIR]
        [--chunk-mib 4] [--max-in-flight 4] [--window 16] [--window-mib 8] [--json out.json]

`--dir` is where the Corestores write (the system's temporary directory by default); the
machine line names its filesystem. The reference Corestore syncs every chunk, so its CPU, and the
throughput of every path into it, move with that disk (docs/benchmarks.md, "One byte budget", 9).

Needs node and tests/interop/node_modules (scripts/bootstrap). Targets (issue 11): Buffer form
>= 8x the JS responder into the reference Corestore, >= 10x into the discarding one; base64
>= 150 MB/s discarding, >= 100 MB/s reference; status p99 < 50 ms during a Buffer-form stage;
peak RSS <= 100 MiB above idle for 2 GiB in both forms.
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
from collections.abc import AsyncIterator
from pathlib import Path
from typing import IO, Any

from agent.log import configure_logging
from agent.protocol.connection import ConnectionSettings
from bench._initiator import ChunkSet, run_stream
from bench._procstat import filesystem_of, machine_facts, memory_kib
from bench._replay import replay_stage
from bench._staging_runs import CpuMeter, RssSampler, StatusProbe, reset_peak_rss
from bench._staging_world import (
    CLUSTER,
    NODE,
    TOKEN,
    AgentProcess,
    BenchObject,
    Corestore,
    CycledObject,
    agent_process,
    corestore_process,
    plan_for,
)
from bench.stream_responder import LIBRARY, NODE_RESPONDER, responder
from devstack.cloudly import StandInCloudly, cluster_document
from devstack.driver import RestoreDriver, RestorePlan

__all__ = ["main"]

MiB = 2**20
GiB = 2**30
SEED = "bytepath"
DISTINCT = 4  # CycledObject cycles 4 blocks of 1 MiB made from the seed: so does the ChunkSet
FRAME_CHUNK = MiB


def say(text: str) -> None:
    """Progress on stderr (the tables go to stdout)."""
    print(text, file=sys.stderr, flush=True)


def bench_object(size: int, chunk_size: int) -> BenchObject:
    """The object whose bytes are the ChunkSet's chunks cycled (sha256 known before timing)."""
    obj = BenchObject.make(size, chunk_size, seed=SEED.encode())
    assert isinstance(obj.spec, CycledObject)
    return obj


class Run:
    """One run's shared state."""

    def __init__(self, args: argparse.Namespace, work: Path, log: IO[bytes]) -> None:
        self.args = args
        self.work = work
        self.log = log
        self.count = 0
        self.chunks = ChunkSet.generate(SEED, FRAME_CHUNK, DISTINCT)

    def next_dir(self, name: str) -> Path:
        self.count += 1
        return self.work / f"{self.count:02d}-{name}"

    @contextlib.asynccontextmanager
    async def cloudly(self, corestore: Corestore) -> AsyncIterator[StandInCloudly]:
        document = cluster_document(CLUSTER, {NODE: corestore.url})
        async with StandInCloudly(
            token=TOKEN, cluster=document, peer_settings=ConnectionSettings()
        ) as cloudly:
            yield cloudly

    @contextlib.asynccontextmanager
    async def agent(
        self, name: str, cloudly: StandInCloudly, checkout: Path | None = None
    ) -> AsyncIterator[AgentProcess]:
        args = self.args
        async with agent_process(
            name,
            ["agent", "run"],
            self.next_dir(name),
            cloudly,
            chunk_mib=args.chunk_mib,
            window=args.window,
            max_in_flight=args.max_in_flight,
            window_bytes=None if checkout is not None else args.window_mib * MiB,
            **({} if checkout is None else {"checkout": checkout}),
        ) as child:
            yield child

    async def stage(
        self,
        cloudly: StandInCloudly,
        corestore: Corestore,
        child: AgentProcess,
        form: str,
        size: int,
        *,
        probe: bool = False,
        sampler: RssSampler | None = None,
    ) -> dict[str, Any]:
        """Prepare a fresh restore of one object and stage it by replayed frames."""
        obj = bench_object(size, self.args.chunk_mib * MiB)
        self.count += 1
        plan = plan_for(f"bytepath-{self.count}", obj)
        driver = RestoreDriver(cloudly, plan, call_timeout=1800.0)
        await driver.prepare()
        status = StatusProbe(
            RestoreDriver(cloudly, plan, call_timeout=60.0), self.args.status_interval_ms / 1000
        )
        stop = asyncio.Event()
        pids = {"agent": child.pid, "corestore": corestore.process.pid}
        idle_rss, _ = memory_kib(child.pid)
        reset = reset_peak_rss(child.pid)
        sampler = sampler if sampler is not None else RssSampler(child.pid, 0.02)
        async with asyncio.TaskGroup() as group:
            if probe:
                group.create_task(status.run(stop))
            group.create_task(sampler.run(stop))
            meter = CpuMeter(pids)
            try:
                result = await replay_stage(
                    cloudly,
                    driver,
                    obj.spec,
                    chunk_json=self.chunks.encode(form),
                    chunk_size=FRAME_CHUNK,
                    probe_interval=self.args.probe_ms / 1000,
                )
            finally:
                cpu = meter.spent()
                stop.set()
        _, hwm = memory_kib(child.pid)
        peak = max(sampler.peak_kib, hwm) if reset else sampler.peak_kib
        drop_staged(corestore, plan)
        if (result.state["status"], result.state["revision"]) != ("staging", 3):
            raise RuntimeError(f"the stage ended in {result.state['status']}")
        gib = result.bytes / GiB
        row: dict[str, Any] = {
            "mib": result.bytes // MiB,
            "seconds": round(result.seconds, 3),
            "mb_per_s": round(result.mb_per_s, 1),
            "cpu_s_per_gib": {k: round(v / gib, 2) for k, v in cpu.items()},
            "probes": result.probes,
            # idle: connected and prepared, just before the stage
            "idle_rss_mib": round(idle_rss / 1024, 1),
            "peak_rss_mib": round(peak / 1024, 1),
            "rss_above_idle_mib": round((peak - idle_rss) / 1024, 1),
            "hwm_reset": reset,
            "rss_samples": sampler.samples,
        }
        if probe:
            row["status"] = status.summary()
        return row

    async def js(self, node: Any, form: str, size: int) -> dict[str, Any]:
        """The same frames through the JS responder."""
        count = size // FRAME_CHUNK
        run = await run_stream(
            node.url,
            stream_id=f"js_{form}_{self.count}",
            chunk_json=self.chunks.encode(form),
            chunk_size=FRAME_CHUNK,
            count=count,
            cpu_of_responder=node.cpu,
            probe_interval=self.args.probe_ms / 1000,
        )
        self.count += 1
        response = run.response or {}
        ok = response.get("status") == "complete" and response.get("sha256") == (
            self.chunks.sha256(count)
        )
        if not ok:
            raise RuntimeError(f"the JS responder did not take the {form} stream: {response}")
        return {
            "mib": run.bytes // MiB,
            "seconds": round(run.seconds, 3),
            "mb_per_s": round(run.mb_per_s, 1),
            "cpu_s_per_gib": {"node": round(run.cpu_seconds / (run.bytes / GiB), 2)},
        }


def drop_staged(corestore: Corestore, plan: RestorePlan) -> None:
    """Free the disk an object took (the bench's own Corestore directory)."""
    shutil.rmtree(corestore.data_dir / "staging" / plan.staging_archive_id, ignore_errors=True)


async def throughput(run: Run, kind: str) -> list[dict[str, Any]]:
    """Every form through the agent (and the old agent, and JS) into one Corestore."""
    args = run.args
    rows: list[dict[str, Any]] = []
    size = args.mib * MiB
    async with contextlib.AsyncExitStack() as stack:
        corestore = await stack.enter_async_context(
            corestore_process(run.work, run.log, discard=kind == "discard", name=f"cs-{kind}")
        )
        paths: dict[str, tuple[StandInCloudly, AgentProcess]] = {}
        cloudly = await stack.enter_async_context(run.cloudly(corestore))
        paths["agent"] = (cloudly, await stack.enter_async_context(run.agent("agent", cloudly)))
        if args.baseline_root is not None:
            old_cloudly = await stack.enter_async_context(run.cloudly(corestore))
            old = await stack.enter_async_context(
                run.agent("old-agent", old_cloudly, args.baseline_root)
            )
            paths["old agent"] = (old_cloudly, old)
        node = await stack.enter_async_context(
            responder("js", ["node", str(NODE_RESPONDER)], run.log)
        )
        for form in args.forms:
            warm = args.warmup_mib * MiB
            for cl, child in paths.values():
                if warm:
                    await run.stage(cl, corestore, child, form, warm)
            targets = [*paths, *(["js"] if form == "buffer" and args.js else [])]
            for round_ in range(args.repeat):
                order = targets if round_ % 2 == 0 else list(reversed(targets))
                for name in order:
                    if name == "js":
                        row = await run.js(node, form, size)
                    else:
                        cl, child = paths[name]
                        row = await run.stage(cl, corestore, child, form, size)
                    row |= {"corestore": kind, "form": form, "path": name, "round": round_}
                    cpu = row["cpu_s_per_gib"]
                    say(f"  {kind:9} {form:6} {name:9} {row['mb_per_s']:7.1f} MB/s {cpu}")
                    rows.append(row)
    return rows


async def rss_and_status(run: Run, form: str) -> dict[str, Any]:
    """A fresh agent stages a long object into the reference Corestore while status round-trips
    are fired at it on the same session and its RSS is sampled."""
    async with (
        corestore_process(run.work, run.log, name=f"cs-rss-{form}") as corestore,
        run.cloudly(corestore) as cloudly,
        run.agent(f"agent-rss-{form}", cloudly) as child,
    ):
        row = await run.stage(cloudly, corestore, child, form, run.args.rss_mib * MiB, probe=True)
    return row | {"form": form, "above_idle_mib": row["rss_above_idle_mib"]}


def _median(rows: list[dict[str, Any]], **where: str) -> float | None:
    values = [r["mb_per_s"] for r in rows if all(r[k] == v for k, v in where.items())]
    return round(statistics.median(values), 1) if values else None


def report(facts: dict[str, str], rows: list[dict[str, Any]], rss: list[dict[str, Any]],
           args: argparse.Namespace) -> dict[str, Any]:  # fmt: skip
    """Print the tables and the verdicts; return everything as one dict."""
    print("\nmachine: " + ", ".join(f"{k} {v}" for k, v in facts.items()))
    print(
        f"object {args.mib} MiB, frames of 1 MiB chunks one in flight, agent chunk "
        f"{args.chunk_mib} MiB, max_in_flight {args.max_in_flight}, window {args.window} / "
        f"{args.window_mib} MiB\n"
    )
    print("| Corestore | form | path | round | MB/s | s | CPU s/GiB | RSS above idle MiB |")
    print("|---|---|---|---:|---:|---:|---|---:|")
    for r in rows:
        cpu = ", ".join(f"{k} {v}" for k, v in r["cpu_s_per_gib"].items())
        print(
            f"| {r['corestore']} | {r['form']} | {r['path']} | {r['round']} | {r['mb_per_s']} "
            f"| {r['seconds']} | {cpu} | {r.get('rss_above_idle_mib', '')} |"
        )
    summary: dict[str, Any] = {}
    print("\n| Corestore | form | agent MB/s | old agent MB/s | JS MB/s | agent/JS | agent/old |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for kind in args.corestores:
        for form in args.forms:
            agent = _median(rows, corestore=kind, form=form, path="agent")
            old = _median(rows, corestore=kind, form=form, path="old agent")
            js = _median(rows, corestore=kind, form=form, path="js")
            vs_js = round(agent / js, 1) if agent and js else None
            vs_old = round(agent / old, 2) if agent and old else None
            summary[f"{kind}/{form}"] = {
                "agent": agent, "old": old, "js": js, "agent_over_js": vs_js,
                "agent_over_old": vs_old,
            }  # fmt: skip
            print(f"| {kind} | {form} | {agent} | {old} | {js} | {vs_js} | {vs_old} |")
    if rss:
        print(
            "\n| form | MiB | MB/s | idle RSS MiB | peak RSS MiB | above idle | status n "
            "| p50 ms | p99 ms | max ms |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for m in rss:
            s = m["status"]
            print(
                f"| {m['form']} | {m['mib']} | {m['mb_per_s']} | {m['idle_rss_mib']} "
                f"| {m['peak_rss_mib']} | {m['above_idle_mib']} | {s.get('count')} "
                f"| {s.get('p50_ms', 0):.1f} | {s.get('p99_ms', 0):.1f} "
                f"| {s.get('max_ms', 0):.1f} |"
            )

    def ratio(key: str) -> float:
        return summary.get(key, {}).get("agent_over_js") or 0.0

    def rate(key: str) -> float:
        return summary.get(key, {}).get("agent") or 0.0

    verdicts = {
        "buffer >= 8x JS into the reference Corestore": ratio("reference/buffer") >= 8,
        "buffer >= 10x JS into the discarding Corestore": ratio("discard/buffer") >= 10,
        "base64 >= 150 MB/s discarding": rate("discard/base64") >= 150,
        "base64 >= 100 MB/s reference": rate("reference/base64") >= 100,
        "status p99 < 50 ms during a buffer stage": any(
            m["form"] == "buffer" and m["status"].get("p99_ms", 1e9) < 50 for m in rss
        ),
        "peak RSS <= 100 MiB above idle, every form": bool(rss)
        and all(m["above_idle_mib"] <= 100 for m in rss),
    }
    print("\ntargets:")
    for name, ok in verdicts.items():
        print(f"  {'PASS' if ok else 'MISS'}  {name}")
    return {"machine": facts, "args": {k: str(v) for k, v in vars(args).items()},
            "rows": rows, "summary": summary, "rss": rss, "targets": verdicts}  # fmt: skip


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (64 MiB, 1 round)")
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--warmup-mib", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--rss-mib", type=int, default=2048, help="0 skips the RSS/status stage")
    parser.add_argument("--forms", type=lambda s: s.split(","), default=["buffer", "base64"])
    parser.add_argument(
        "--corestores", type=lambda s: s.split(","), default=["reference", "discard"]
    )
    parser.add_argument("--baseline-root", type=Path, default=None)
    parser.add_argument("--no-js", dest="js", action="store_false", help="skip the JS responder")
    parser.add_argument("--chunk-mib", type=int, default=4)
    parser.add_argument("--max-in-flight", type=int, default=4)
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--window-mib", type=int, default=8)
    parser.add_argument("--probe-ms", type=float, default=50.0)
    parser.add_argument("--status-interval-ms", type=float, default=20.0)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.mib, args.warmup_mib, args.repeat, args.rss_mib = 64, 0, 1, 64
    if shutil.which("node") is None or not LIBRARY.is_dir():
        parser.error("needs node and tests/interop/node_modules (scripts/bootstrap)")
    return args


async def amain(args: argparse.Namespace, *, quiet: bool = False) -> dict[str, Any]:
    """Run everything; print the report unless `quiet`; return the figures."""
    facts = machine_facts()
    facts["loadavg_at_start"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    work = Path(tempfile.mkdtemp(prefix="bench-bytepath-", dir=args.dir))
    facts["corestore_dir"] = f"{work} ({filesystem_of(work)})"
    try:
        with (work / "children.log").open("wb") as log:
            run = Run(args, work, log)
            rows: list[dict[str, Any]] = []
            for kind in args.corestores:
                say(f"throughput into the {kind} Corestore ...")
                rows += await throughput(run, kind)
            rss = []
            if args.rss_mib:
                for form in args.forms:
                    say(f"RSS and status during a {args.rss_mib} MiB {form} stage ...")
                    rss.append(await rss_and_status(run, form))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    facts["loadavg_at_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    if quiet:
        return {"machine": facts, "rows": rows, "rss": rss}
    return report(facts, rows, rss, args)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    configure_logging("console", "warning", sys.stderr)
    result = asyncio.run(amain(args))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
