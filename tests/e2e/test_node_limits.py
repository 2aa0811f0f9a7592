"""Gentle to nodes, end to end: a transfer beyond `[corestore] max_transfers_per_node` waits its
turn in the real agent, longer than every stream deadline, shows as queued where the operator
looks, and then runs.

The first transfer keeps the node's one place: its first chunk PUT is delayed at the reference
Corestore (`DELAY_S`, several times the stall and idle deadlines set here). Only the waiting
is real time; every step waits for a condition (a Corestore hit, the health endpoint's answer).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
from typing import Any

import aiohttp

from agent.config import HealthListen
from agent.watch.statusview import fetch, render
from devstack.driver import RestorePlan

STALL_S, IDLE_S = 0.5, 1.5  # [streams] deadlines, far below the wait
DELAY_S = 3.0  # how long the first transfer keeps the node's one place
NODE = "node-e2e"


async def _get(stack: Any, path: str) -> str:
    async with aiohttp.ClientSession() as http, http.get(f"http://{stack.health}{path}") as answer:
        assert answer.status == 200, path
        return await answer.text()


async def _until_queued(stack: Any, count: int) -> dict[str, Any]:
    """`/v1/transfers` once the node has `count` transfers waiting (asked every 20 ms)."""
    async with asyncio.timeout(20):
        while True:
            body: dict[str, Any] = json.loads(await _get(stack, "/v1/transfers"))
            if body["nodes"].get(NODE, {}).get("queued") == count:
                return body
            await asyncio.sleep(0.02)


def _status_text(address: str) -> str:
    """What `restore-agent status` prints for the agent listening at `address`."""
    host, _, port = address.rpartition(":")
    return render(fetch(HealthListen(host=host, port=int(port))), now_ms=0)


def _second(plan: RestorePlan) -> RestorePlan:
    return dataclasses.replace(
        plan,
        restore_id="restore-e2e-b",
        staging_archive_id="staging-archive-b",
        scratch_namespace_id="scratch-ns-b",
    )


async def test_a_stage_beyond_the_nodes_limit_waits_past_every_deadline_then_runs(
    stack: Any, plan: RestorePlan
) -> None:
    """With one place per node, a second restore's stage waits while the first one's stage
    moves (its PUT held `DELAY_S`, six stall deadlines); meanwhile its row, `/v1/transfers`,
    the metrics and `restore-agent status` say it is queued; then it stages its object intact."""
    first, second = stack.driver(plan), stack.driver(_second(plan))
    streams = {"idle_timeout_s": IDLE_S, "stall_timeout_s": STALL_S}
    async with stack.agent(max_transfers_per_node=1, streams=streams):
        await first.prepare()
        await second.prepare()
        stack.faults.delay_next("put-chunk", DELAY_S)
        moving = asyncio.create_task(first.stage("snap-vol/volume.img"))
        await stack.wait_hits("put-chunk", 1)
        waiting = asyncio.create_task(second.stage("snap-db/dump.bson"))
        transfers = await _until_queued(stack, 1)
        rows = json.loads(await _get(stack, "/v1/restores"))["restores"]
        metrics = await _get(stack, "/metrics")
        shown = await asyncio.to_thread(_status_text, stack.health)
        assert not waiting.done()
        staged_first, staged_second = await asyncio.gather(moving, waiting)
    assert transfers["maxTransfersPerNode"] == 1
    assert transfers["nodes"] == {"node-e2e": {"moving": 1, "queued": 1}}
    assert [(t["for"], t["state"], t["position"]) for t in transfers["transfers"]] == [
        (f"{plan.cluster_id} node-e2e restore-e2e", "moving", None),
        (f"{plan.cluster_id} node-e2e restore-e2e-b", "queued", 1),
    ]
    restores = {row["restoreId"]: row for row in rows}
    assert restores["restore-e2e-b"]["transfer"]["state"] == "queued"
    assert restores["restore-e2e-b"]["transfer"]["position"] == 1
    assert restores["restore-e2e"]["transfer"]["state"] == "moving"
    assert 'restore_agent_transfers_queued{node="node-e2e"} 1.0' in metrics
    assert "prepared (queued 1)" in shown
    assert "transfers: node-e2e 1 moving, 1 queued (at most 1 per node)" in shown
    assert staged_first["status"] == staged_second["status"] == "staging"
    dump = second.plan.object("snap-db/dump.bson")
    assert stack.staged_digest(second.plan, dump.path) == dump.sha256


SERVICE = {"id": "svc-app", "data": {"name": "app", "image": "app:1"}}


async def test_a_closure_import_beyond_the_nodes_limit_waits_its_turn_then_restores(
    stack: Any, plan: RestorePlan
) -> None:
    """A service restore whose database closure must come in while a stage holds the node's one
    place is queued (its job row says so) before it asks Cloudly for the stream, waits past
    every deadline, then brings the closure's exact bytes back."""
    services = stack.corestore.services
    original = hashlib.shake_256(b"queued closure").digest(200_000)
    services.write_database("svc-app", [original])
    driver = stack.driver(plan)
    streams = {"idle_timeout_s": IDLE_S, "stall_timeout_s": STALL_S}
    async with stack.agent(max_transfers_per_node=1, streams=streams):
        backup = await stack.cloudly.call_agent(
            "backupClusterService",
            {"nodeId": NODE, "backupId": "bk-1", "service": SERVICE},
            timeout=60,
        )
        services.database_path("svc-app").unlink()
        await driver.prepare()
        puts = stack.hits["put-chunk"]
        stack.faults.delay_next("put-chunk", DELAY_S)
        moving = asyncio.create_task(driver.stage("snap-vol/volume.img"))
        await stack.wait_hits("put-chunk", puts + 1)
        request = {
            "nodeId": NODE,
            "backupId": "bk-1",
            "service": SERVICE,
            "snapshots": backup["snapshots"],
        }
        restoring = asyncio.create_task(
            stack.cloudly.call_agent("restoreClusterService", request, timeout=60)
        )
        await _until_queued(stack, 1)
        jobs = json.loads(await _get(stack, "/v1/jobs"))["jobs"]
        served_before = stack.cloudly.count("closure-served")
        restored, _ = await asyncio.gather(restoring, moving)
    [job] = [row for row in jobs if row["kind"] == "restore"]
    assert job["status"] == "running"
    assert (job["transfer"]["kind"], job["transfer"]["state"]) == ("closure-import", "queued")
    assert served_before == 0
    assert restored == {"restored": backup["snapshots"]}
    assert services.database_path("svc-app").read_bytes() == original
