"""Migration 3 on a database an earlier agent wrote: every relay job row comes over, restores
get run numbers, and a restore left `running` (interrupted) is recorded failed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent.domain.job_machine import JobOp
from agent.domain.jobs import JobKey
from agent.domain.outcomes import result_from_json
from agent.errors import RevisionConflict
from agent.relay.runner import INTERRUPTED
from agent.store import DB_NAME, RevisionStore
from agent.store.schema import MIGRATIONS
from agent.store.startup import open_database
from tests.clock import ManualClock

DIGEST = "d" * 64
RESULT = json.dumps({"response": {"restored": []}, "report": {}})

# What schema 2 held: (kind, backupId, serviceId, revision, status, result, created_at).
V2_ROWS = [
    ("backup", "bk-1", "svc-1", 2, "succeeded", RESULT, 100),
    ("backup", "bk-2", "svc-1", 1, "running", None, 150),
    ("restore", "bk-2", "svc-1", 2, "succeeded", RESULT, 300),
    ("restore", "bk-1", "svc-1", 2, "succeeded", RESULT, 200),
    # schema 2 let two restores of one service run at once (other backups): both interrupted
    ("restore", "bk-1", "svc-2", 1, "running", None, 400),
    ("restore", "bk-2", "svc-2", 1, "running", None, 500),
]


async def _schema_2_database(state_dir: Path, clock: ManualClock) -> None:
    db = await open_database(
        state_dir / DB_NAME, busy_timeout=1, clock=clock, migrations=MIGRATIONS[:2]
    )
    try:
        await db.executemany(
            "INSERT INTO relay_job (cluster_id, node_id, kind, backup_id, service_id, revision, "
            "status, request_digest, result_json, attempts, created_at, updated_at) "
            "VALUES ('c1', 'n1', ?, ?, ?, ?, ?, ?, ?, 1, ?, ?)",
            [
                (kind, backup, service, revision, status, DIGEST, result, created, created)
                for kind, backup, service, revision, status, result, created in V2_ROWS
            ],
        )
    finally:
        await db.close()


def _row(job: Any) -> tuple[Any, ...]:
    key = job.key
    return (key.kind, key.backup_id, key.service_id, key.run, job.revision, job.status)


@pytest.fixture
async def migrated(state_dir: Path, clock: ManualClock) -> RevisionStore:
    await _schema_2_database(state_dir, clock)
    return await RevisionStore.open(state_dir, clock=clock)


async def test_every_row_comes_over_and_restores_are_numbered_in_creation_order(
    migrated: RevisionStore,
) -> None:
    """Backups keep run 0 and their status (a `running` backup still resumes); each service's
    restores are numbered 1, 2, ... in the order they were created."""
    async with migrated as store:
        jobs = sorted(_row(job) for job in await store.list_jobs())
    assert jobs == [
        ("backup", "bk-1", "svc-1", 0, 2, "succeeded"),
        ("backup", "bk-2", "svc-1", 0, 1, "running"),
        ("restore", "bk-1", "svc-1", 1, 2, "succeeded"),
        ("restore", "bk-1", "svc-2", 1, 2, "failed"),
        ("restore", "bk-2", "svc-1", 2, 2, "succeeded"),
        ("restore", "bk-2", "svc-2", 2, 2, "failed"),
    ]


async def test_a_restore_left_running_is_recorded_interrupted(migrated: RevisionStore) -> None:
    """The interrupted runs carry the runner's `shutting-down` error (retryable), and no run of
    the service is `running` any more; finished rows keep their recorded result."""
    async with migrated as store:
        by_key = {
            (job.key.kind, job.key.backup_id, job.key.service_id): job
            for job in await store.list_jobs()
        }
        running = await store.running_restore("c1", "n1", "svc-2")
    assert by_key[("restore", "bk-1", "svc-2")].result == INTERRUPTED
    assert by_key[("restore", "bk-2", "svc-2")].result == INTERRUPTED
    assert by_key[("restore", "bk-1", "svc-1")].result == result_from_json(json.loads(RESULT))
    assert running is None


async def test_after_the_migration_one_restore_per_service_may_run(
    migrated: RevisionStore,
) -> None:
    """The next restore of a migrated service is its next run; a second while it runs is
    refused by the schema."""
    key = JobKey("c1", "n1", "restore", "bk-1", "svc-2")
    async with migrated as store:
        started = await store.move_job(key, op=JobOp.START, expected_revision=0, digest=DIGEST)
        with pytest.raises(RevisionConflict):
            await store.move_job(key, op=JobOp.START, expected_revision=0, digest=DIGEST)
    assert (started.key.run, started.status) == (3, "running")
