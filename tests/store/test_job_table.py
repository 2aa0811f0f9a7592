"""The relay jobs table: compare-and-swap moves from the job table, recorded outcomes, survival
across a reopen, and what a row refuses to hold."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.domain.job_machine import JobOp
from agent.domain.jobs import JobKey
from agent.domain.outcomes import JobFailed, JobReport, Succeeded
from agent.errors import IllegalTransition, InvalidState, RevisionConflict
from agent.secret import Secret
from agent.store import RevisionStore

KEY = JobKey("cluster-1", "node-1", "backup", "bk-1", "svc-1")
DIGEST, OTHER = "a" * 64, "b" * 64


async def test_start_creates_a_running_job_at_revision_one(store: RevisionStore) -> None:
    """`start` from nothing writes `running`, revision 1, attempt 1, no result."""
    job = await store.move_job(KEY, op=JobOp.START, expected_revision=0, digest=DIGEST)
    assert (job.status, job.revision, job.attempts, job.result) == ("running", 1, 1, None)
    assert await store.get_job(KEY) == job


async def test_succeed_records_the_result(store: RevisionStore) -> None:
    """`succeed` stores the outcome with the next revision; `get_job` reads it back."""
    await store.move_job(KEY, op=JobOp.START, expected_revision=0, digest=DIGEST)
    result = Succeeded({"snapshots": []}, JobReport(snapshots=0))
    job = await store.move_job(
        KEY, op=JobOp.SUCCEED, expected_revision=1, digest=DIGEST, result=result
    )
    assert (job.status, job.revision, job.result) == ("succeeded", 2, result)


async def test_a_second_start_of_one_key_is_a_revision_conflict(store: RevisionStore) -> None:
    """Two starts of one key: exactly one wins, in SQL."""
    await store.move_job(KEY, op=JobOp.START, expected_revision=0, digest=DIGEST)
    with pytest.raises(RevisionConflict):
        await store.move_job(KEY, op=JobOp.START, expected_revision=0, digest=DIGEST)


async def test_a_move_under_another_digest_changes_nothing(store: RevisionStore) -> None:
    """Only the request that owns the key moves its job."""
    await store.move_job(KEY, op=JobOp.START, expected_revision=0, digest=DIGEST)
    with pytest.raises(RevisionConflict):
        await store.move_job(KEY, op=JobOp.FAIL, expected_revision=1, digest=OTHER)
    job = await store.get_job(KEY)
    assert job is not None
    assert (job.status, job.revision) == ("running", 1)


async def test_an_illegal_move_is_refused_and_changes_nothing(store: RevisionStore) -> None:
    """`retry` of a running job is not in the table: `illegal-transition`, the row unchanged."""
    await store.move_job(KEY, op=JobOp.START, expected_revision=0, digest=DIGEST)
    with pytest.raises(IllegalTransition):
        await store.move_job(KEY, op=JobOp.RETRY, expected_revision=1, digest=DIGEST)
    job = await store.get_job(KEY)
    assert job is not None
    assert (job.status, job.revision) == ("running", 1)


async def test_retry_after_a_failure_runs_again_and_forgets_the_old_error(
    store: RevisionStore,
) -> None:
    """`failed` -> `retry` -> `running`: a new attempt, the recorded error dropped."""
    await store.move_job(KEY, op=JobOp.START, expected_revision=0, digest=DIGEST)
    error = JobFailed("corestore-unavailable", "x", retryable=True)
    await store.move_job(KEY, op=JobOp.FAIL, expected_revision=1, digest=DIGEST, result=error)
    job = await store.move_job(KEY, op=JobOp.RETRY, expected_revision=2, digest=DIGEST)
    assert (job.status, job.attempts, job.result) == ("running", 2, None)


async def test_a_running_job_survives_a_reopen_and_is_listed_unfinished(
    store: RevisionStore, state_dir: Path
) -> None:
    """A job left `running` is there after the store is closed and opened again."""
    await store.move_job(KEY, op=JobOp.START, expected_revision=0, digest=DIGEST)
    await store.aclose()
    async with await RevisionStore.open(state_dir) as reopened:
        assert [job.key for job in await reopened.list_jobs("running")] == [KEY]


async def test_a_result_holding_a_secret_is_never_written(store: RevisionStore) -> None:
    """A `Secret` anywhere in a result is refused before SQL runs; the job stays as it was."""
    await store.move_job(KEY, op=JobOp.START, expected_revision=0, digest=DIGEST)
    with pytest.raises(InvalidState):
        await store.move_job(
            KEY,
            op=JobOp.SUCCEED,
            expected_revision=1,
            digest=DIGEST,
            result=Succeeded({"token": Secret("s3cret")}),  # type: ignore[dict-item]
        )
    job = await store.get_job(KEY)
    assert job is not None
    assert job.status == "running"


def test_a_key_names_one_of_the_two_kinds() -> None:
    """A job key's kind is `backup` or `restore`."""
    with pytest.raises(InvalidState):
        JobKey("c", "n", "prune", "b", "s")  # type: ignore[arg-type]


# --- restores: one row per run ------------------------------------------------------------------

RESTORE = JobKey("cluster-1", "node-1", "restore", "bk-1", "svc-1")
FAILED = JobFailed("corestore-unavailable", "x", retryable=True)


async def _finished_run(store: RevisionStore, key: JobKey, digest: str = DIGEST) -> JobKey:
    """Start a restore run of `key` and let it fail; its numbered key."""
    job = await store.move_job(key, op=JobOp.START, expected_revision=0, digest=digest)
    await store.move_job(job.key, op=JobOp.FAIL, expected_revision=1, digest=digest, result=FAILED)
    return job.key


async def test_each_restore_start_is_the_services_next_run(store: RevisionStore) -> None:
    """Restores of one service on one node are numbered 1, 2, 3, whichever backup each
    restores; another service or node counts from 1."""
    first = await _finished_run(store, RESTORE)
    second = await _finished_run(store, RESTORE, OTHER)
    third = await _finished_run(store, JobKey("cluster-1", "node-1", "restore", "bk-2", "svc-1"))
    other_service = await _finished_run(
        store, JobKey("cluster-1", "node-1", "restore", "bk-1", "svc-2")
    )
    other_node = await _finished_run(
        store, JobKey("cluster-1", "node-2", "restore", "bk-1", "svc-1")
    )
    assert [key.run for key in (first, second, third, other_service, other_node)] == [
        1,
        2,
        3,
        1,
        1,
    ]
    assert [job.status for job in await store.list_jobs()] == ["failed"] * 5


async def test_a_second_running_restore_of_one_service_is_refused_in_sql(
    store: RevisionStore,
) -> None:
    """While a run of the service is `running`, starting another (any backup, any body) is a
    revision conflict and writes nothing; the running run is what `running_restore` reads."""
    running = await store.move_job(RESTORE, op=JobOp.START, expected_revision=0, digest=DIGEST)
    other_backup = JobKey("cluster-1", "node-1", "restore", "bk-2", "svc-1")
    with pytest.raises(RevisionConflict):
        await store.move_job(other_backup, op=JobOp.START, expected_revision=0, digest=OTHER)
    assert await store.running_restore("cluster-1", "node-1", "svc-1") == running
    assert await store.list_jobs() == [running]


async def test_a_start_names_run_0_and_a_backup_never_has_a_run() -> None:
    """Run numbers are the store's: a key given to `start` carries 0, a backup's is always 0."""
    with pytest.raises(InvalidState):
        JobKey("c", "n", "backup", "b", "s", run=1)
    with pytest.raises(InvalidState):
        JobKey("c", "n", "restore", "b", "s", run=-1)


async def test_a_restore_start_with_a_run_number_is_refused(store: RevisionStore) -> None:
    """`start` numbers the run itself; a key that names one is a bug, refused before SQL."""
    with pytest.raises(InvalidState):
        await store.move_job(
            RESTORE.numbered(7), op=JobOp.START, expected_revision=0, digest=DIGEST
        )
    assert await store.list_jobs() == []
