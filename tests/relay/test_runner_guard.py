"""`JobRunner`'s crash guard: a bug in one job (its work, or recording its outcome) fails that
job with `internal`, not retryable, and nothing else: its callers are answered, the runner keeps
running and takes the next job. A store that refuses to record an outcome is no bug: its callers
are told to send the request again. The runner stopping while an outcome is being recorded
answers every caller of the job, a joined one included."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agent.domain.job_machine import JobOp
from agent.domain.jobs import JobKey
from agent.domain.outcomes import RunPlan, Succeeded
from agent.errors import AgentError, OutcomeUnrecorded, ShuttingDown, StoreError
from agent.relay.runner import JobRunner, Started
from agent.store import RevisionStore
from tests.relay._runners import Session

RESTORE = JobKey("cluster-1", "node-1", "restore", "bk-1", "svc-1")
BACKUP = JobKey("cluster-1", "node-1", "backup", "bk-1", "svc-1")
A = "a" * 64


class _BuggyRecording:
    """The store, except that recording the first outcome raises a bug (no `AgentError`)."""

    def __init__(self, store: RevisionStore) -> None:
        self._store = store
        self.bugs = 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def move_job(self, key: JobKey, *, op: JobOp, **kw: Any) -> Any:
        if op in (JobOp.SUCCEED, JobOp.FAIL) and self.bugs:
            self.bugs -= 1
            raise RuntimeError("a bug while recording the outcome")
        return await self._store.move_job(key, op=op, **kw)


class _RefusedRecording:
    """The store, except that it refuses to record the first outcome (`StoreError`)."""

    def __init__(self, store: RevisionStore) -> None:
        self._store = store
        self.refusals = 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def move_job(self, key: JobKey, *, op: JobOp, **kw: Any) -> Any:
        if op in (JobOp.SUCCEED, JobOp.FAIL) and self.refusals:
            self.refusals -= 1
            raise StoreError("the state database is locked")
        return await self._store.move_job(key, op=op, **kw)


class _HeldRecording:
    """The store, except that recording an outcome stays in flight (`writing` set) until the
    task writing it is cancelled."""

    def __init__(self, store: RevisionStore) -> None:
        self._store = store
        self.writing = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def move_job(self, key: JobKey, *, op: JobOp, **kw: Any) -> Any:
        if op in (JobOp.SUCCEED, JobOp.FAIL):
            self.writing.set()
            await asyncio.Event().wait()
        return await self._store.move_job(key, op=op, **kw)


class _Answers:
    """The runner's observer: `joined` is set once a request joined running work."""

    def __init__(self) -> None:
        self.joined = asyncio.Event()

    def relay_answered(self, *, kind: str, answer: str, reason: str) -> None:
        if answer == "join":
            self.joined.set()


async def _start(resumed: RunPlan | None) -> Started:
    async def work(job: JobKey, plan: RunPlan | None) -> Succeeded:
        return Succeeded({"restored": []})

    return Started(work)


async def test_a_bug_while_recording_an_outcome_fails_that_job_and_nothing_else(
    store: RevisionStore,
) -> None:
    """Recording the outcome raises a bug: the caller gets `internal`, not retryable (it waited
    forever), the runner keeps running (its TaskGroup ended, and the daemon with it) and the
    next job runs and is recorded."""
    runner = JobRunner(_BuggyRecording(store))  # type: ignore[arg-type]
    run = asyncio.create_task(runner.run())
    await runner.started()
    try:
        with pytest.raises(AgentError) as failed:
            async with asyncio.timeout(5):  # a guard against the hang this test is about
                await runner.submit(RESTORE, A, _start, requester=Session().request())
        assert not run.done()
        answer = await runner.submit(BACKUP, A, _start, requester=Session().request())
    finally:
        await runner.close(5)
    await run
    assert (failed.value.code, failed.value.retryable) == ("internal", False)
    assert answer == {"restored": []}
    backup = await store.get_job(BACKUP)
    assert backup is not None
    assert backup.status == "succeeded"


async def test_an_outcome_the_store_refused_to_record_is_answered_retryable_and_settled_by_the_repeat(  # noqa: E501
    store: RevisionStore,
) -> None:
    """The work succeeded but the store refused its outcome: the caller gets `internal`,
    retryable (`OutcomeUnrecorded`), the row stays `running`, and the identical request resumes
    it and is answered."""
    runner = JobRunner(_RefusedRecording(store))  # type: ignore[arg-type]
    run = asyncio.create_task(runner.run())
    await runner.started()
    try:
        with pytest.raises(OutcomeUnrecorded) as unrecorded:
            await runner.submit(BACKUP, A, _start, requester=Session().request())
        left = await store.get_job(BACKUP)
        again = await runner.submit(BACKUP, A, _start, requester=Session().request())
    finally:
        await runner.close(5)
    await run
    assert (unrecorded.value.code, unrecorded.value.retryable) == ("internal", True)
    assert left is not None
    assert left.status == "running"
    assert again == {"restored": []}


async def test_a_stop_while_the_outcome_is_recorded_answers_the_joined_caller(
    store: RevisionStore,
) -> None:
    """The work ended and its outcome is being written when `close()` cancels the job: the
    caller that started it and the one that joined it both get `shutting-down` (the joined
    one waited forever before), and the row stays `running` for the repeat."""
    recording, answers = _HeldRecording(store), _Answers()
    runner = JobRunner(recording, observer=answers)  # type: ignore[arg-type]
    run = asyncio.create_task(runner.run())
    await runner.started()
    first = asyncio.create_task(runner.submit(BACKUP, A, _start, requester=Session().request()))
    await recording.writing.wait()
    joined = asyncio.create_task(runner.submit(BACKUP, A, _start, requester=Session().request()))
    await answers.joined.wait()
    await runner.close(5)
    await run
    async with asyncio.timeout(5):  # a guard against the hang this test is about
        outcomes = await asyncio.gather(first, joined, return_exceptions=True)
    assert [type(outcome) for outcome in outcomes] == [ShuttingDown, ShuttingDown]
    left = await store.get_job(BACKUP)
    assert left is not None
    assert left.status == "running"
