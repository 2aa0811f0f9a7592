"""Retention: old finished records are forgotten with all they own, in bounded steps, on the
store's clock; everything else stays."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import structlog

from agent.domain.job_machine import JobOp
from agent.domain.jobs import JobKey
from agent.domain.outcomes import JobFailed, Succeeded
from agent.domain.restore_machine import Op
from agent.domain.restores import PreparedPlan, RestoreKey
from agent.errors import RestoreNotFound, StoreError
from agent.store import RevisionStore
from agent.store.retention import DAY_S, Retention, RetentionSettings
from tests.clock import ManualClock
from tests.store.states import node_state, plan

DIGEST = "d" * 64
SHA = "e" * 64
AGE = RetentionSettings(max_age_s=30 * DAY_S, first_delay_s=60.0, interval_s=3600.0)

# The moves that take a new state to each status (the store checks no guard).
_TO_CLEANED = (
    Op.PREPARE_SUCCEEDED,
    Op.STAGE,
    Op.EXECUTE,
    Op.RESTORE_SUCCEEDED,
    Op.VERIFY_PASSED,
    Op.CLEANUP,
    Op.CLEANUP_SUCCEEDED,
)
PATHS: dict[str, tuple[Op, ...]] = {
    "cleaned": _TO_CLEANED,
    "failed": (Op.PREPARE_FAILED,),
    "cleanup-failed": (*_TO_CLEANED[:-1], Op.CLEANUP_FAILED),
    "ready": _TO_CLEANED[:5],
    "staging": _TO_CLEANED[:2],
    "restoring": _TO_CLEANED[:3],
}


def _key(name: str) -> RestoreKey:
    return RestoreKey("cluster-1", "node-1", name)


def _plan(objects: int) -> PreparedPlan:
    wire = plan().to_wire()
    wire["archiveManifest"]["objects"] = [
        {"path": f"snap-1/o-{n:05d}.bin", "size": 4096, "sha256": SHA} for n in range(objects)
    ]
    return PreparedPlan.from_wire(wire)


async def _restore(
    store: RevisionStore, key: RestoreKey, status: str = "cleaned", *, objects: int = 2
) -> None:
    """`key` driven to `status`, with `objects` manifest objects, each staged and written."""
    await store.mutate(
        key, expected_revision=0, op=Op.PREPARE, state=node_state(key), plan=_plan(objects)
    )
    for n in range(objects):
        path = f"snap-1/o-{n:05d}.bin"
        await store.record_chunk(key, path, 0, 4096, SHA)
        await store.mark_object_written(key, path, 4096, SHA)
    for revision, op in enumerate(PATHS[status], start=1):
        await store.mutate(key, expected_revision=revision, op=op)


async def _job(store: RevisionStore, key: JobKey, finish: JobOp | None = JobOp.SUCCEED) -> JobKey:
    started = await store.move_job(key, op=JobOp.START, expected_revision=0, digest=DIGEST)
    if finish is not None:
        result = Succeeded({}) if finish is JobOp.SUCCEED else JobFailed("x", "x", retryable=True)
        await store.move_job(
            started.key, op=finish, expected_revision=1, digest=DIGEST, result=result
        )
    return started.key


def _rows(path: Path) -> dict[str, int]:
    tables = ("restore_state", "restore_plan", "manifest_object", "staged_chunk", "staged_object")
    with sqlite3.connect(path) as raw:
        counts = {t: raw.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in tables}  # noqa: S608
    raw.close()
    return counts


def _retention(store: RevisionStore, clock: ManualClock, **pace: Any) -> Retention:
    settings = RetentionSettings(max_age_s=AGE.max_age_s, **pace)
    return Retention(store, settings, clock=clock)


async def test_a_cleaned_restore_past_the_age_is_forgotten_with_all_it_owns(
    store: RevisionStore, clock: ManualClock
) -> None:
    """State, plan, manifest rows and staging rows: nothing of it is left."""
    await _restore(store, _key("old"))
    clock.advance(AGE.max_age_s + 1)
    outcome = await _retention(store, clock).sweep()
    assert (outcome.restores, await store.get(_key("old"))) == (1, None)
    with pytest.raises(RestoreNotFound):
        await store.plan(_key("old"))
    assert set(_rows(store.path).values()) == {0}


async def test_a_cleaned_restore_within_the_age_is_kept(
    store: RevisionStore, clock: ManualClock
) -> None:
    """Changed less than `max_age_s` ago: it stays, plan and all."""
    await _restore(store, _key("recent"))
    clock.advance(AGE.max_age_s - 1)
    outcome = await _retention(store, clock).sweep()
    assert outcome.restores == 0
    assert (await store.plan(_key("recent"))).archive_manifest.objects


@pytest.mark.parametrize("status", ["failed", "cleanup-failed", "ready", "staging", "restoring"])
async def test_a_restore_not_cleaned_is_kept_whatever_its_age(
    store: RevisionStore, clock: ManualClock, status: str
) -> None:
    """Only `cleaned` is final: a failed or cleanup-failed state still waits for its cleanup."""
    await _restore(store, _key("kept"), status)
    clock.advance(10 * AGE.max_age_s)
    await _retention(store, clock).sweep()
    kept = await store.get(_key("kept"))
    assert kept is not None
    assert kept.status == status
    assert _rows(store.path)["manifest_object"] == 2


async def test_finished_jobs_past_the_age_are_forgotten(
    store: RevisionStore, clock: ManualClock
) -> None:
    """A succeeded and a failed backup, changed too long ago: both go."""
    await _job(store, JobKey("cluster-1", "node-1", "backup", "bk-1", "svc-1"))
    await _job(store, JobKey("cluster-1", "node-1", "backup", "bk-2", "svc-1"), JobOp.FAIL)
    clock.advance(AGE.max_age_s + 1)
    outcome = await _retention(store, clock).sweep()
    assert (outcome.jobs, await store.list_jobs()) == (2, [])


async def test_a_running_job_is_kept_whatever_its_age(
    store: RevisionStore, clock: ManualClock
) -> None:
    """A backup left running (it resumes on Cloudly's repeat) is not finished."""
    await _job(store, JobKey("cluster-1", "node-1", "backup", "bk-1", "svc-1"), finish=None)
    clock.advance(10 * AGE.max_age_s)
    await _retention(store, clock).sweep()
    assert [job.status for job in await store.list_jobs()] == ["running"]


async def test_the_latest_restore_run_of_a_service_is_kept_so_runs_are_never_renumbered(
    store: RevisionStore, clock: ManualClock
) -> None:
    """Runs 1 and 2 old: run 1 goes, run 2 stays, and the next restore is run 3."""
    restore = JobKey("cluster-1", "node-1", "restore", "bk-1", "svc-1")
    await _job(store, restore)
    await _job(store, restore)
    clock.advance(AGE.max_age_s + 1)
    await _retention(store, clock).sweep()
    kept = [job.key.run for job in await store.list_jobs()]
    assert (kept, (await _job(store, restore)).run) == ([2], 3)


async def test_one_step_deletes_no_more_than_its_batch_of_rows(
    store: RevisionStore, clock: ManualClock
) -> None:
    """A restore owning 90 rows, steps of 10: the first step deletes 10 and the state stays."""
    await _restore(store, _key("big"), objects=30)
    clock.advance(AGE.max_age_s + 1)
    cutoff = int(clock.time() * 1000) - int(AGE.max_age_s * 1000)
    step = await store.forget_expired(cutoff, rows=10)
    assert (step.rows, step.restores, step.done) == (10, 0, False)
    assert await store.get(_key("big")) is not None


async def test_a_pass_steps_until_everything_expired_is_gone(
    store: RevisionStore, clock: ManualClock
) -> None:
    """Small steps over several restores and jobs: the pass ends with nothing expired left."""
    for name in ("a", "b", "c"):
        await _restore(store, _key(name), objects=7)
    await _job(store, JobKey("cluster-1", "node-1", "backup", "bk-1", "svc-1"))
    clock.advance(AGE.max_age_s + 1)
    outcome = await _retention(store, clock, batch_rows=5).sweep()
    assert (outcome.restores, outcome.jobs) == (3, 1)
    assert outcome.steps > outcome.rows // 5
    assert set(_rows(store.path).values()) == {0}


async def test_the_database_file_shrinks_once_the_pages_are_given_back(
    store: RevisionStore, clock: ManualClock
) -> None:
    """Forgetting many large manifests frees pages; the pass returns them to the disk."""
    for name in range(20):
        await _restore(store, _key(f"r-{name}"), objects=200)
    await store.checkpoint()
    before = store.file_bytes()
    clock.advance(AGE.max_age_s + 1)
    outcome = await _retention(store, clock).sweep()
    assert outcome.freed_bytes > 0
    assert store.file_bytes() < before - outcome.freed_bytes // 2


class Heard:
    """A `StoreObserver` that keeps what retention reported."""

    def __init__(self) -> None:
        self.deleted: list[tuple[str, int]] = []
        self.freed: list[int] = []
        self.failed = 0
        self.passed = asyncio.Event()

    def retention_deleted(self, *, what: str, count: int) -> None:
        self.deleted.append((what, count))
        self.passed.set()

    def retention_freed(self, *, count: int) -> None:
        self.freed.append(count)

    def retention_failed(self) -> None:
        self.failed += 1


async def test_a_pass_reports_what_it_forgot_and_freed(
    store: RevisionStore, clock: ManualClock
) -> None:
    """One restore and one job: counted by kind; the bytes given back are reported too."""
    await _restore(store, _key("old"), objects=300)
    await _job(store, JobKey("cluster-1", "node-1", "backup", "bk-1", "svc-1"))
    clock.advance(AGE.max_age_s + 1)
    heard = Heard()
    await Retention(store, AGE, clock=clock, observer=heard).sweep()  # type: ignore[arg-type]
    assert sorted(heard.deleted) == [("job", 1), ("restore", 1)]
    assert sum(heard.freed) > 0


async def test_the_first_pass_comes_after_its_delay_and_the_next_an_interval_later(
    store: RevisionStore, clock: ManualClock
) -> None:
    """On the injected clock: sleep `first_delay_s`, pass, sleep `interval_s`."""
    await _restore(store, _key("old"))
    clock.advance(AGE.max_age_s + 1)
    heard = Heard()
    retention = Retention(store, AGE, clock=clock, observer=heard)  # type: ignore[arg-type]
    task = asyncio.create_task(retention.run())
    try:
        first = await clock.next_wakeup() - clock.monotonic()
        assert not heard.passed.is_set()
        clock.advance(first)
        await asyncio.wait_for(heard.passed.wait(), 10)
        then = await clock.next_wakeup() - clock.monotonic()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert (first, then, heard.deleted) == (60.0, 3600.0, [("restore", 1)])


async def test_a_pass_that_fails_is_logged_and_the_next_one_comes_at_its_time(
    store: RevisionStore, clock: ManualClock
) -> None:
    """The store closed under it: the pass is logged and counted (a metric), the task lives
    on until the next one."""
    heard = Heard()
    retention = Retention(store, AGE, clock=clock, observer=heard)  # type: ignore[arg-type]
    task = asyncio.create_task(retention.run())
    try:
        await store.aclose()
        with structlog.testing.capture_logs() as logs:
            clock.advance(await clock.next_wakeup() - clock.monotonic())
            then = await asyncio.wait_for(clock.next_wakeup(), 10) - clock.monotonic()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert then == 3600.0
    assert [(e["event"], e["code"]) for e in logs] == [("retention_pass_failed", StoreError.code)]
    assert heard.failed == 1
