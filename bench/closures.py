"""Database-closure benchmarks: throughput both ways against the staging path, and peak RSS.

One run, on this machine, side by side:

1. Throughput, per chunk form (`--forms`), `--mib` MiB each, one agent process: the staging
   path (stand-in Cloudly stream -> agent -> reference Corestore chunk PUTs, an isolated-restore
   stage, as bench/staging.py measures it), then a closure backup (Corestore ranged reads ->
   agent -> stand-in Cloudly, `backupClusterService`) and a closure restore (stand-in Cloudly ->
   agent -> Corestore import, `restoreClusterService`). Reported: MB/s of each, the transfer
   alone for the backup (first closure byte at Cloudly -> closure stored; the whole call also
   holds Corestore's own backup copy), and each closure direction's ratio to the staging path
   (target >= 0.8), `--repeat` times in alternating order, medians.
   The agent sends in the same chunk form as the stand-in Cloudly (`[streams] chunk_form`).
2. Peak RSS of a fresh agent process (`python -m agent run`) while a `--rss-mib` closure goes to
   Cloudly and comes back, in `--rss-form`, and the same for a `--small-mib` closure: idle
   VmRSS after connect, VmHWM reset (`clear_refs` 5) before each transfer, peak = max(VmHWM
   after, VmRSS sampled every 20 ms). Target: <= 100 MiB above idle, and flat with size.

Cloudly is a `StandInCloudly` in this process; the reference Corestore and the agent run as
their own processes, all on 127.0.0.1, under `--dir` (default: the system temp dir). Run from
the repository root:

    .venv/bin/python -m bench.closures [--quick] [--mib 256] [--rss-mib 2048] [--small-mib 256]
        [--forms base64,buffer] [--rss-form buffer] [--repeat 2] [--json out.json] [--keep]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, cast

from agent.protocol.chunks import ChunkForm
from agent.protocol.connection import ConnectionSettings, StreamSettings
from bench._procstat import machine_facts, memory_kib
from bench._staging_runs import RssSampler, reset_peak_rss, stage_agent
from bench._staging_world import (
    CLUSTER,
    NODE,
    TOKEN,
    BenchObject,
    Corestore,
    agent_process,
    corestore_process,
    plan_for,
)
from devstack.cloudly import StandInCloudly, cluster_document
from devstack.corestore.services import Services
from devstack.driver import RestoreDriver

__all__ = ["main"]

MiB = 2**20
_TIMEOUT_S = 3600.0


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags (`--quick` shrinks every size that was not given explicitly)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (small sizes)")
    parser.add_argument("--mib", type=int, help="throughput size (default 256)")
    parser.add_argument("--rss-mib", type=int, help="RSS closure size (default 2048)")
    parser.add_argument("--small-mib", type=int, help="the small RSS closure (default 256)")
    parser.add_argument("--forms", default="base64,buffer", help="chunk forms on the wire")
    parser.add_argument("--rss-form", default="buffer", help="chunk form of the RSS runs")
    parser.add_argument("--repeat", type=int, help="rounds per form (default 2)")
    parser.add_argument("--chunk-mib", type=int, default=4, help="[corestore] chunk_size")
    parser.add_argument("--window", type=int, default=16, help="[streams] window")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    parser.add_argument("--dir", type=Path, help="where the work directory goes")
    args = parser.parse_args(argv)
    defaults = (
        {"mib": 32, "rss_mib": 128, "small_mib": 32, "repeat": 1}
        if args.quick
        else {"mib": 256, "rss_mib": 2048, "small_mib": 256, "repeat": 2}
    )
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.forms = [form for form in args.forms.split(",") if form]
    return args


def say(text: str) -> None:
    """Progress on stderr (the figures go to stdout)."""
    print(text, file=sys.stderr, flush=True)


def _pieces(size: int, seed: bytes) -> Iterator[bytes]:
    block = hashlib.shake_256(seed).digest(8 * MiB)
    for offset in range(0, size, len(block)):
        yield block[: min(len(block), size - offset)]


class Bench:
    """One run: the Corestore child, a stand-in Cloudly per form, agent children."""

    def __init__(self, args: argparse.Namespace, work: Path, corestore: Corestore) -> None:
        self.args, self.work, self.corestore = args, work, corestore
        self.services = Services(corestore.data_dir)
        self.runs = 0

    @contextlib.asynccontextmanager
    async def cloudly(self, form: str) -> AsyncIterator[StandInCloudly]:
        document = cluster_document(CLUSTER, {NODE: self.corestore.url})
        async with StandInCloudly(
            token=TOKEN,
            cluster=document,
            peer_settings=ConnectionSettings(
                streams=StreamSettings(chunk_form=cast(ChunkForm, form))
            ),
            closures_dir=self.work / f"cloudly-{form}",
        ) as cloudly:
            yield cloudly

    def agent(self, cloudly: StandInCloudly, form: str) -> Any:
        self.runs += 1
        return agent_process(
            f"agent-{self.runs}",
            ["agent", "run"],
            self.work / f"{self.runs:02d}-agent-{form}",
            cloudly,
            chunk_mib=self.args.chunk_mib,
            window=self.args.window,
            chunk_form=form,  # the agent sends the closure in the form Cloudly sends in
        )

    async def stage(self, cloudly: StandInCloudly, pid: int, size: int, form: str) -> float:
        """MB/s of one isolated-restore stage of `size` bytes (the staging path)."""
        self.runs += 1
        plan = plan_for(
            f"bench-stage-{self.runs}", BenchObject.make(size, self.args.chunk_mib * MiB)
        )
        driver = RestoreDriver(cloudly, plan, piece_size=MiB, call_timeout=_TIMEOUT_S)
        await driver.prepare()
        run = await stage_agent(
            driver, {"child": pid, "corestore": self.corestore.process.pid}, form
        )
        shutil.rmtree(self.corestore.data_dir / "staging", ignore_errors=True)
        return run.mb_per_s

    async def closure_round(
        self, cloudly: StandInCloudly, size: int, rss_pid: int | None = None
    ) -> dict[str, Any]:
        """Back a service with a `size`-byte database up, then restore it into a fresh one;
        MB/s both ways (and peak RSS of `rss_pid` during each, when given)."""
        self.runs += 1
        service_id, backup_id = f"svc-{self.runs}", f"bk-{self.runs}"
        seed = service_id.encode()
        expected = hashlib.sha256()
        for piece in _pieces(size, seed):
            expected.update(piece)
        await asyncio.to_thread(self.services.write_database, service_id, _pieces(size, seed))
        first_byte: list[float] = []

        def progress(direction: str, done: int, total: int) -> None:
            del done, total
            if direction == "received" and not first_byte:
                first_byte.append(time.perf_counter())

        cloudly.closure_progress = progress
        request: dict[str, Any] = {
            "nodeId": NODE,
            "backupId": backup_id,
            "service": {"id": service_id, "data": {}},
        }
        figures: dict[str, Any] = {"bytes": size}
        async with _peak(rss_pid) as peak:
            started = time.perf_counter()
            backup = await cloudly.call_agent_served("backupClusterService", request, _TIMEOUT_S)
            ended = time.perf_counter()
        figures["backup_peak_kib"] = peak.get("peak_kib")
        stored = cloudly.closures[(backup_id, service_id)]
        if stored.sha256 != expected.hexdigest():
            raise RuntimeError("the closure at Cloudly differs from the database")
        figures["backup_mb_s"] = size / (ended - started) / 1e6
        figures["backup_transfer_mb_s"] = size / (ended - (first_byte or [started])[0]) / 1e6
        # Free the disk: the database and Corestore's archived copy (the record stays).
        self.services.database_path(service_id).unlink()
        self.services.archived_closure(service_id, backup_id).unlink()
        request["snapshots"] = backup["snapshots"]
        async with _peak(rss_pid) as peak:
            started = time.perf_counter()
            await cloudly.call_agent("restoreClusterService", request, _TIMEOUT_S)
            ended = time.perf_counter()
        figures["restore_peak_kib"] = peak.get("peak_kib")
        figures["restore_mb_s"] = size / (ended - started) / 1e6
        restored = await asyncio.to_thread(_sha256_file, self.services.database_path(service_id))
        if restored != expected.hexdigest():
            raise RuntimeError("the restored database differs from the backed-up one")
        self.services.database_path(service_id).unlink()
        stored.path.unlink()
        cloudly.closure_progress = None
        return figures


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(8 * MiB):
            digest.update(block)
    return digest.hexdigest()


@contextlib.asynccontextmanager
async def _peak(pid: int | None) -> AsyncIterator[dict[str, int]]:
    """The peak RSS (KiB) of `pid` over the block, in the dict yielded (filled at exit)."""
    result: dict[str, int] = {}
    if pid is None:
        yield result
        return
    reset_peak_rss(pid)
    sampler, stop = RssSampler(pid, 0.02), asyncio.Event()
    task = asyncio.create_task(sampler.run(stop))
    try:
        yield result
    finally:
        stop.set()
        await task
        _, hwm = memory_kib(pid)
        result["peak_kib"] = max(hwm, sampler.peak_kib)


async def throughput(bench: Bench, form: str) -> dict[str, Any]:
    """Staging vs closure backup vs closure restore, `--repeat` rounds, medians."""
    size = bench.args.mib * MiB
    rounds: list[dict[str, Any]] = []
    async with bench.cloudly(form) as cloudly, bench.agent(cloudly, form) as agent:
        for index in range(bench.args.repeat):
            # Alternate which goes first, so neither always meets a warm cache.
            if index % 2 == 0:
                staging = await bench.stage(cloudly, agent.pid, size, form)
                closure = await bench.closure_round(cloudly, size)
            else:
                closure = await bench.closure_round(cloudly, size)
                staging = await bench.stage(cloudly, agent.pid, size, form)
            rounds.append({"staging_mb_s": staging, **closure})
            say(
                f"  {form}: staging {staging:.1f} MB/s, backup {closure['backup_mb_s']:.1f}"
                f" (transfer {closure['backup_transfer_mb_s']:.1f}), restore"
                f" {closure['restore_mb_s']:.1f} MB/s"
            )
    medians = {
        key: statistics.median(r[key] for r in rounds)
        for key in ("staging_mb_s", "backup_mb_s", "backup_transfer_mb_s", "restore_mb_s")
    }
    medians["backup_ratio"] = medians["backup_transfer_mb_s"] / medians["staging_mb_s"]
    medians["restore_ratio"] = medians["restore_mb_s"] / medians["staging_mb_s"]
    return {"form": form, "mib": bench.args.mib, "rounds": rounds, "median": medians}


async def rss(bench: Bench) -> dict[str, Any]:
    """Peak RSS above idle of a fresh agent for a small and a large closure, both ways."""
    form = bench.args.rss_form
    async with bench.cloudly(form) as cloudly, bench.agent(cloudly, form) as agent:
        idle_kib, _ = memory_kib(agent.pid)
        figures: dict[str, Any] = {"form": form, "idle_kib": idle_kib}
        for label, mib in (("small", bench.args.small_mib), ("large", bench.args.rss_mib)):
            say(f"  rss: {mib} MiB closure, {form}")
            run = await bench.closure_round(cloudly, mib * MiB, rss_pid=agent.pid)
            figures[label] = {
                "mib": mib,
                "backup_above_idle_mib": (run["backup_peak_kib"] - idle_kib) / 1024,
                "restore_above_idle_mib": (run["restore_peak_kib"] - idle_kib) / 1024,
                "backup_mb_s": run["backup_mb_s"],
                "restore_mb_s": run["restore_mb_s"],
            }
    return figures


def report(results: dict[str, Any]) -> str:
    """The figures as Markdown tables."""
    lines = [
        "| form | MiB | staging MB/s | backup MB/s (transfer) | restore MB/s | backup/staging"
        " | restore/staging |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in results["throughput"]:
        m = run["median"]
        lines.append(
            f"| {run['form']} | {run['mib']} | {m['staging_mb_s']:.1f} |"
            f" {m['backup_mb_s']:.1f} ({m['backup_transfer_mb_s']:.1f}) |"
            f" {m['restore_mb_s']:.1f} | {m['backup_ratio']:.2f} | {m['restore_ratio']:.2f} |"
        )
    memory = results["rss"]
    lines += [
        "",
        f"idle RSS {memory['idle_kib'] / 1024:.1f} MiB ({memory['form']} chunks)",
        "",
        "| closure | peak above idle, backup | peak above idle, restore | backup MB/s |"
        " restore MB/s |",
        "|---|---|---|---|---|",
    ]
    for label in ("small", "large"):
        r = memory[label]
        lines.append(
            f"| {r['mib']} MiB | {r['backup_above_idle_mib']:.1f} MiB |"
            f" {r['restore_above_idle_mib']:.1f} MiB | {r['backup_mb_s']:.1f} |"
            f" {r['restore_mb_s']:.1f} |"
        )
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every figure of one run."""
    work = Path(tempfile.mkdtemp(prefix="bench-closures-", dir=args.dir))
    try:
        with (work / "corestore.log").open("wb") as log:
            async with corestore_process(work, log) as corestore:
                bench = Bench(args, work, corestore)
                results: dict[str, Any] = {"machine": machine_facts(), "throughput": []}
                for form in args.forms:
                    say(f"throughput, {form} chunks, {args.mib} MiB")
                    results["throughput"].append(await throughput(bench, form))
                say("peak RSS")
                results["rss"] = await rss(bench)
                return results
    finally:
        if args.keep:
            say(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """Run and print the figures (Markdown on stdout, JSON to `--json`)."""
    args = parse(argv)
    results = asyncio.run(run(args))
    print(report(results))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
