"""Retention over a large store: the database file before and after, and what it cost the loop.

A state database (the agent's schema, made by `RevisionStore.open`) is filled in bulk with
`--restores` isolated restores in `cleaned` (each with a plan of `--objects` manifest objects,
every object staged and written: its manifest, chunk and object rows) and `--jobs` finished
relay jobs (half backups, half restore runs over `--services` services), all last changed
`--age-days` ago, past `[state] retention_days` (30), plus `--recent` of each changed just now,
which must stay. Then, in this process as the agent runs it, one retention pass
(`agent.store.retention.Retention.sweep()`, default pace) while two watchers run on the same
event loop:

- a ticker that sleeps `--tick-ms` again and again and records how late it wakes (the loop lag,
  measured as `agent/watch/loopwatch.py` does);
- a reader that asks the store for one node state every `--read-ms` (what a status request does)
  and records how long each answer takes (how long a request waits behind retention's steps).

Printed: the database file (and WAL) size before and after, what the pass deleted and freed,
its steps and wall time, the loop lag's p50/p99/max and the reads' p50/p99/max. Target: p99
loop lag <= 50 ms. Run from the repository root:

    .venv/bin/python -m bench.retention [--restores 10000] [--jobs 10000] [--objects 10]
        [--dir PATH] [--json out.json]

The filling is not measured (bulk inserts, not the agent's write path). `--dir` picks the file
system (default: the system temp dir); the work directory is removed afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiosqlite

from agent.clock import SYSTEM_CLOCK, epoch_ms
from agent.contracts.isolatedrestore import IsolatedRestoreNodeState
from agent.domain.restores import PreparedPlan, RestoreKey
from agent.log import configure_logging
from agent.store import DB_NAME, RevisionStore
from agent.store.codec import encode_plan, encode_state
from agent.store.retention import DAY_S, Retention, RetentionSettings
from agent.store.startup import open_database
from bench._procstat import machine_facts

__all__ = ["main"]

CLUSTER, NODE = "cluster-1", "node-1"
SHA = "5" * 64
DIGEST = "d" * 64


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--restores", type=int, default=10_000, help="cleaned restores")
    parser.add_argument("--jobs", type=int, default=10_000, help="finished relay jobs")
    parser.add_argument("--objects", type=int, default=10, help="manifest objects per restore")
    parser.add_argument("--services", type=int, default=100, help="services the restores run")
    parser.add_argument("--recent", type=int, default=100, help="recent ones of each, kept")
    parser.add_argument("--age-days", type=float, default=40.0, help="age of the old records")
    parser.add_argument("--retention-days", type=int, default=30)
    parser.add_argument("--tick-ms", type=float, default=5.0, help="loop-lag ticker period")
    parser.add_argument("--read-ms", type=float, default=20.0, help="state reader period")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--dir", type=Path, help="where the database goes (default: temp dir)")
    return parser.parse_args(argv)


def _state(key: RestoreKey) -> IsolatedRestoreNodeState:
    return IsolatedRestoreNodeState.from_wire(
        {
            "restoreId": key.restore_id,
            "clusterId": key.cluster_id,
            "targetNodeName": key.node_name,
            "sourceBackupId": "backup-1",
            "sourceServiceId": "service-1",
            "scratchNamespaceId": f"scratch-{key.restore_id}",
            "stagingArchiveId": f"staging-{key.restore_id}",
            "revision": 0,
            "status": "preparing",
            "completedResourceMappingIds": ["map-db"],
            "verification": {"status": "passed", "results": []},
            "cleanup": {
                "resources": [
                    {
                        "resourceMappingId": "map-db",
                        "resourceType": "database",
                        "status": "succeeded",
                        "attempts": 1,
                    }
                ],
                "stagingArchive": {
                    "stagingArchiveId": f"staging-{key.restore_id}",
                    "status": "succeeded",
                    "attempts": 1,
                },
            },
            "updatedAt": 0,
        }
    )


def _plan(objects: int) -> PreparedPlan:
    return PreparedPlan.from_wire(
        {
            "resourceMappings": [
                {
                    "id": "map-db",
                    "type": "database",
                    "source": {"snapshotId": "snap-db", "resourceName": "db", "databaseName": "a"},
                    "target": {"resourceName": "db-scratch", "databaseName": "a"},
                }
            ],
            "archiveManifest": {
                "objects": [
                    {"path": f"snap-db/part-{n:05d}.bin", "size": 1_048_576, "sha256": SHA}
                    for n in range(objects)
                ]
            },
        }
    )


async def fill(path: Path, args: argparse.Namespace, now_ms: int) -> None:
    """The records, written in bulk straight into the agent's schema (its own start-up made
    the file: checks, migrations, modes)."""
    db = await open_database(path, busy_timeout=5.0, clock=SYSTEM_CLOCK)
    try:
        await _fill(db, args, now_ms)
    finally:
        await db.close()


async def _fill(db: aiosqlite.Connection, args: argparse.Namespace, now_ms: int) -> None:
    old_ms = now_ms - round(args.age_days * DAY_S * 1000)
    encoded = encode_plan(_plan(args.objects))
    await db.execute_fetchall("BEGIN IMMEDIATE")
    for index in range(args.restores + args.recent):
        key = RestoreKey(CLUSTER, NODE, f"restore-{index:06d}")
        at = old_ms if index < args.restores else now_ms
        routing = (key.cluster_id, key.node_name, key.restore_id)
        await db.execute_fetchall(
            "INSERT INTO restore_state VALUES (?, ?, ?, 12, 'cleaned', ?, ?, ?)",
            (*routing, encode_state(key, _state(key)), DIGEST, at),
        )
        await db.execute_fetchall(
            "INSERT INTO restore_plan VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                *routing,
                encoded.mappings_json,
                encoded.manifest_json,
                encoded.mapping_count,
                encoded.object_count,
                encoded.manifest_bytes,
            ),
        )
        await db.executemany(
            "INSERT INTO manifest_object VALUES (?, ?, ?, ?, ?, ?)",
            [(*routing, *entry) for entry in encoded.objects],
        )
        await db.executemany(
            "INSERT INTO staged_chunk VALUES (?, ?, ?, ?, 0, ?, ?)",
            [(*routing, path, size, sha) for path, size, sha in encoded.objects],
        )
        await db.executemany(
            "INSERT INTO staged_object VALUES (?, ?, ?, ?, ?, ?, ?)",
            [(*routing, path, size, sha, at) for path, size, sha in encoded.objects],
        )
        if index % 1000 == 999:
            await db.execute_fetchall("COMMIT")
            await db.execute_fetchall("BEGIN IMMEDIATE")
    result = json.dumps({"response": {"snapshots": [{"type": "database", "snapshotId": "s"}]}})
    runs: dict[str, int] = {}
    for index in range(args.jobs + args.recent):
        at = old_ms if index < args.jobs else now_ms
        if index % 2 == 0:
            kind, backup, service, run = "backup", f"bk-{index:06d}", "svc-backup", 0
        else:
            kind, backup, service = "restore", "bk-000000", f"svc-{index % args.services:03d}"
            run = runs[service] = runs.get(service, 0) + 1
        await db.execute_fetchall(
            "INSERT INTO relay_job VALUES (?, ?, ?, ?, ?, ?, 2, 'succeeded', ?, ?, 1, ?, ?)",
            (CLUSTER, NODE, kind, backup, service, run, DIGEST, result, at, at),
        )
    await db.execute_fetchall("COMMIT")
    await db.execute_fetchall("PRAGMA wal_checkpoint(TRUNCATE)")


async def ticker(stop: asyncio.Event, period_s: float, lags_ms: list[float]) -> None:
    """How late a `period_s` sleep wakes, again and again, until `stop`."""
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        expected = loop.time() + period_s
        await asyncio.sleep(period_s)
        lags_ms.append(max(0.0, loop.time() - expected) * 1000)


async def reader(
    store: RevisionStore, stop: asyncio.Event, period_s: float, took_ms: list[float]
) -> None:
    """A state read (a status request's store call) every `period_s`, timed."""
    key = RestoreKey(CLUSTER, NODE, "restore-recent-probe")
    while not stop.is_set():
        started = time.perf_counter()
        await store.get(key)
        took_ms.append((time.perf_counter() - started) * 1000)
        await asyncio.sleep(period_s)


def _quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values) or [float("nan")]
    return {
        "count": len(values),
        "p50": statistics.median(ordered),
        "p99": ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))],
        "max": ordered[-1],
    }


async def measure(args: argparse.Namespace, directory: Path) -> dict[str, Any]:
    """Fill, then one retention pass with the watchers running; the figures."""
    now_ms = epoch_ms(SYSTEM_CLOCK)
    started = time.perf_counter()
    await fill(directory / DB_NAME, args, now_ms)
    filled_s = time.perf_counter() - started
    async with await RevisionStore.open(directory) as store:
        before = store.file_bytes()
        counts_before = await store.count_by_status(), len(await store.list_jobs())
        retention = Retention(store, RetentionSettings.from_days(args.retention_days))
        stop = asyncio.Event()
        lags: list[float] = []
        reads: list[float] = []
        async with asyncio.TaskGroup() as group:
            group.create_task(ticker(stop, args.tick_ms / 1000, lags))
            group.create_task(reader(store, stop, args.read_ms / 1000, reads))
            started = time.perf_counter()
            try:
                outcome = await retention.sweep()
            finally:
                seconds = time.perf_counter() - started
                stop.set()
        after = store.file_bytes()
        counts_after = await store.count_by_status(), len(await store.list_jobs())
    return {
        "fill_s": filled_s,
        "database_bytes_before": before,
        "database_bytes_after": after,
        "restores_before": counts_before[0],
        "jobs_before": counts_before[1],
        "restores_after": counts_after[0],
        "jobs_after": counts_after[1],
        "forgot_restores": outcome.restores,
        "forgot_jobs": outcome.jobs,
        "rows": outcome.rows,
        "steps": outcome.steps,
        "freed_bytes": outcome.freed_bytes,
        "seconds": seconds,
        "loop_lag_ms": _quantiles(lags),
        "read_ms": _quantiles(reads),
    }


def report(results: dict[str, Any], command: str) -> list[str]:
    """The figures as markdown lines (what docs/benchmarks.md quotes)."""
    facts, lag, read = results["machine"], results["loop_lag_ms"], results["read_ms"]
    mib = 2**20
    return [
        f"command: `{command}`",
        "",
        f"machine: nproc {facts['nproc']}, {facts['cpu']}, Linux {facts['kernel']}, "
        f"Python {facts['python']}",
        "",
        f"filled in {results['fill_s']:.1f} s: restores {results['restores_before']}, "
        f"relay jobs {results['jobs_before']}",
        f"database file + WAL: {results['database_bytes_before'] / mib:.1f} MiB before, "
        f"**{results['database_bytes_after'] / mib:.1f} MiB after**",
        f"retention pass: {results['seconds']:.1f} s, {results['steps']} steps, "
        f"{results['rows']} rows deleted ({results['forgot_restores']} restores, "
        f"{results['forgot_jobs']} jobs), {results['freed_bytes'] / mib:.1f} MiB given back; "
        f"left: restores {results['restores_after']}, relay jobs {results['jobs_after']}",
        f"loop lag during the pass ({lag['count']} ticks): p50 {lag['p50']:.1f} ms, "
        f"**p99 {lag['p99']:.1f} ms**, max {lag['max']:.1f} ms",
        f"state reads during the pass ({read['count']}): p50 {read['p50']:.1f} ms, "
        f"p99 {read['p99']:.1f} ms, max {read['max']:.1f} ms",
    ]


def main(argv: list[str] | None = None) -> None:
    """Parse the flags, measure, print the figures."""
    args = parse(argv)
    configure_logging("console", "warning", sys.stderr)
    command = " ".join([".venv/bin/python -m bench.retention", *(argv or sys.argv[1:])])
    work = Path(tempfile.mkdtemp(prefix="bench-retention-", dir=args.dir))
    try:
        results = asyncio.run(measure(args, work / "state"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results["machine"] = machine_facts()
    results["command"] = command
    print("\n".join(report(results, command)))
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
