"""Far links: stages and closures through a delay line on the Cloudly leg, ratio to 0 ms.

One run, side by side, on this machine: a reference Corestore and one agent (children), a
stand-in Cloudly in this process, and between the agent and the stand-in a delay line
(`bench/_delay_proxy.py`, a child: `RTT / 2` each way, both directions, optional
`--rate-mbit` cap), a fresh one and a fresh agent per RTT. Corestore stays local, as on a node.
For every RTT in `--rtts` (default 0, 50, 100, 200 ms):

- stage: `--stage-mib` MiB staged as `p` isolated restores of one object each, `p` in
  `--parallel` (the objects go at once; `[corestore] max_transfers_per_node` is raised to the
  largest `p`), Cloudly writing pieces of each size in `--pieces` (KiB). The stand-in Cloudly
  initiates like typedrequest 3.3.0 (a `feedback` probe first, then `StreamSettings(cycles=1)`:
  one chunk per round trip), so this is what a real Cloudly gets: the table Cloudly's side
  reads.
- closure backup and closure restore of a `--closure-mib` MiB database (`backupClusterService`,
  `restoreClusterService`): the agent drives these streams.
- MB/s (10^6 B/s) of each, and each one's ratio to the same cell at 0 ms.

Then `--keepalive-rtt` (default 400 ms): a closure both ways and a stage, while the session's
pings (every `ping_interval_s`) cross the line; it reports the connections the agent made (1:
the keepalive never misfired) and the streams that broke (0).

Then the path changed (`--path-rtt`, default 200 ms): a session born at 0 ms whose line's round
trip becomes `--path-rtt` after `--path-after` seconds (a route change, a failover), beside a
session born at that round trip: `--path-closures` closures each (backup, then restore), the
first started as soon as the round trip grew, the rest one after the other; each one's MB/s and
its ratio to the same closure of the session born there, and what the first backup delivered in
each second after the change (the stand-in's progress: how soon the stream follows the path).

`--checkout PATH` runs the agent of another checkout (its own `.venv`), e.g. main, for a
before/after pair: its config gets only keys every agent knows. Run from the repository root:

    .venv/bin/python -m bench.wan [--rtts 0,50,100,200] [--stage-mib 32] [--closure-mib 128]
        [--pieces 256,1024] [--parallel 1,4] [--form buffer] [--rate-mbit N]
        [--keepalive-rtt 400] [--path-rtt 200] [--path-after 5] [--path-closures 2]
        [--only stage,closures,keepalive,path] [--checkout PATH]
        [--agent-streams KEY=N,..] [--json out.json] [--keep]

Real time on purpose (benchmarks only): the agent's tests inject their clocks.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import logging
import shutil
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import structlog

from agent.corestore.client import CorestoreClient
from agent.protocol.chunks import ChunkForm
from agent.protocol.connection import ConnectionSettings, StreamSettings
from agent.secret import Secret
from bench._delay_line import Line, delay_line
from bench._procstat import machine_facts
from bench._staging_world import (
    BEARER,
    CLUSTER,
    NODE,
    ROOT,
    TOKEN,
    BenchObject,
    Corestore,
    agent_process,
    corestore_process,
    plan_for,
    quiet_stand_in_logs,
    say,
    work_directory,
)
from bench._wan_report import closure_text, ratios, report
from devstack.cloudly import StandInCloudly, StoredClosure, cluster_document
from devstack.corestore.services import Services
from devstack.driver import RestoreDriver

__all__ = ["main"]

MiB = 2**20
_TIMEOUT_S = 7200.0


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rtts", default="0,50,100,200", help="round trips, ms")
    parser.add_argument("--stage-mib", type=int, default=32, help="MiB staged per stage cell")
    parser.add_argument("--closure-mib", type=int, default=128, help="closure size, MiB")
    parser.add_argument("--pieces", default="256,1024", help="Cloudly's piece sizes, KiB")
    parser.add_argument("--parallel", default="1,4", help="objects staged at once")
    parser.add_argument("--form", default="buffer", help="chunk form, both ends")
    parser.add_argument("--rate-mbit", type=float, help="cap of the line, per direction")
    parser.add_argument("--keepalive-rtt", type=float, default=400.0, help="ms; 0: skip")
    parser.add_argument("--path-rtt", type=float, default=200.0, help="ms it grows to; 0: skip")
    parser.add_argument("--path-after", type=float, default=5.0, help="s at 0 ms before it grows")
    parser.add_argument("--path-closures", type=int, default=2, help="closures after it grew")
    parser.add_argument("--only", default="stage,closures,keepalive,path", help="what to run")
    parser.add_argument("--checkout", type=Path, default=ROOT, help="the agent's checkout")
    parser.add_argument(
        "--agent-streams", default="", help="extra [streams] keys of the agent: KEY=N,KEY=N"
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    parser.add_argument("--dir", type=Path, help="where the work directory goes")
    args = parser.parse_args(argv)
    args.rtts = [float(value) for value in args.rtts.split(",") if value]
    args.pieces = [int(value) for value in args.pieces.split(",") if value]
    args.parallel = [int(value) for value in args.parallel.split(",") if value]
    args.only = {value for value in args.only.split(",") if value}
    args.agent_streams = {
        key: int(value)
        for key, _, value in (item.partition("=") for item in args.agent_streams.split(","))
        if key
    }
    return args


def _pieces(size: int, seed: bytes) -> Iterator[bytes]:
    block = hashlib.shake_256(seed).digest(8 * MiB)
    for offset in range(0, size, len(block)):
        yield block[: min(len(block), size - offset)]


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(8 * MiB):
            digest.update(block)
    return digest.hexdigest()


@dataclass
class Wan:
    """One run: the Corestore child, the stand-in Cloudly, an agent per RTT."""

    args: argparse.Namespace
    work: Path
    corestore: Corestore
    cloudly: StandInCloudly
    services: Services
    runs: int = 0
    agent_log: Path | None = None
    results: dict[str, Any] = field(default_factory=dict)

    @contextlib.asynccontextmanager
    async def agent_at(self, rtt_ms: float) -> AsyncIterator[Line]:
        """A fresh delay line and a fresh agent dialling through it; yields the line."""
        self.runs += 1
        name = f"{self.runs:02d}-rtt-{rtt_ms:g}"
        directory = self.work / name
        directory.mkdir(parents=True)
        limit = max(self.args.parallel)
        async with (
            delay_line(
                self.cloudly.port, rtt_ms, self.args.rate_mbit, directory / "proxy.log"
            ) as line,
            agent_process(
                f"agent-{name}",
                ["agent", "run"],
                directory,
                self.cloudly,
                chunk_mib=4,
                window=16,
                chunk_form=self.args.form,
                checkout=self.args.checkout,
                corestore={"max_transfers_per_node": limit} if limit > 2 else None,
                streams=self.args.agent_streams or None,
                url=f"ws://127.0.0.1:{line.port}/",
            ) as child,
        ):
            self.agent_log = child.log_path
            yield line

    async def stage(self, piece_kib: int, parallel: int) -> float:
        """MB/s of `--stage-mib` MiB staged as `parallel` restores at once."""
        size = self.args.stage_mib * MiB // parallel
        drivers = []
        for index in range(parallel):
            self.runs += 1
            obj = BenchObject.make(size, 4 * MiB, seed=f"wan {self.runs}".encode())
            plan = plan_for(f"wan-{self.runs}-{index}", obj)
            driver = RestoreDriver(
                self.cloudly, plan, piece_size=piece_kib * 1024, call_timeout=_TIMEOUT_S
            )
            await driver.prepare()
            drivers.append(driver)
        started = time.perf_counter()
        answers = await asyncio.gather(*(d.stage(d.plan.objects[0]) for d in drivers))
        seconds = time.perf_counter() - started
        if any(answer["status"] != "staging" for answer in answers):
            raise RuntimeError(f"a stage did not end staging: {answers}")
        shutil.rmtree(self.corestore.data_dir / "staging", ignore_errors=True)
        return size * parallel / seconds / 1e6

    async def closure(self, mib: int) -> dict[str, Any]:
        """Back a `mib` MiB database up, restore it into a fresh one: MB/s each, or the error
        (and after how long) where one failed."""
        self.runs += 1
        size = mib * MiB
        service_id, backup_id = f"svc-{self.runs}", f"bk-{self.runs}"
        seed = service_id.encode()
        expected = hashlib.sha256()
        for piece in _pieces(size, seed):
            expected.update(piece)
        await asyncio.to_thread(self.services.write_database, service_id, _pieces(size, seed))
        request: dict[str, Any] = {
            "nodeId": NODE,
            "backupId": backup_id,
            "service": {"id": service_id, "data": {}},
        }
        figures: dict[str, Any] = {"mib": mib}
        started = time.perf_counter()
        try:
            backup = await self.cloudly.call_agent_served(
                "backupClusterService", request, _TIMEOUT_S
            )
            figures["backup_mb_s"] = size / (time.perf_counter() - started) / 1e6
            snapshots = backup["snapshots"]
        except Exception as exc:  # a figure: what failed and when
            figures["backup_error"] = _error(exc)
            figures["backup_failed_after_s"] = time.perf_counter() - started
            # Corestore made the backup; Cloudly gets its closure from Corestore's export, so
            # the restore is still measured (an agent that could not back it up can restore it).
            snapshots = await self._place_closure(service_id, backup_id)
        stored = self.cloudly.closures[(backup_id, service_id)]
        if "backup_mb_s" in figures:
            figures["backup_identical"] = stored.sha256 == expected.hexdigest()
        self.services.database_path(service_id).unlink()
        self.services.archived_closure(service_id, backup_id).unlink()
        request["snapshots"] = snapshots
        started = time.perf_counter()
        try:
            await self.cloudly.call_agent("restoreClusterService", request, _TIMEOUT_S)
        except Exception as exc:  # a figure: what failed and when
            figures["restore_error"] = _error(exc)
            figures["restore_failed_after_s"] = time.perf_counter() - started
            stored.path.unlink()
            return figures
        figures["restore_mb_s"] = size / (time.perf_counter() - started) / 1e6
        restored = self.services.database_path(service_id)
        figures["restore_identical"] = (
            await asyncio.to_thread(_sha256_file, restored) == expected.hexdigest()
        )
        restored.unlink()
        stored.path.unlink()
        return figures

    async def _place_closure(self, service_id: str, backup_id: str) -> list[dict[str, Any]]:
        """Give the stand-in the closure of a backup Corestore holds (its export, copied) and
        return the backup's snapshots: for a restore after the agent failed to send it."""
        async with CorestoreClient(self.corestore.url, Secret(BEARER)) as client:
            descriptor = await client.closure_descriptor(service_id, backup_id)
            record = await client.backup_record(service_id, backup_id)
        target = self.work / "cloudly" / f"{backup_id}--{service_id}.placed"
        target.parent.mkdir(parents=True, exist_ok=True)
        archived = self.services.archived_closure(service_id, backup_id)
        await asyncio.to_thread(shutil.copyfile, archived, target)
        self.cloudly.closures[(backup_id, service_id)] = StoredClosure(
            backup_id,
            service_id,
            NODE,
            descriptor.to_wire(),
            target,
            descriptor.size,
            descriptor.sha256,
        )
        return [snapshot.to_wire() for snapshot in record.snapshots]

    def log_count(self, *needles: str) -> int:
        """Lines of the current agent's log naming any of `needles`."""
        assert self.agent_log is not None
        text = self.agent_log.read_text(errors="replace")
        return sum(1 for line in text.splitlines() if any(n in line for n in needles))


def _error(exc: BaseException) -> str:
    data = getattr(exc, "error_data", None)
    code = data.get("code") if isinstance(data, dict) else None
    return f"{code or type(exc).__name__}: {exc}"


async def measure(wan: Wan) -> dict[str, Any]:
    """Every cell of `--rtts` (when stages or closures run), the keepalive check, the path
    changed."""
    args = wan.args
    cells: dict[str, dict[str, Any]] = {}
    for rtt in args.rtts if {"stage", "closures"} & args.only else []:
        say(f"RTT {rtt:g} ms")
        cell: dict[str, Any] = {}
        async with wan.agent_at(rtt):
            if "stage" in args.only:
                for piece in args.pieces:
                    for parallel in args.parallel:
                        rate = await wan.stage(piece, parallel)
                        cell[f"stage_{piece}k_x{parallel}_mb_s"] = rate
                        say(f"  stage {piece} KiB pieces x{parallel}: {rate:.1f} MB/s")
            if "closures" in args.only:
                cell["closure"] = await wan.closure(args.closure_mib)
                say(f"  closure {args.closure_mib} MiB: {closure_text(cell['closure'])}")
            cell["connections"] = wan.cloudly.count("cluster-config-read")
        cells[f"{rtt:g}"] = cell
    results: dict[str, Any] = {"cells": cells, "ratios": ratios(cells, args)}
    if "keepalive" in args.only and args.keepalive_rtt > 0:
        results["keepalive"] = await keepalive(wan)
    if "path" in args.only and args.path_rtt > 0:
        results["path"] = await path_changed(wan)
    return results


async def path_changed(wan: Wan) -> dict[str, Any]:
    """Closures of a session born at `--path-rtt`, then of one born at 0 ms whose round trip
    becomes `--path-rtt` after `--path-after` s (module docstring)."""
    args = wan.args
    rtt, mib = args.path_rtt, args.closure_mib
    figures: dict[str, Any] = {"rtt_ms": rtt, "after_s": args.path_after}
    say(f"born at RTT {rtt:g} ms")
    async with wan.agent_at(rtt):
        figures["born"] = [await wan.closure(mib) for _ in range(args.path_closures)]
    for index, closure in enumerate(figures["born"]):
        say(f"  closure {index + 1}: {closure_text(closure)}")
    say(f"born at RTT 0 ms, {rtt:g} ms after {args.path_after:g} s")
    trace: list[tuple[float, int]] = []  # the first backup: (s since the change, bytes in)
    async with wan.agent_at(0.0) as line:
        await asyncio.sleep(args.path_after)  # real time on purpose: the agent's own clock runs
        await line.set_rtt(rtt)
        changed_at = time.perf_counter()

        def received(direction: str, done: int, total: int) -> None:
            if direction == "received":
                trace.append((time.perf_counter() - changed_at, done))

        wan.cloudly.closure_progress = received
        try:
            figures["changed"] = [await wan.closure(mib)]
        finally:
            wan.cloudly.closure_progress = None
        figures["changed"] += [await wan.closure(mib) for _ in range(args.path_closures - 1)]
    figures["backup_mb_s_by_second"] = _by_second(trace)
    for index, closure in enumerate(figures["changed"]):
        say(f"  closure {index + 1}: {closure_text(closure)}")
    return figures


def _by_second(trace: list[tuple[float, int]]) -> list[float]:
    """MB/s in each whole second of `trace` (seconds, bytes so far), from 0 to its last."""
    rates, before, index = [], 0, 0
    for second in range(1, int(trace[-1][0]) + 2 if trace else 0):
        done = before
        while index < len(trace) and trace[index][0] < second:
            done = trace[index][1]
            index += 1
        rates.append((done - before) / 1e6)
        before = done
    return rates


async def keepalive(wan: Wan) -> dict[str, Any]:
    """At `--keepalive-rtt`: a closure both ways and a stage; connections made, streams broken."""
    rtt = wan.args.keepalive_rtt
    say(f"keepalive at RTT {rtt:g} ms")
    before = wan.cloudly.count("cluster-config-read")
    started = time.perf_counter()
    async with wan.agent_at(rtt):
        closure = await wan.closure(min(wan.args.closure_mib, 64))
        stage = await wan.stage(1024, 1)
        seconds = time.perf_counter() - started
        figures = {
            "rtt_ms": rtt,
            "seconds": seconds,
            "closure": closure,
            "stage_mb_s": stage,
            "connections": wan.cloudly.count("cluster-config-read") - before,
            "streams_broken": wan.log_count('"stream_broken"'),
            "sessions_lost": wan.log_count("cloudly_session_lost", "session_lost"),
        }
    say(
        f"  {figures['connections']} connection(s), {figures['streams_broken']} stream(s) broken,"
        f" {seconds:.0f} s"
    )
    return figures


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every figure of one run."""
    quiet_stand_in_logs()
    # The stand-in's protocol logs at debug (unrouted frames and the like): not figures.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    with (
        work_directory("wan", args.dir, keep=args.keep) as work,
        (work / "corestore.log").open("wb") as log,
    ):
        async with corestore_process(work, log) as corestore:
            document = cluster_document(CLUSTER, {NODE: corestore.url})
            settings = ConnectionSettings(
                streams=StreamSettings(chunk_form=cast(ChunkForm, args.form), cycles=1)
            )
            async with StandInCloudly(
                token=TOKEN,
                cluster=document,
                peer_settings=settings,
                closures_dir=work / "cloudly",
            ) as cloudly:
                wan = Wan(args, work, corestore, cloudly, Services(corestore.data_dir))
                results = await measure(wan)
                results["machine"] = machine_facts()
                results["args"] = {
                    key: sorted(value) if isinstance(value, set) else str(value)
                    for key, value in vars(args).items()
                }
                return results


def main(argv: list[str] | None = None) -> int:
    """Run and print the figures (Markdown on stdout, JSON to `--json`)."""
    args = parse(argv)
    results = asyncio.run(run(args))
    print(report(results))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2, sort_keys=True, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
