"""`JobRunner`'s answer to repeated requests, on a real state database and work a test holds.

A restore's identical request is judged by where its service's last run's answer went: given
on the live connection it arrives on, or confirmed by a pong, it runs again; lost with its
connection, given to nobody, or unconfirmed by an earlier process, it is a repeat: a success is
answered from its record, a failure runs again under its keys. The identical request joins a
running one, any other for the service is `restore-in-progress`
(retryable) until it ended. A restore the store holds `running` with no work in this process
(the agent stopped) is reconciled with Corestore by its keys before anything runs again:
recorded done when every effect was applied, else resumed under its keys by the identical
request, or recorded interrupted when another comes. A backup is answered from its record. No
test sleeps: work waits on events the test sets.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from agent.domain.job_machine import JobOp, answer_reasons
from agent.domain.jobs import JobKey, StoredJob
from agent.domain.outcomes import (
    ClosureFacts,
    JobFailed,
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


class _Heard:
    """An observer keeping each verdict's (answer, reason)."""

    def __init__(self) -> None:
        self.reasons: list[tuple[str, str]] = []

    def relay_answered(self, *, kind: str, answer: str, reason: str) -> None:
        self.reasons.append((answer, reason))


class _WatchedStore(RevisionStore):
    """The real store, telling when a job's outcome was recorded."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.recorded = asyncio.Event()

    async def move_job(self, key: JobKey, **kwargs: Any) -> StoredJob:
        moved = await super().move_job(key, **kwargs)
        if moved.status != "running":
            self.recorded.set()
        return moved


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


# --- the verdict: where the last run's answer went -------------------------------------------


async def test_an_identical_restore_on_the_connection_its_answer_went_to_runs_again(
    runner: JobRunner, store: RevisionStore
) -> None:
    """No pong yet, however long Cloudly's websocket takes to read one: the answer was given
    on this live connection, so Cloudly sent the request knowing it. Two runs."""
    works, session = Works(), Session(auto=False)
    first = await runner.submit(RESTORE, A, works.start, requester=session.request())
    second = await runner.submit(RESTORE, A, works.start, requester=session.request())
    assert (first, second) == ({"restored": [{"run": 1}]}, {"restored": [{"run": 2}]})
    assert [job.run for job in works.keys] == [1, 2]
    assert _rows(await store.list_jobs()) == [("bk-1", 1, "succeeded"), ("bk-1", 2, "succeeded")]


async def test_an_identical_restore_after_a_pong_confirmed_its_answer_runs_again(
    runner: JobRunner,
) -> None:
    """Confirmed, then the connection ended: the request on the next connection is new."""
    works, session = Works(), Session(auto=False)
    await runner.submit(RESTORE, A, works.start, requester=session.request())
    session.deliver()
    session.reconnect()
    again = await runner.submit(RESTORE, A, works.start, requester=session.request())
    assert again == {"restored": [{"run": 2}]}


async def test_an_identical_restore_whose_answer_was_lost_with_its_connection_is_answered_from_the_record(  # noqa: E501
    runner: JobRunner,
) -> None:
    """The connection ended before a pong confirmed the answer: the identical request on the
    next connection is its repeat, answered from the record, and nothing runs (no second
    import). That answer was given on this connection: the next identical request runs."""
    works, session = Works(), Session(auto=False)
    first = await runner.submit(RESTORE, A, works.start, requester=session.request())
    session.reconnect()
    repeat = await runner.submit(RESTORE, A, works.start, requester=session.request())
    again = await runner.submit(RESTORE, A, works.start, requester=session.request())
    assert first == repeat == {"restored": [{"run": 1}]}
    assert again == {"restored": [{"run": 2}]}
    assert [job.run for job in works.keys] == [1, 2]


async def test_a_restore_that_ended_with_nobody_waiting_is_answered_from_the_record(
    tmp_path: Path,
) -> None:
    """Its caller's connection ended while it ran, so its answer went nowhere: the identical
    request on the next connection gets the recorded answer; nothing runs again."""
    store = await _WatchedStore.open(tmp_path / "state")
    works, session, heard = Works(), Session(auto=False), _Heard()
    works.hold()
    runner = JobRunner(store, observer=heard)
    run = asyncio.create_task(runner.run())
    try:
        await runner.started()
        caller = asyncio.create_task(
            runner.submit(RESTORE, A, works.start, requester=session.request())
        )
        await works.started.wait()
        caller.cancel()  # its connection ended
        session.reconnect()
        works.release.set()
        await store.recorded.wait()
        repeat = await runner.submit(RESTORE, A, works.start, requester=session.request())
    finally:
        await runner.close(5)
        await run
        await store.aclose()
    assert repeat == {"restored": [{"run": 1}]}
    assert len(works.runs) == 1
    assert heard.reasons[-1] == ("recorded", "answer-never-given")


async def test_another_request_after_an_unconfirmed_answer_runs(runner: JobRunner) -> None:
    """Only the identical request can be a repeat: another body for the service runs at once."""
    works, session = Works(), Session(auto=False)
    await runner.submit(RESTORE, A, works.start, requester=session.request())
    session.reconnect()
    answer = await runner.submit(RESTORE, B, works.start, requester=session.request())
    assert answer == {"restored": [{"run": 2}]}


def _failing_once(calls: list[tuple[JobKey, RunPlan | None]]) -> Any:
    """A restore whose first run fails (after it may have changed something) and whose later
    runs succeed; a new run's plan has fresh keys (`restore-1`, `restore-2`, ...)."""
    plans = 0

    async def start(resumed: RunPlan | None) -> Started:
        nonlocal plans
        if resumed is None:
            plans += 1
            plan = RunPlan(RestoreEffects(archive_restore=f"restore-{plans}"), PLAN.planned)
        else:
            plan = resumed

        async def work(job: JobKey, stored: RunPlan | None) -> Succeeded:
            calls.append((job, stored))
            if len(calls) == 1:
                raise IntegrityError("the archive restore did not match")
            return Succeeded({"restored": [{"run": job.run}]})

        return Started(work, plan)

    return start


async def test_a_failed_restore_sent_again_knowing_its_failure_runs_anew(
    runner: JobRunner,
) -> None:
    """The failure was given on this connection: the identical request is a new run with new
    keys (a failure is never answered from the record)."""
    session, calls = Session(auto=False), []
    start = _failing_once(calls)
    with pytest.raises(IntegrityError):
        await runner.submit(RESTORE, A, start, requester=session.request())
    again = await runner.submit(RESTORE, A, start, requester=session.request())
    assert again == {"restored": [{"run": 2}]}
    assert [(job.run, plan and plan.effects.archive_restore) for job, plan in calls] == [
        (1, "restore-1"),
        (2, "restore-2"),
    ]


async def test_a_failed_restore_whose_failure_may_be_lost_runs_again_under_its_keys(
    runner: JobRunner, store: RevisionStore
) -> None:
    """The failure's connection ended unconfirmed: the identical request runs that run again
    (`retry`) under its keys, after Corestore was asked to drop what it left open, so what
    Corestore applied is not applied again. Nothing is answered from the record."""
    session, calls = Session(auto=False), []
    start, reconcile = _failing_once(calls), Reconciler(False)
    with pytest.raises(IntegrityError):
        await runner.submit(RESTORE, A, start, requester=session.request(), reconcile=reconcile)
    session.reconnect()
    again = await runner.submit(RESTORE, A, start, requester=session.request(), reconcile=reconcile)
    [job] = await store.list_jobs()
    assert again == {"restored": [{"run": 1}]}
    assert [(key.run, plan and plan.effects.archive_restore) for key, plan in calls] == [
        (1, "restore-1"),
        (1, "restore-1"),
    ]
    assert (job.status, job.attempts) == ("succeeded", 2)
    assert [asked.key.run for asked in reconcile.asked] == [1]


async def test_a_confirmation_survives_a_restart(store: RevisionStore) -> None:
    """Recorded in the store: after a restart the identical request runs again (a pong
    confirmed the answer in the earlier process)."""
    works = Works()
    async for runner in running(store):
        await runner.submit(RESTORE, A, works.start, requester=Session().request())
    first = await store.get_job(RESTORE.numbered(1))
    async for runner in running(store):
        answer = await runner.submit(RESTORE, A, works.start, requester=Session().request())
    assert first is not None
    assert first.delivered_at is not None
    assert answer == {"restored": [{"run": 2}]}


async def test_an_unconfirmed_answer_stays_unconfirmed_across_a_restart(
    store: RevisionStore,
) -> None:
    """Never confirmed: after a restart the identical request is taken for the repeat of a
    lost answer, answered from the record."""
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
    assert not isinstance(job.result, JobFailed)


async def test_each_request_is_reported_with_how_it_was_answered(store: RevisionStore) -> None:
    """The observer hears every verdict and its reason (the metric
    `restore_agent_relay_answers_total`): a new run, then the lost answer's repeat answered
    from the record."""
    heard: list[tuple[str, str, str]] = []

    class Observer:
        def relay_answered(self, *, kind: str, answer: str, reason: str) -> None:
            heard.append((kind, answer, reason))

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
    assert heard == [
        ("restore", "start", "nothing"),
        ("restore", "recorded", "answer-lost-with-its-connection"),
    ]
    assert set(heard) <= {(kind, to.value, reason) for kind, to, reason in answer_reasons()}
