"""`JobRunner`: durable relay jobs, the rule that answers a repeated request, and the one owner
of their tasks.

`submit(key, digest, start, requester=...)` answers a request by
`agent.domain.job_machine.REQUESTS` (docs/relay.md, "Jobs and repeats"), under the lock of what
one job at a time may hold (`JobKey.scope`: a backup's key, a restore's service on its node):
it gathers what the request finds (`JobFacts`), `agent.domain.job_verdict` decides, and the
runner carries the verdict out:

- a backup meets the job of its exact key: another body is `JobConflict`, `succeeded` answers
  its recorded response at once, work running in this process is joined, a `failed` job is
  retried, one left `running` by a stopped agent is resumed;
- a restore meets the run of its service that works in this process (the identical request
  joins it, any other is `RestoreInProgress`, retryable), else the service's last run. A last
  run left `running` by a stopped agent is first reconciled with Corestore by its keys
  (`reconcile`): every effect applied, it is recorded `succeeded` (its answer not delivered);
  otherwise the identical request resumes it under its keys, and any other records it
  interrupted and starts a new run. A last run that ended is judged by whether Cloudly holds
  its answer (`agent.domain.answer_fate`, from facts the agent holds: on which connections of
  this process the answer was given, whether a pong confirmed it, whether it is an earlier
  process's): while Cloudly may not, the identical request is a repeat, and a run that
  succeeded gives its recorded answer (a lost answer never imports a closure twice) while a
  run that failed runs again under its keys; once Cloudly holds it, or for another body, a new
  run starts.

Answers: every answer the runner gives is noted where it went, and its confirmation by a pong
recorded (`agent.relay.handouts`); per service, where the answer of its last run went is the
runner's `AnswerBook`.

Work that starts runs `start()` first (checks that refuse before anything is stored, and that
may ask Corestore; for a restore, its plan: the effects under their idempotency keys, new for a
new run, the stored ones for a resumed run), then the job row moves (`start`, `resume`,
`retry`; `agent.domain.job_machine`) and the work runs as the task of its scope
(`agent.owner.KeyedTasks` in `run()`'s TaskGroup; `agent.relay.execution` runs it, records its
outcome before any caller sees it, and answers a cancel with `ShuttingDown`). The work belongs
to the runner, not to the request: a caller that goes away (its session dropped) leaves the
work running, and the repeated request joins it. `close()` cancels the work; its row stays
`running` and its callers, joined ones too, are answered. A bug in a job fails that job
(`internal`, not retryable) and nothing else (`relay_job_crashed`).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

import structlog

from agent.clock import SYSTEM_CLOCK, Clock
from agent.domain.job_machine import Answer, JobOp, Meets
from agent.domain.job_verdict import JobFacts, Verdict, job_verdict
from agent.domain.jobs import JobKey, JobScope, StoredJob
from agent.domain.outcomes import JobFailed, JsonObject, RunPlan, Succeeded
from agent.errors import (
    AgentError,
    JobConflict,
    RestoreInProgress,
    ShuttingDown,
)
from agent.locks import KeyedLocks
from agent.observe import NULL_OBSERVER, RelayObserver
from agent.owner import KeyedTasks, TaskOwner
from agent.relay.answers import AnswerBook
from agent.relay.execution import Answered, JobExecution, Work, crashed, job_fields, recorded
from agent.relay.handouts import Handouts, Requester
from agent.store import RevisionStore

__all__ = ["INTERRUPTED", "JobRunner", "Reconcile", "Requester", "Start", "Started", "Work"]

_log = structlog.get_logger("agent.relay.runner")


@dataclass(frozen=True, slots=True)
class Started:
    """What starting a job gives: its work, and a restore run's plan (stored with its row)."""

    work: Work
    plan: RunPlan | None = None


Start = Callable[["RunPlan | None"], Awaitable[Started]]
"""Prepares a job's work once the rule says it runs, refusing before anything is stored; given
the plan of the restore run it resumes (its keys stay), None for a new run."""

Reconcile = Callable[[StoredJob], Awaitable["Succeeded | None"]]
"""Asks Corestore, by a restore run's keys, whether every effect of the run was applied: its
outcome then (to record), else None (and nothing half-done of it is left open)."""


INTERRUPTED: Final = JobFailed(
    ShuttingDown.code,
    "the agent stopped while this restore ran; it is not resumed: a new request restores anew",
    True,
)
"""What a restore run left by a stopped agent is recorded with when another request of its
service comes first (the schema's migration 3 wrote the same for a run it found `running`)."""

_OPS: Final = {Answer.START: JobOp.START, Answer.RESUME: JobOp.RESUME, Answer.RETRY: JobOp.RETRY}


@dataclass(frozen=True, slots=True)
class _Running:
    """Work running in this process: its job's key, the body's digest, its outcome."""

    key: JobKey
    digest: str
    outcome: asyncio.Future[Answered]


@dataclass(frozen=True, slots=True)
class _Decision:
    """The verdict on a request (`agent.domain.job_verdict`) and what it found: the stored job
    or run, the work running here."""

    verdict: Verdict
    stored: StoredJob | None = None
    running: _Running | None = None


class JobRunner:
    """Runs relay jobs for the relay service; run it in the caller's TaskGroup."""

    def __init__(
        self,
        store: RevisionStore,
        *,
        clock: Clock = SYSTEM_CLOCK,
        observer: RelayObserver = NULL_OBSERVER,
    ) -> None:
        """`clock` bounds `close()`; `observer` hears how each request was answered."""
        self._store = store
        self._observer = observer
        self._locks: KeyedLocks[JobScope] = KeyedLocks()
        self._answers = AnswerBook()  # per service: where its last run's answer went
        self._owner = TaskOwner("the relay job runner", clock=clock)
        self._running: KeyedTasks[JobScope, _Running] = KeyedTasks(
            self._owner, log=_log, crashed="relay_job_crashed"
        )
        self._execution = JobExecution(store, self._answers)
        self._handouts = Handouts(store, self._answers, self._owner)

    # --- lifecycle ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Own the jobs' tasks until `close()`; then cancel and await them (`agent.owner`)."""
        await self._owner.run(self._report_unfinished)

    async def started(self) -> None:
        """Wait until `run()` takes work."""
        await self._owner.started()

    async def close(self, timeout: float = 10.0) -> None:  # noqa: ASYNC109  # a shutdown bound
        """Stop taking work, cancel the running jobs, wait at most `timeout` s for `run()`."""
        await self._owner.close(timeout)

    # --- the request rule ---------------------------------------------------------------------

    async def submit(
        self,
        key: JobKey,
        digest: str,
        start: Start,
        *,
        requester: Requester,
        reconcile: Reconcile | None = None,
    ) -> JsonObject:
        """The request's response: recorded, joined, or from work started now (module
        docstring). A restore's `key` has run 0: a run that starts is numbered by the store;
        `reconcile` settles its service's last run if a stopped agent left it running."""
        async with self._locks.hold(key.scope):
            decision = await self._decide(key, digest, requester.arrival.connection, reconcile)
            verdict = decision.verdict
            self._observer.relay_answered(
                kind=key.kind, answer=verdict.answer.value, reason=verdict.reason
            )
            given = await self._act(key, digest, start, decision, reconcile)
        answered = given if isinstance(given, Answered) else await asyncio.shield(given)
        self._handouts.hand_out(answered, requester)
        if answered.error is not None:
            raise answered.error
        assert answered.response is not None
        return answered.response

    async def _decide(
        self, key: JobKey, digest: str, connection: int, reconcile: Reconcile | None
    ) -> _Decision:
        """Gather what the request finds and have `job_verdict` judge it. Call under the
        scope's lock."""
        running = self._live(key.scope)
        stored: StoredJob | None = None
        if key.kind == "backup":
            stored = await self._store.get_job(key)
        elif running is None:
            stored = await self._store.last_restore(key.cluster_id, key.node_id, key.service_id)
            if stored is not None and stored.status == "running":
                stored = await self._reconciled(stored, reconcile)
        facts = JobFacts(
            key.kind,
            live=None if running is None else _same(running.key, running.digest, key, digest),
            last=None if stored is None else stored.status,
            same_body=stored is not None and _same(stored.key, stored.request_digest, key, digest),
            planned=stored is not None and stored.plan is not None,
            fate=(
                None
                if stored is None or stored.status == "running"
                else self._answers.fate(stored, connection)
            ),
        )
        return _Decision(job_verdict(facts), stored, running)

    async def _act(
        self,
        key: JobKey,
        digest: str,
        start: Start,
        decision: _Decision,
        reconcile: Reconcile | None,
    ) -> Answered | asyncio.Future[Answered]:
        """Carry the decision out: refuse, answer the record, join, or start work (its
        outcome to await). Call under the scope's lock."""
        verdict, stored, running = decision.verdict.answer, decision.stored, decision.running
        if verdict is Answer.CONFLICT:
            raise JobConflict(
                kind=key.kind,
                backup_id=key.backup_id,
                service_id=key.service_id,
                node_id=key.node_id,
            )
        if verdict is Answer.BUSY:
            assert running is not None
            raise RestoreInProgress(
                service_id=key.service_id,
                node_id=key.node_id,
                backup_id=running.key.backup_id,
                run=running.key.run,
            )
        if verdict is Answer.RECORDED:
            assert stored is not None
            assert stored.result is not None
            _log.info(
                "relay_job_replayed",
                **job_fields(stored.key),
                revision=stored.revision,
                reason=decision.verdict.reason,
            )
            return recorded(stored.key, stored.revision, stored.result)
        if verdict is Answer.JOIN:
            assert running is not None
            _log.info("relay_job_joined", **job_fields(running.key), reason=decision.verdict.reason)
            return running.outcome
        if decision.verdict.meets is Meets.UNOWNED_OTHER:
            assert stored is not None
            await self._interrupted(stored)
        again = stored if verdict in (Answer.RESUME, Answer.RETRY) else None
        if again is not None and verdict is Answer.RETRY and reconcile is not None:
            # A failed restore run may have left an import open: Corestore drops it first, so
            # the run again under its keys restarts it whole (as a resumed run does).
            await reconcile(again)
        self._owner.check()
        started = await start(None if again is None else again.plan)
        self._owner.check()
        moved = await self._move_to_running(
            key if again is None else again.key,
            None if verdict is Answer.START else stored,
            digest,
            _OPS[verdict],
            started.plan,
            reason=decision.verdict.reason,
        )
        return self._spawn(moved, started.work)

    async def _reconciled(self, last: StoredJob, reconcile: Reconcile | None) -> StoredJob:
        """`last` (a restore left `running` with no work here), reconciled with Corestore by
        its keys: recorded `succeeded` when every effect of it was applied, else as it was."""
        if last.plan is None or reconcile is None:
            return last
        outcome = await reconcile(last)
        if outcome is None:
            _log.info("relay_restore_unapplied", **job_fields(last.key), attempts=last.attempts)
            return last
        reconciled = await self._store.move_job(
            last.key,
            op=JobOp.SUCCEED,
            expected_revision=last.revision,
            digest=last.request_digest,
            result=outcome,
        )
        _log.warning(
            "relay_restore_reconciled", **job_fields(last.key), **outcome.report.log_fields()
        )
        return reconciled

    async def _interrupted(self, stored: StoredJob) -> None:
        """Record the run a stopped agent left `running` as interrupted (another request of
        the service takes over; call under the scope's lock)."""
        await self._store.move_job(
            stored.key,
            op=JobOp.FAIL,
            expected_revision=stored.revision,
            digest=stored.request_digest,
            result=INTERRUPTED,
        )
        _log.warning(
            "relay_restore_interrupted", **job_fields(stored.key), attempts=stored.attempts
        )

    async def _move_to_running(
        self,
        key: JobKey,
        stored: StoredJob | None,
        digest: str,
        op: JobOp,
        plan: RunPlan | None,
        *,
        reason: str,
    ) -> StoredJob:
        expected = 0 if stored is None else stored.revision
        moved = await self._store.move_job(
            key, op=op, expected_revision=expected, digest=digest, plan=plan
        )
        _log.info(
            "relay_job_started",
            **job_fields(moved.key),
            op=op.value,
            attempt=moved.attempts,
            reason=reason,
        )
        return moved

    def _live(self, scope: JobScope) -> _Running | None:
        """The work of `scope` running in this process; work whose outcome is out (its task is
        just ending) no longer counts: a request then meets what it recorded."""
        running = self._running.get(scope)
        return None if running is None or running.outcome.done() else running

    # --- the tasks ----------------------------------------------------------------------------

    def _spawn(self, stored: StoredJob, work: Work) -> asyncio.Future[Answered]:
        outcome: asyncio.Future[Answered] = asyncio.get_running_loop().create_future()
        key = stored.key
        _ = self._running.spawn(
            key.scope,
            _Running(key, stored.request_digest, outcome),
            self._execution.run(stored, work, outcome),
            name=f"relay-{key.kind}",
            fields=job_fields(key),
            on_crash=functools.partial(crashed, key, outcome),
        )
        return outcome

    async def _report_unfinished(self) -> None:
        """At start-up: log the jobs a previous process left `running`. A backup resumes on
        Cloudly's identical repeat; a restore is reconciled with Corestore by its keys when
        the next request of its service comes (then resumed, or recorded)."""
        try:
            unfinished = await self._store.list_jobs("running")
        except AgentError as exc:
            _log.warning("relay_jobs_unreadable", code=exc.code)
            return
        for stored in unfinished:
            _log.info("relay_job_unfinished", **job_fields(stored.key), attempts=stored.attempts)


def _same(made: JobKey, made_digest: str, key: JobKey, digest: str) -> bool:
    """Whether the job `made` (from a body of `made_digest`) was made by the identical request
    (the same backup, the same body)."""
    return (made.backup_id, made_digest) == (key.backup_id, digest)
