"""The store's status summary: per status how many rows and how old the oldest change is."""

from __future__ import annotations

from agent.domain.job_machine import JobOp
from agent.domain.jobs import JobKey
from agent.domain.restore_machine import Op
from agent.store import RevisionStore
from tests.clock import ManualClock
from tests.store.states import KEY, node_state, plan

NOW_MS = 1_700_000_000_000  # the fixtures' clock


async def test_an_empty_store_summarises_to_nothing(store: RevisionStore) -> None:
    """No node state and no job: both maps are empty."""
    summary = await store.status_summary()
    assert (summary.restores, summary.jobs) == ({}, {})


async def test_the_summary_says_how_large_the_database_files_are(store: RevisionStore) -> None:
    """The database file and its WAL, in bytes, as on disk now."""
    summary = await store.status_summary()
    wal = store.path.with_name(store.path.name + "-wal")
    on_disk = store.path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)
    assert summary.database_bytes == on_disk > 0


async def test_the_summary_counts_each_status_with_its_oldest_change(
    store: RevisionStore, clock: ManualClock
) -> None:
    """Node states by status and jobs by (kind, status), each with the `updated_at` of the
    least recently changed row."""
    await store.mutate(
        KEY,
        expected_revision=0,
        op=Op.PREPARE,
        state=node_state(),
        plan=plan(),
        request_digest="a" * 64,
    )
    backup = JobKey("cluster-1", "node-1", "backup", "bk-1", "svc-1")
    other = JobKey("cluster-1", "node-1", "backup", "bk-2", "svc-1")
    await store.move_job(backup, op=JobOp.START, expected_revision=0, digest="b" * 64)
    clock.advance(60)
    await store.move_job(other, op=JobOp.START, expected_revision=0, digest="c" * 64)
    summary = await store.status_summary()
    assert summary.restores == {"preparing": (1, NOW_MS)}
    assert summary.jobs == {("backup", "running"): (2, NOW_MS)}
