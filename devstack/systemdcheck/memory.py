"""The `memory` check: sixteen stages at once over four nodes under the unit's memory ceiling.

The unit declares `MemoryHigh=`/`MemoryMax=` from the byte budget (docs/operations.md,
"Memory: one byte budget"). Here sixteen isolated restores, four on each of four nodes (the
stand-in Cloudly's cluster document gains three node ids on the same reference Corestore, each
with its own sealed bearer), stage one object each at once, then are cleaned up. It holds when
every stage is staged, the agent runs on under the same PID with no restart and no `oom_kill`
in its cgroup's `memory.events`, and its memory peak stayed below `MemoryMax=`; the line shows
the peak against `MemoryHigh=`. The peak is the first of these that the machine has:
`systemctl show -p MemoryPeak` (systemd 256 and later), the cgroup's `memory.peak`, the largest
`MemoryCurrent` sampled every 0.2 s during the stages, the main process's VmHWM; the line names
the one it read.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Final

from devstack.archive import MappingSpec, ObjectSpec, RestorePlan
from devstack.cloudly import cluster_document
from devstack.driver import MiB, RestoreDriver
from devstack.systemdcheck.node import Node, expect_status
from devstack.systemdcheck.stack import CLUSTER, NODE
from devstack.systemdcheck.systemd import CheckFailed

__all__ = ["memory"]

STAGES: Final = 16
NODES: Final = (NODE, "node-2", "node-3", "node-4")
OBJECT: Final = 32 * MiB
_CGROUP: Final = Path("/sys/fs/cgroup")


def _plan(index: int) -> RestorePlan:
    return RestorePlan(
        CLUSTER,
        NODES[index % len(NODES)],
        (MappingSpec("map-volume", "volume", "snap-vol", "uploads"),),
        (ObjectSpec("snap-vol/volume.img", OBJECT, b"memory check %d" % index),),
        restore_id=f"restore-memory-{index}",
        staging_archive_id=f"staging-memory-{index}",
        scratch_namespace_id=f"scratch-memory-{index}",
    )


def _bytes(value: str) -> int | None:
    return int(value) if value.isdigit() else None


def _cgroup_file(control_group: str, name: str) -> Path:
    return _CGROUP / control_group.lstrip("/") / name


async def _peak(node: Node, control_group: str, sampled: int, pid: int) -> tuple[int, str]:
    """The unit's memory peak in bytes, and where it was read (the module docstring)."""
    shown = _bytes(await node.unit.prop("MemoryPeak"))
    if shown is not None:
        return shown, "systemctl show -p MemoryPeak"
    path = _cgroup_file(control_group, "memory.peak")
    peak = _read_number(path)
    if peak is not None:
        return peak, str(path)
    if sampled:
        return sampled, "the largest MemoryCurrent sampled every 0.2 s"
    return _high_water(pid), "the main process's VmHWM"


def _read_number(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _high_water(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise CheckFailed("no memory peak to read: no MemoryPeak, memory.peak or MemoryCurrent")


async def _sample(node: Node, stop: asyncio.Event) -> int:
    """The largest `MemoryCurrent` seen until `stop`."""
    most = 0
    while not stop.is_set():
        current = _bytes(await node.unit.prop("MemoryCurrent"))
        most = max(most, current or 0)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.2):
                await stop.wait()
    return most


def _oom_kills(control_group: str) -> int:
    try:
        text = _cgroup_file(control_group, "memory.events").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return int(value)
    return 0


async def _clean(driver: RestoreDriver) -> None:
    await driver.cleanup()
    expect_status(await driver.wait_until({"cleaned", "cleanup-failed"}), "cleaned")


async def memory(node: Node) -> str:
    """Sixteen stages at once over four nodes under MemoryHigh=/MemoryMax=."""
    stack = node.stack
    values = await node.unit.show("MemoryHigh", "MemoryMax", "NRestarts", "ControlGroup")
    high, most = _bytes(values.get("MemoryHigh", "")), _bytes(values.get("MemoryMax", ""))
    if high is None or most is None:
        raise CheckFailed(f"the unit sets no memory ceiling: {values}")
    group = values.get("ControlGroup", "")
    pid, restarts, kills = await node.main_pid(), values.get("NRestarts"), _oom_kills(group)
    authority = stack.cloudly.credentials
    if authority is not None:
        for node_id in NODES[1:]:
            authority.set_bearer(node_id, stack.bearer)
    await stack.cloudly.push_cluster_config(
        cluster_document(CLUSTER, dict.fromkeys(NODES, stack.corestore.url))
    )
    try:
        drivers = [node.driver(_plan(index)) for index in range(STAGES)]
        for state in await asyncio.gather(*(driver.prepare() for driver in drivers)):
            expect_status(state, "prepared")
        started = time.monotonic()
        stop = asyncio.Event()
        sampler = asyncio.ensure_future(_sample(node, stop))
        try:
            await asyncio.gather(*(driver.stage_all() for driver in drivers))
        finally:
            stop.set()
            sampled = await sampler
        staged_s = time.monotonic() - started
        await asyncio.gather(*(_clean(driver) for driver in drivers))
    finally:
        await stack.cloudly.push_cluster_config(
            cluster_document(CLUSTER, {NODE: stack.corestore.url})
        )
    peak, source = await _peak(node, group, sampled, pid)
    after = await node.unit.show("NRestarts")
    if await node.main_pid() != pid or after.get("NRestarts") != restarts:
        raise CheckFailed("the agent was restarted during the stages")
    if _oom_kills(group) != kills:
        raise CheckFailed(f"the kernel's OOM killer struck in {group}")
    if peak >= most:
        raise CheckFailed(f"the unit's memory peaked at {peak / MiB:.0f} MiB, its MemoryMax=")
    enforced = _enforced(group)
    return (
        f"{STAGES} stages of {OBJECT // MiB} MiB over {len(NODES)} nodes at once, staged in "
        f"{staged_s:.1f} s and cleaned; the same PID, no restart, no oom_kill; memory peak "
        f"{peak / MiB:.0f} MiB ({source}) against MemoryHigh={high // MiB}M, "
        f"MemoryMax={most // MiB}M ({enforced})"
    )


def _enforced(control_group: str) -> str:
    """Whether the machine's cgroup applies the ceiling (a memory controller for the unit)."""
    limit = _cgroup_file(control_group, "memory.max")
    if limit.exists():
        return f"enforced: {limit} holds {limit.read_text().strip()}"
    return (
        "declared, not enforced in this machine: its cgroup has no memory controller (the "
        "host's is bound to the v1 hierarchy)"
    )
