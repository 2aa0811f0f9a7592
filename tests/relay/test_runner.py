"""`JobRunner`'s answer to repeated requests, on a real state database and work a test holds.

A restore's identical repeat is answered from its record while the run's answer was not
delivered to Cloudly before the repeat came (the ping rule), and runs again once it was; the
identical request joins a running one, any other for the service is `restore-in-progress`
(retryable) until it ended. A restore the store holds `running` with no work in this process
(the agent stopped) is reconciled with Corestore by its keys before anything runs again:
recorded done when every effect was applied, else resumed under its keys by the identical
request, or recorded interrupted when another comes. A backup is answered from its record. No
test sleeps: work waits on events the test sets.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agent.domain.job_machine import JobOp
from agent.domain.jobs import JobKey, StoredJob
from agent.domain.outcomes import (
    ClosureFacts,
    Failed,
    JobReport,
    RestoreEffects,
    RunPlan,
    Succeeded,
)
from agent.errors import CorestoreUnavailable, IntegrityError, RestoreInProgress, ShuttingDown
from agent.relay.runner import INTERRUPTED, JobRunner, Started
from agent.store import RevisionStore
from tests.relay._runners import Session, Works, running

RESTORE = JobKey("cluster-1", "node-1", "restore", "bk-1", "svc-1")
OTHER_BACKUP = JobKey("cluster-1", "node-1", "restore", "bk-2", "svc-1")
BACKUP = JobKey("cluster-1", "node-1", "backup", "bk-1", "svc-1")
A, B = "a" * 64, "b" * 64
PLAN = RunPlan(
    RestoreEffects(closure_import="closure-k1", archive_restore="restore-k1"),
    Succeeded({"restored": [{"planned": True}]}, JobReport(resource_types=("database", "volume"))),
)


def _rows(jobs: list[Any]) -> list[tuple[str, int, str]]:
    return [(job.key.backup_id, job.key.run, job.status) for job in jobs]


async def _left_running(store: RevisionStore, digest: str = A, plan: RunPlan | None = PLAN) -> Any:
    """A restore run a stopped agent left `running` (its plan stored with it)."""
    return await store.move_job(
        RESTORE, op=JobOp.START, expected_revision=0, digest=digest, plan=plan
    )


class Reconciler:
    """Corestore's answer to a reconciliation: every effect applied (the closure's facts), or
    not; `down` makes it unreachable."""

    def __init__(self, applied: bool, *, down: bool = False) -> None:
        self.applied, self.down = applied, down
        self.asked: list[StoredJob] = []

    async def __call__(self, stored: StoredJob) -> Succeeded | None:
        self.asked.append(stored)
        if self.down:
            raise CorestoreUnavailable("Corestore did not answer")
        if not self.applied or stored.plan is None:
            return None
        report = stored.plan.planned.report.with_closure(ClosureFacts(5, "f" * 64))
        return Succeeded(stored.plan.planned.response, report)


# --- the ping rule: answered from the record until the answer was delivered ------------------


async def test_a_restore_runs_again_once_its_answer_was_delivered(
    runner: JobRunner, store: RevisionStore
) -> None:
    """The same request twice, the first answer delivered before the second came: two runs,
    each answered with its own work, each recorded, the first as delivered."""
    works, session = Works(), Session()
    first = await runner.submit(RESTORE, A, works.start, requester=session.request())
    second = await runner.submit(RESTORE, A, works.start, requester=session.request())
    assert (first, second) == ({"restored": [{"run": 1}]}, {"restored": [{"run": 2}]})
    assert [job.run for job in works.keys] == [1, 2]
    assert _rows(await store.list_jobs()) == [("bk-1", 1, "succeeded"), ("bk-1", 2, "succeeded")]
    assert session.settles == 2


async def test_an_identical_restore_whose_answer_was_lost_is_answered_from_the_record(
    runner: JobRunner, store: RevisionStore
) -> None:
    """The session dropped before the answer was known delivered: the identical repeat gets
    the recorded answer and nothing runs (no second import). Once that answer is delivered,
    the next identical request runs again."""
    works, session = Works(), Session(auto=False)
    first = await runner.submit(RESTORE, A, works.start, requester=session.request())
    session.reconnect()  # the answer never got its pong
    session.auto = True
    repeat = await runner.submit(RESTORE, A, works.start, requester=session.request())
    again = await runner.submit(RESTORE, A, works.start, requester=session.request())
    assert first == repeat == {"restored": [{"run": 1}]}
    assert again == {"restored": [{"run": 2}]}
    assert [job.run for job in works.keys] == [1, 2]


async def test_a_repeat_read_before_the_answers_pong_is_answered_from_the_record(
    runner: JobRunner,
) -> None:
    """The answer's pong came after the repeat on the same connection: Cloudly sent the repeat
    before it held the answer, so it is a repeat of that run, answered from its record."""
    works, session = Works(), Session(auto=False)
    await runner.submit(RESTORE, A, works.start, requester=session.request())
    repeat = session.request()  # read before the pong below
    session.deliver()
    answer = await runner.submit(RESTORE, A, works.start, requester=repeat)
    assert answer == {"restored": [{"run": 1}]}
    assert len(works.runs) == 1


async def test_another_request_after_an_undelivered_answer_runs(runner: JobRunner) -> None:
    """Only the identical request is a repeat: another body for the service runs at once."""
    works, session = Works(), Session(auto=False)
    await runner.submit(RESTORE, A, works.start, requester=session.request())
    answer = await runner.submit(RESTORE, B, works.start, requester=session.request())
    assert answer == {"restored": [{"run": 2}]}


async def test_a_failed_restore_whose_answer_was_lost_is_answered_with_its_recorded_error(
    runner: JobRunner,
) -> None:
    """A run that failed after it may have changed something: its undelivered error is the
    repeat's answer (the same code and retryability), and nothing runs again."""
    session, calls = Session(auto=False), []

    async def start(resumed: RunPlan | None) -> Started:
        async def work(job: JobKey, plan: RunPlan | None) -> Succeeded:
            calls.append(job)
            raise IntegrityError("the archive restore did not match")

        return Started(work, PLAN)

    with pytest.raises(IntegrityError):
        await runner.submit(RESTORE, A, start, requester=session.request())
    session.reconnect()
    with pytest.raises(Exception) as repeated:  # its class is the record's
        await runner.submit(RESTORE, A, start, requester=session.request())
    assert (repeated.value.code, repeated.value.retryable) == ("integrity-mismatch", True)  # type: ignore[attr-defined]
    assert str(repeated.value) == "the archive restore did not match"
    assert len(calls) == 1


async def test_a_delivery_survives_a_restart(store: RevisionStore) -> None:
    """Recorded in the store: after a restart the identical request runs again (the answer
    was delivered in the earlier process, before anything this one reads)."""
    works = Works()
    async for runner in running(store):
        await runner.submit(RESTORE, A, works.start, requester=Session().request())
    first = await store.get_job(RESTORE.numbered(1))
    async for runner in running(store):
        answer = await runner.submit(RESTORE, A, works.start, requester=Session().request())
    assert first is not None
    assert first.delivered_at is not None
    assert answer == {"restored": [{"run": 2}]}


async def test_an_undelivered_answer_stays_undelivered_across_a_restart(
    store: RevisionStore,
) -> None:
    """Never known delivered: after a restart the identical request is still answered from
    the record."""
    works = Works()
    async for runner in running(store):
        await runner.submit(RESTORE, A, works.start, requester=Session(auto=False).request())
    async for runner in running(store):
        answer = await runner.submit(RESTORE, A, works.start, requester=Session().request())
    assert answer == {"restored": [{"run": 1}]}
    assert len(works.runs) == 1


# --- joining and refusing while a run works -------------------------------------------------


async def test_an_identical_restore_while_one_runs_joins_it(
    runner: JobRunner, store: RevisionStore
) -> None:
    """The repeat that arrives while the run works gets the same outcome; nothing runs twice;
    either answer delivered counts."""
    works, session = Works(), Session(auto=False)
    works.hold()
    first = asyncio.create_task(runner.submit(RESTORE, A, works.start, requester=session.request()))
    await works.started.wait()
    second = asyncio.create_task(
        runner.submit(RESTORE, A, works.start, requester=session.request())
    )
    works.release.set()
    assert await first == await second == {"restored": [{"run": 1}]}
    assert len(works.runs) == 1
    assert _rows(await store.list_jobs()) == [("bk-1", 1, "succeeded")]
    assert len(session.pending) == 2


@pytest.mark.parametrize(
    ("key", "digest"), [(RESTORE, B), (OTHER_BACKUP, A)], ids=["other-body", "other-backup"]
)
async def test_another_restore_of_the_service_while_one_runs_is_refused_busy(
    runner: JobRunner, store: RevisionStore, key: JobKey, digest: str
) -> None:
    """Another body for the same backup, or another backup of the service: refused
    `restore-in-progress`, retryable, naming the running run; nothing is stored for it. Once
    the run ended, the same request runs."""
    works, session = Works(), Session()
    works.hold()
    first = asyncio.create_task(runner.submit(RESTORE, A, works.start, requester=session.request()))
    await works.started.wait()
    with pytest.raises(RestoreInProgress) as busy:
        await runner.submit(key, digest, works.start, requester=session.request())
    stored_while_busy = _rows(await store.list_jobs())
    works.release.set()
    await first
    after = await runner.submit(key, digest, works.start, requester=session.request())
    assert (busy.value.code, busy.value.retryable, busy.value.data) == (
        "restore-in-progress",
        True,
        {"run": 1},
    )
    assert stored_while_busy == [("bk-1", 1, "running")]
    assert after == {"restored": [{"run": 2}]}
    assert [job.backup_id for job in works.keys] == ["bk-1", key.backup_id]


# --- a run left by a stopped agent: reconciled by its keys before anything runs ---------------


async def test_start_up_leaves_a_restore_running_for_its_next_request_to_reconcile(
    store: RevisionStore,
) -> None:
    """A run a stopped agent left `running` is not settled blindly at start-up: its keys are
    asked of Corestore when the next request of its service comes."""
    stale = await _left_running(store)
    async for _ in running(store):
        pass  # started and stopped: `run()` ends only after its start-up report
    after = await store.get_job(stale.key)
    assert after is not None
    assert (after.status, after.revision) == ("running", 1)


async def test_a_run_whose_effects_were_all_applied_is_recorded_done_and_its_repeat_answered(
    runner: JobRunner, store: RevisionStore
) -> None:
    """Killed after Corestore's commit: Corestore holds every effect under the run's keys. The
    run is recorded `succeeded` with its planned answer and the closure Corestore committed,
    not delivered; the identical repeat gets that answer and nothing runs."""
    stale = await _left_running(store)
    works, reconcile = Works(), Reconciler(applied=True)
    answer = await runner.submit(
        RESTORE, A, works.start, requester=Session(auto=False).request(), reconcile=reconcile
    )
    recorded = await store.get_job(stale.key)
    assert answer == {"restored": [{"planned": True}]}
    assert works.runs == []
    assert [job.key for job in reconcile.asked] == [stale.key]
    assert recorded is not None
    assert recorded.status == "succeeded"
    assert recorded.delivered_at is None
    assert isinstance(recorded.result, Succeeded)
    assert recorded.result.report.closure == ClosureFacts(5, "f" * 64)


async def test_a_run_not_fully_applied_is_resumed_under_its_keys_by_the_identical_request(
    runner: JobRunner, store: RevisionStore
) -> None:
    """Killed before Corestore applied everything: the identical request resumes that run
    (its number, its plan: the same keys), a second attempt; no new run."""
    stale = await _left_running(store)
    works = Works()
    answer = await runner.submit(
        RESTORE, A, works.start, requester=Session().request(), reconcile=Reconciler(False)
    )
    resumed = await store.get_job(stale.key)
    assert answer == {"restored": [{"run": 1}]}
    assert works.runs == [(stale.key, PLAN)]
    assert resumed is not None
    assert (resumed.status, resumed.attempts, resumed.plan) == ("succeeded", 2, PLAN)


async def test_a_run_not_fully_applied_is_recorded_interrupted_when_another_request_comes(
    runner: JobRunner, store: RevisionStore
) -> None:
    """Another body for the service: the run left is recorded interrupted (never reported
    restored) and a new run, the service's next, restores under new keys."""
    stale = await _left_running(store, digest=B)
    works = Works()
    answer = await runner.submit(
        RESTORE, A, works.start, requester=Session().request(), reconcile=Reconciler(False)
    )
    settled = await store.get_job(stale.key)
    assert settled is not None
    assert (settled.status, settled.result) == ("failed", INTERRUPTED)
    assert answer == {"restored": [{"run": 2}]}
    assert works.runs[0][1] != PLAN


async def test_a_run_an_older_agent_left_without_a_plan_is_recorded_interrupted(
    runner: JobRunner, store: RevisionStore
) -> None:
    """No keys to ask Corestore by: the run is recorded interrupted, even for the identical
    request, which is a new run."""
    stale = await _left_running(store, plan=None)
    reconcile = Reconciler(applied=True)
    answer = await runner.submit(
        RESTORE, A, Works().start, requester=Session().request(), reconcile=reconcile
    )
    settled = await store.get_job(stale.key)
    assert settled is not None
    assert (settled.status, settled.result) == ("failed", INTERRUPTED)
    assert answer == {"restored": [{"run": 2}]}
    assert reconcile.asked == []


async def test_while_corestore_cannot_say_nothing_runs(
    runner: JobRunner, store: RevisionStore
) -> None:
    """Corestore unreachable: the request is refused retryable and the run stays as it was;
    nothing runs before the keys were asked."""
    stale = await _left_running(store)
    works = Works()
    with pytest.raises(CorestoreUnavailable):
        await runner.submit(
            RESTORE,
            A,
            works.start,
            requester=Session().request(),
            reconcile=Reconciler(True, down=True),
        )
    after = await store.get_job(stale.key)
    assert works.runs == []
    assert after is not None
    assert (after.status, after.revision) == ("running", 1)


async def test_a_restore_stopped_with_the_agent_tells_its_callers_to_repeat(
    store: RevisionStore,
) -> None:
    """`close()` cancels a running restore: its caller gets `shutting-down`, retryable, and the
    row stays `running` for the next request to reconcile."""
    works = Works()
    works.hold()
    async for runner in running(store):
        caller = asyncio.create_task(
            runner.submit(RESTORE, A, works.start, requester=Session().request())
        )
        await works.started.wait()
    with pytest.raises(ShuttingDown, match="restore anew"):
        await caller
    assert _rows(await store.list_jobs()) == [("bk-1", 1, "running")]


# --- backups -----------------------------------------------------------------------------------


async def test_a_repeated_backup_is_answered_from_its_record(
    runner: JobRunner, store: RevisionStore
) -> None:
    """One backupId is one backup: the repeat gets the recorded response and nothing runs,
    whether or not the first answer was delivered."""
    works, session = Works(), Session()
    first = await runner.submit(BACKUP, A, works.start, requester=session.request())
    second = await runner.submit(BACKUP, A, works.start, requester=session.request())
    assert first == second
    assert len(works.runs) == 1
    assert _rows(await store.list_jobs()) == [("bk-1", 0, "succeeded")]


async def test_a_failed_backup_is_retried_by_its_repeat(
    runner: JobRunner, store: RevisionStore
) -> None:
    """A backup's effects are idempotent (one backupId is one backup at Corestore and at
    Cloudly): its failed job runs again on the repeat, delivered or not."""
    session, attempts = Session(auto=False), []

    async def start(resumed: RunPlan | None) -> Started:
        async def work(job: JobKey, plan: RunPlan | None) -> Succeeded:
            attempts.append(job)
            if len(attempts) == 1:
                raise CorestoreUnavailable("Corestore did not answer")
            return Succeeded({"snapshots": []}, JobReport(snapshots=0))

        return Started(work)

    with pytest.raises(CorestoreUnavailable):
        await runner.submit(BACKUP, A, start, requester=session.request())
    answer = await runner.submit(BACKUP, A, start, requester=session.request())
    job = await store.get_job(BACKUP)
    assert answer == {"snapshots": []}
    assert job is not None
    assert (job.status, job.attempts) == ("succeeded", 2)
    assert isinstance(job.result, Succeeded)
    assert not isinstance(job.result, Failed)


async def test_each_request_is_reported_with_how_it_was_answered(store: RevisionStore) -> None:
    """The observer hears every verdict (the metric `restore_agent_relay_answers_total`): a new
    run, then the lost answer's repeat answered from the record."""
    heard: list[tuple[str, str]] = []

    class Observer:
        def relay_answered(self, *, kind: str, answer: str) -> None:
            heard.append((kind, answer))

    runner = JobRunner(store, observer=Observer())
    run = asyncio.create_task(runner.run())
    await runner.started()
    session, works = Session(auto=False), Works()
    try:
        await runner.submit(RESTORE, A, works.start, requester=session.request())
        session.reconnect()
        await runner.submit(RESTORE, A, works.start, requester=session.request())
    finally:
        await runner.close(5)
    await run
    assert heard == [("restore", "start"), ("restore", "recorded")]
