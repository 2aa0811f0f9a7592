"""`JobRunner`'s answer to repeated requests, on a real state database and work a test holds.

A restore runs for every request: again after one finished, never answered from a record; the
identical request joins a running one, any other for the service is `restore-in-progress`
(retryable) until it ended. A restore the store holds `running` with no work in this process
(the agent stopped) is recorded interrupted and the next request is a new run. A backup is
answered from its record. No test sleeps: work waits on events the test sets.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agent.domain.job_machine import JobOp
from agent.domain.jobs import JobKey
from agent.errors import RestoreInProgress, ShuttingDown
from agent.relay.runner import INTERRUPTED, JobRunner, Outcome, Work
from agent.store import RevisionStore
from tests.relay._runners import running

RESTORE = JobKey("cluster-1", "node-1", "restore", "bk-1", "svc-1")
OTHER_BACKUP = JobKey("cluster-1", "node-1", "restore", "bk-2", "svc-1")
BACKUP = JobKey("cluster-1", "node-1", "backup", "bk-1", "svc-1")
A, B = "a" * 64, "b" * 64


class Works:
    """Work the test controls: each run records its key, then waits for `release` (set by
    default: the work ends at once)."""

    def __init__(self) -> None:
        self.runs: list[JobKey] = []
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.release.set()

    async def start(self) -> Work:
        async def work(job: JobKey) -> Outcome:
            self.runs.append(job)
            self.started.set()
            await self.release.wait()
            return {"restored": [{"run": job.run}]}, {"works": len(self.runs)}

        return work

    def hold(self) -> None:
        """The next runs wait until `release` is set."""
        self.release.clear()
        self.started.clear()


def _rows(jobs: list[Any]) -> list[tuple[str, int, str]]:
    return [(job.key.backup_id, job.key.run, job.status) for job in jobs]


async def test_a_restore_runs_again_after_one_finished(
    runner: JobRunner, store: RevisionStore
) -> None:
    """The same request twice, one after the other: two runs, each answered with its own work,
    each recorded; nothing is answered from the first run's record."""
    works = Works()
    first = await runner.submit(RESTORE, A, works.start)
    second = await runner.submit(RESTORE, A, works.start)
    assert (first, second) == ({"restored": [{"run": 1}]}, {"restored": [{"run": 2}]})
    assert [job.run for job in works.runs] == [1, 2]
    assert _rows(await store.list_jobs()) == [("bk-1", 1, "succeeded"), ("bk-1", 2, "succeeded")]


async def test_an_identical_restore_while_one_runs_joins_it(
    runner: JobRunner, store: RevisionStore
) -> None:
    """The repeat that arrives while the run works gets the same outcome; nothing runs twice."""
    works = Works()
    works.hold()
    first = asyncio.create_task(runner.submit(RESTORE, A, works.start))
    await works.started.wait()
    second = asyncio.create_task(runner.submit(RESTORE, A, works.start))
    works.release.set()
    assert await first == await second == {"restored": [{"run": 1}]}
    assert len(works.runs) == 1
    assert _rows(await store.list_jobs()) == [("bk-1", 1, "succeeded")]


@pytest.mark.parametrize(
    ("key", "digest"), [(RESTORE, B), (OTHER_BACKUP, A)], ids=["other-body", "other-backup"]
)
async def test_another_restore_of_the_service_while_one_runs_is_refused_busy(
    runner: JobRunner, store: RevisionStore, key: JobKey, digest: str
) -> None:
    """Another body for the same backup, or another backup of the service: refused
    `restore-in-progress`, retryable, naming the running run; nothing is stored for it. Once
    the run ended, the same request runs."""
    works = Works()
    works.hold()
    first = asyncio.create_task(runner.submit(RESTORE, A, works.start))
    await works.started.wait()
    with pytest.raises(RestoreInProgress) as busy:
        await runner.submit(key, digest, works.start)
    stored_while_busy = _rows(await store.list_jobs())
    works.release.set()
    await first
    after = await runner.submit(key, digest, works.start)
    assert (busy.value.code, busy.value.retryable, busy.value.data) == (
        "restore-in-progress",
        True,
        {"run": 1},
    )
    assert stored_while_busy == [("bk-1", 1, "running")]
    assert after == {"restored": [{"run": 2}]}
    assert [job.backup_id for job in works.runs] == ["bk-1", key.backup_id]


async def test_a_restore_left_running_is_recorded_interrupted_at_start_up(
    store: RevisionStore,
) -> None:
    """A run a stopped agent left `running` is `failed` with the interrupted error by the
    runner's start-up, before any request came; the next request is run 2, not a resume."""
    stale = await store.move_job(RESTORE, op=JobOp.START, expected_revision=0, digest=A)
    async for _ in running(store):
        pass  # started and stopped: `run()` ends only after its start-up report
    interrupted = await store.get_job(stale.key)
    async for runner in running(store):
        answer = await runner.submit(RESTORE, A, Works().start)
    assert interrupted is not None
    assert (interrupted.status, interrupted.result) == ("failed", INTERRUPTED)
    assert answer == {"restored": [{"run": 2}]}


async def test_a_request_settles_a_run_nobody_works_on_before_it_starts(
    runner: JobRunner, store: RevisionStore
) -> None:
    """A `running` row with no work in this process (written behind the runner's back, as a
    request racing start-up would find it) is recorded interrupted by the next request, which
    then runs."""
    stale = await store.move_job(RESTORE, op=JobOp.START, expected_revision=0, digest=B)
    answer = await runner.submit(RESTORE, A, Works().start)
    settled = await store.get_job(stale.key)
    assert settled is not None
    assert (settled.status, settled.result) == ("failed", INTERRUPTED)
    assert answer == {"restored": [{"run": 2}]}


async def test_a_restore_stopped_with_the_agent_tells_its_callers_to_repeat(
    store: RevisionStore,
) -> None:
    """`close()` cancels a running restore: its caller gets `shutting-down`, retryable, and the
    row stays `running` until the next start-up records it interrupted."""
    works = Works()
    works.hold()
    async for runner in running(store):
        caller = asyncio.create_task(runner.submit(RESTORE, A, works.start))
        await works.started.wait()
    with pytest.raises(ShuttingDown, match="restore anew"):
        await caller
    assert _rows(await store.list_jobs()) == [("bk-1", 1, "running")]


async def test_a_repeated_backup_is_answered_from_its_record(
    runner: JobRunner, store: RevisionStore
) -> None:
    """One backupId is one backup: the repeat gets the recorded response and nothing runs."""
    works = Works()
    first = await runner.submit(BACKUP, A, works.start)
    second = await runner.submit(BACKUP, A, works.start)
    assert first == second
    assert len(works.runs) == 1
    assert _rows(await store.list_jobs()) == [("bk-1", 0, "succeeded")]
