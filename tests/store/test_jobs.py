"""The relay jobs table: compare-and-swap moves from the job table, recorded outcomes, survival
across a reopen, and what a row refuses to hold."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.errors import IllegalTransition, InvalidState, RevisionConflict
from agent.relay.machine import JobOp
from agent.secret import Secret
from agent.store import JobKey, RevisionStore

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
    result = {"response": {"snapshots": []}, "report": {"snapshots": 0}}
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
    error = {"error": {"code": "corestore-unavailable", "message": "x", "retryable": True}}
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
            result={"response": {"token": Secret("s3cret")}},
        )
    job = await store.get_job(KEY)
    assert job is not None
    assert job.status == "running"


def test_a_key_names_one_of_the_two_kinds() -> None:
    """A job key's kind is `backup` or `restore`."""
    with pytest.raises(InvalidState):
        JobKey("c", "n", "prune", "b", "s")  # type: ignore[arg-type]
