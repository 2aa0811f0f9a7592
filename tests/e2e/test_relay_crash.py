"""Crash safety of the relay jobs: the agent as a subprocess, SIGKILLed mid-transfer, restarted
on its state database, and Cloudly's repeated request converging.

During a backup: Cloudly keeps nothing of the broken stream, the job row is still `running`,
and the repeated request resumes it — one backup in Corestore's archive (the same record), one
closure at Cloudly, byte-identical. During a restore: the database is untouched while the import
is half written; the restarted agent reconciles the run with Corestore by its keys (nothing
committed), and the repeated request resumes it: the half-written import dropped, the closure
imported whole, once.
Every wait is on something observable (Corestore's hits, the stand-in's events), never a sleep.
"""

from __future__ import annotations

import hashlib
import signal
from typing import Any

import pytest

from agent.corestore.routes import RouteName
from agent.domain.jobs import JobKey
from agent.errors import SessionClosed
from agent.store import RevisionStore

pytestmark = pytest.mark.slow

CLUSTER, NODE, SERVICE_ID = "cluster-e2e", "node-e2e", "svc-app"
SERVICE = {"id": SERVICE_ID, "data": {"name": "app"}}
MiB = 1024 * 1024
DATABASE = hashlib.shake_256(b"crash closure").digest(8 * MiB)  # 128 chunks of 64 KiB


async def _connected(stack: Any, count: int) -> None:
    """Wait until the `count`-th agent connection has read its cluster document (it serves
    once it is enrolled too: the first call after it is `call_agent_served`)."""
    await stack.cloudly.wait_for("cluster-config-read", count)


async def _killed(agent: Any) -> None:
    assert await agent.wait() == -signal.SIGKILL


async def _job(stack: Any, kind: str, run: int = 0) -> Any:
    key = JobKey(CLUSTER, NODE, kind, "bk-1", SERVICE_ID, run)  # type: ignore[arg-type]
    async with await RevisionStore.open(stack.state_dir) as store:
        return await store.get_job(key)


def _backup() -> dict[str, Any]:
    return {"nodeId": NODE, "backupId": "bk-1", "service": SERVICE}


async def test_an_agent_killed_while_sending_a_closure_converges_without_a_duplicate_backup(
    stack: Any,
) -> None:
    """SIGKILL at Corestore's 20th closure read: nothing at Cloudly, the job `running`; the
    repeated backup resumes it: one archived backup, one closure, byte-identical."""
    services = stack.corestore.services
    services.write_database(SERVICE_ID, [DATABASE])
    first = await stack.spawn()
    await _connected(stack, 1)
    stack.on_hit(RouteName.CLOSURE_READ, 20, first.kill)
    with pytest.raises(SessionClosed):
        await stack.cloudly.call_agent_served("backupClusterService", _backup(), timeout=60)
    await _killed(first)
    await stack.cloudly.wait_for("disconnected", 1)
    interrupted = await _job(stack, "backup")
    record_before = services.record(SERVICE_ID, "bk-1")

    second = await stack.spawn()
    await _connected(stack, 2)
    answer = await stack.cloudly.call_agent_served("backupClusterService", _backup(), timeout=60)
    assert await second.terminate() == 0

    assert stack.cloudly.count("closure-stored") == 1
    assert (interrupted.status, interrupted.attempts) == ("running", 1)
    assert answer["snapshots"] == record_before["snapshots"]
    assert services.record(SERVICE_ID, "bk-1") == record_before, "a second backup was made"
    assert [b["backupId"] for b in services.listing()["backups"]] == ["bk-1"]
    held = stack.cloudly.closures[("bk-1", SERVICE_ID)]
    assert held.sha256 == hashlib.sha256(DATABASE).hexdigest()
    assert hashlib.sha256(held.path.read_bytes()).hexdigest() == held.sha256
    finished = await _job(stack, "backup")
    assert (finished.status, finished.attempts) == ("succeeded", 2)


async def test_an_agent_killed_while_importing_a_closure_leaves_the_database_and_converges(
    stack: Any,
) -> None:
    """SIGKILL at the 20th import chunk: the database is still the old one (the import is
    only half written, never committed). The restarted agent reconciles the run with Corestore
    by its keys when the repeat comes: nothing committed, so the identical request resumes that
    run (attempt 2, the same keys), which drops the half-written import and imports the
    closure whole: one import, one run."""
    services = stack.corestore.services
    services.write_database(SERVICE_ID, [DATABASE])
    first = await stack.spawn()
    await _connected(stack, 1)
    backup = await stack.cloudly.call_agent_served("backupClusterService", _backup(), timeout=60)
    services.write_database(SERVICE_ID, [b"the database before the restore"])
    restore = {**_backup(), "snapshots": backup["snapshots"]}
    stack.on_hit(RouteName.CLOSURE_IMPORT_CHUNK, 20, first.kill)
    with pytest.raises(SessionClosed):
        await stack.cloudly.call_agent("restoreClusterService", restore, timeout=60)
    await _killed(first)
    during = services.database_path(SERVICE_ID).read_bytes()
    half_imported = services.open_imports()

    second = await stack.spawn()
    await _connected(stack, 2)
    answer = await stack.cloudly.call_agent_served("restoreClusterService", restore, timeout=60)
    assert await second.terminate() == 0

    assert during == b"the database before the restore"
    assert len(half_imported) == 1, "the killed agent left its import open"
    assert answer == {"restored": backup["snapshots"]}
    assert services.database_path(SERVICE_ID).read_bytes() == DATABASE
    assert services.open_imports() == []
    assert services.applied_imports(SERVICE_ID) == 1
    finished = await _job(stack, "restore", 1)
    assert (finished.status, finished.attempts) == ("succeeded", 2)
    assert await _job(stack, "restore", 2) is None
