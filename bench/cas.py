"""Durable compare-and-swap mutations per second of the revision store on this machine.

Each mutation is one committed SQLite transaction in WAL mode with `synchronous=FULL` (an fsync
of the WAL per commit), exactly as the agent runs it. Run from the repository root:

    .venv/bin/python -m bench.cas [--mutations 2000] [--dir PATH]

`--dir` picks the file system (default: a temporary directory under the current directory, so a
tmpfs /tmp does not flatter the figure).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from pathlib import Path

from agent.contracts.isolatedrestore import IsolatedRestoreNodeState
from agent.domain.restore_machine import Op
from agent.domain.restores import PreparedPlan, RestoreKey
from agent.store import RevisionStore

__all__ = ["main", "measure"]

PLAN = PreparedPlan.from_wire(
    {
        "resourceMappings": [
            {
                "id": "mapping-1",
                "type": "volume",
                "source": {"snapshotId": "snap-1", "volumeName": "v", "mountPath": "/data"},
                "target": {"volumeName": "v2", "mountPath": "/data"},
            }
        ],
        "archiveManifest": {"objects": []},
    }
)


def _state(key: RestoreKey) -> IsolatedRestoreNodeState:
    """A typical state of `key` (the store replaces its revision, status and updatedAt)."""
    return IsolatedRestoreNodeState.from_wire(
        {
            "restoreId": key.restore_id,
            "clusterId": key.cluster_id,
            "targetNodeName": key.node_name,
            "sourceBackupId": "backup-1",
            "sourceServiceId": "service-1",
            "scratchNamespaceId": "scratch-1",
            "stagingArchiveId": "staging-1",
            "revision": 0,
            "status": "preparing",
            "completedResourceMappingIds": ["mapping-1", "mapping-2"],
            "verification": {"status": "pending", "results": []},
            "updatedAt": 0,
        }
    )


async def measure(directory: Path, mutations: int) -> tuple[float, float]:
    """(sequential mutations/s on one key, 8 keys mutated concurrently: mutations/s)."""
    async with await RevisionStore.open(directory) as store:
        key = RestoreKey("cluster-1", "node-1", "bench")
        state = _state(key)
        await store.mutate(key, expected_revision=0, op=Op.PREPARE, state=state, plan=PLAN)
        await store.mutate(key, expected_revision=1, op=Op.PREPARE_SUCCEEDED, state=state)
        started = time.perf_counter()
        for revision in range(2, 2 + mutations):
            await store.mutate(key, expected_revision=revision, op=Op.STAGE, state=state)
        sequential = mutations / (time.perf_counter() - started)

        keys = [RestoreKey("cluster-1", "node-1", f"bench-{n}") for n in range(8)]
        for other in keys:
            state = _state(other)
            await store.mutate(other, expected_revision=0, op=Op.PREPARE, state=state, plan=PLAN)
            await store.mutate(other, expected_revision=1, op=Op.PREPARE_SUCCEEDED, state=state)

        async def drive(other: RestoreKey, count: int) -> None:
            state = _state(other)
            for revision in range(2, 2 + count):
                await store.mutate(other, expected_revision=revision, op=Op.STAGE, state=state)

        per_key = mutations // len(keys)
        started = time.perf_counter()
        async with asyncio.TaskGroup() as group:
            for other in keys:
                group.create_task(drive(other, per_key))
        concurrent = per_key * len(keys) / (time.perf_counter() - started)
    return sequential, concurrent


def main() -> None:
    """Parse arguments, measure, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mutations", type=int, default=2000)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="bench-cas-", dir=args.dir or Path.cwd()))
    try:
        sequential, concurrent = asyncio.run(measure(scratch / "state", args.mutations))
    finally:
        shutil.rmtree(scratch)
    print(f"revision store, WAL + synchronous=FULL, on {scratch.parent}:")
    print(f"  sequential CAS mutations (one key):      {sequential:8.0f} /s")
    print(f"  concurrent CAS mutations (8 keys, 1 db): {concurrent:8.0f} /s")


if __name__ == "__main__":
    main()
