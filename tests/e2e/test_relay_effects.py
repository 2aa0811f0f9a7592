"""A repeat never redoes an effect whose result Cloudly has not seen: one import per run,
counted at Corestore, when the answer is lost and when the agent is SIGKILLed at the commit.

- The answer lost (Cloudly's socket read it and Cloudly died; the agent's confirming ping was
  never answered): the identical repeat gets the recorded answer and imports nothing; once
  that answer is delivered, the next identical request restores again.
- SIGKILL once Corestore committed the import (the agent never heard): the restarted agent
  reconciles the run by its key (committed), records it done, and answers the repeat from the
  record. SIGKILL before Corestore applied it: the run is resumed under its keys and imports
  once. The same holds for an archive restore (object storage, volumes) under its key.

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
DATABASE = hashlib.shake_256(b"effects closure").digest(1_000_000)  # 16 chunks of 64 KiB
CHANGED = b"written by the service after the restore"


def _backup() -> dict[str, Any]:
    return {"nodeId": NODE, "backupId": "bk-1", "service": SERVICE}


async def _runs(stack: Any) -> list[tuple[int, str, int]]:
    """(run, status, attempts) of every restore run, read once the agent stopped."""
    async with await RevisionStore.open(stack.state_dir) as store:
        jobs = [job for job in await store.list_jobs() if job.key.kind == "restore"]
    return sorted((job.key.run, job.status, job.attempts) for job in jobs)


async def _job(stack: Any, run: int) -> Any:
    async with await RevisionStore.open(stack.state_dir) as store:
        return await store.get_job(JobKey(CLUSTER, NODE, "restore", "bk-1", SERVICE_ID, run))


@pytest.fixture
def services(stack: Any) -> Any:
    services = stack.corestore.services
    services.write_database(SERVICE_ID, [DATABASE])
    return services


async def test_a_restore_whose_answer_was_lost_is_answered_from_its_record_and_imports_once(
    stack: Any, services: Any
) -> None:
    """Cloudly dies holding the answer (the agent's confirming ping unanswered): the identical
    repeat on the next connection is answered from the record, the database keeps what the
    service wrote since, one import. Once that answer reached Cloudly, the same request
    restores again: a second import, run 2."""
    async with stack.agent():
        backup = await stack.cloudly.call_agent("backupClusterService", _backup())
        restore = {**_backup(), "snapshots": backup["snapshots"]}
        services.write_database(SERVICE_ID, [b"before the restore"])
        stack.cloudly.lose_next_answer("restoreClusterService")
        with pytest.raises(SessionClosed):
            await stack.cloudly.call_agent("restoreClusterService", restore)
        services.write_database(SERVICE_ID, [CHANGED])
        await stack.cloudly.wait_for("cluster-config-read", 2)
        repeat = await stack.cloudly.call_agent_served("restoreClusterService", restore)
        after_repeat = services.database_path(SERVICE_ID).read_bytes()
        imports_after_repeat = services.applied_imports(SERVICE_ID)
        again = await stack.cloudly.call_agent("restoreClusterService", restore)
    assert stack.cloudly.count("answer-lost") == 1
    assert repeat == again == {"restored": backup["snapshots"]}
    assert (after_repeat, imports_after_repeat) == (CHANGED, 1)
    assert stack.hits[RouteName.CLOSURE_IMPORT_COMMIT] == 2
    assert services.applied_imports(SERVICE_ID) == 2
    assert services.database_path(SERVICE_ID).read_bytes() == DATABASE
    assert await _runs(stack) == [(1, "succeeded", 1), (2, "succeeded", 1)]


async def test_an_agent_killed_once_corestore_committed_answers_the_repeat_from_the_record(
    stack: Any, services: Any
) -> None:
    """SIGKILL right after Corestore committed the import, before its answer reached the
    agent: the restarted agent asks Corestore by the run's key (committed), records the run
    done, and answers the repeat with it; nothing is imported again, though the service
    changed its database meanwhile."""
    first = await stack.spawn()
    await stack.cloudly.wait_for("cluster-config-read", 1)
    backup = await stack.cloudly.call_agent_served("backupClusterService", _backup(), timeout=60)
    restore = {**_backup(), "snapshots": backup["snapshots"]}
    stack.on_handled(RouteName.CLOSURE_IMPORT_COMMIT, 1, first.kill)
    with pytest.raises(SessionClosed):
        await stack.cloudly.call_agent("restoreClusterService", restore, timeout=60)
    assert await first.wait() == -signal.SIGKILL
    committed = services.database_path(SERVICE_ID).read_bytes()
    left = await _runs(stack)
    services.write_database(SERVICE_ID, [CHANGED])

    second = await stack.spawn()
    await stack.cloudly.wait_for("cluster-config-read", 2)
    answer = await stack.cloudly.call_agent_served("restoreClusterService", restore, timeout=60)
    assert await second.terminate() == 0

    assert committed == DATABASE
    assert left == [(1, "running", 1)]
    assert answer == {"restored": backup["snapshots"]}
    assert services.applied_imports(SERVICE_ID) == 1
    assert stack.hits[RouteName.CLOSURE_IMPORT_COMMIT] == 1
    assert services.database_path(SERVICE_ID).read_bytes() == CHANGED
    assert await _runs(stack) == [(1, "succeeded", 1)]
    recorded = await _job(stack, 1)
    assert recorded.result.report.closure.sha256 == hashlib.sha256(DATABASE).hexdigest()


async def test_an_agent_killed_before_corestore_applied_the_commit_resumes_and_imports_once(
    stack: Any, services: Any
) -> None:
    """SIGKILL as the commit reaches Corestore, which drops it with the connection (nothing
    committed): the restarted agent finds the run's import not committed, and the identical
    repeat resumes the run under its keys: the closure imported whole, once."""
    first = await stack.spawn()
    await stack.cloudly.wait_for("cluster-config-read", 1)
    backup = await stack.cloudly.call_agent_served("backupClusterService", _backup(), timeout=60)
    restore = {**_backup(), "snapshots": backup["snapshots"]}
    services.write_database(SERVICE_ID, [b"before the restore"])
    hold = stack.faults.hold_next(RouteName.CLOSURE_IMPORT_COMMIT)
    stack.on_hit(RouteName.CLOSURE_IMPORT_COMMIT, 1, first.kill)
    with pytest.raises(SessionClosed):
        await stack.cloudly.call_agent("restoreClusterService", restore, timeout=60)
    assert await first.wait() == -signal.SIGKILL
    hold.release()  # the connection is gone: the held commit is never handled

    second = await stack.spawn()
    await stack.cloudly.wait_for("cluster-config-read", 2)
    answer = await stack.cloudly.call_agent_served("restoreClusterService", restore, timeout=60)
    assert await second.terminate() == 0

    assert answer == {"restored": backup["snapshots"]}
    assert services.applied_imports(SERVICE_ID) == 1
    assert services.database_path(SERVICE_ID).read_bytes() == DATABASE
    assert await _runs(stack) == [(1, "succeeded", 2)]


async def test_an_archive_restore_is_applied_once_under_its_key(stack: Any, services: Any) -> None:
    """Object storage restored from the archive, the agent killed once Corestore applied it:
    the repeat is answered from the record after Corestore confirms the run's restore key;
    the bucket is not restored over what the service wrote since."""
    services.write_file(SERVICE_ID, "objectstorage", "a.txt", b"bucket a")
    first = await stack.spawn()
    await stack.cloudly.wait_for("cluster-config-read", 1)
    backup = await stack.cloudly.call_agent_served("backupClusterService", _backup(), timeout=60)
    restore = {**_backup(), "snapshots": backup["snapshots"], "resourceTypes": ["objectstorage"]}
    stack.on_handled(RouteName.SERVICE_RESTORE, 1, first.kill)
    with pytest.raises(SessionClosed):
        await stack.cloudly.call_agent("restoreClusterService", restore, timeout=60)
    assert await first.wait() == -signal.SIGKILL
    bucket = services.service_dir(SERVICE_ID) / "objectstorage" / "a.txt"
    bucket.write_bytes(CHANGED)

    second = await stack.spawn()
    await stack.cloudly.wait_for("cluster-config-read", 2)
    answer = await stack.cloudly.call_agent_served("restoreClusterService", restore, timeout=60)
    assert await second.terminate() == 0

    assert [s["type"] for s in answer["restored"]] == ["objectstorage"]
    assert [kind for kind, _, _ in services.applied] == ["restore"]
    assert bucket.read_bytes() == CHANGED
    assert await _runs(stack) == [(1, "succeeded", 1)]
