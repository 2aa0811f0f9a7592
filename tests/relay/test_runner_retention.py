"""What a relay request meets once retention forgot its job (docs/relay.md, "Retention"): a
forgotten key is a key with no job."""

from __future__ import annotations

from agent.clock import SYSTEM_CLOCK, epoch_ms
from agent.domain.jobs import JobKey
from agent.relay.runner import JobRunner
from agent.store import RevisionStore
from agent.store.retention import DAY_S
from tests.relay._runners import Session, Works

RESTORE = JobKey("cluster-1", "node-1", "restore", "bk-1", "svc-1")
BACKUP = JobKey("cluster-1", "node-1", "backup", "bk-1", "svc-1")
A = "a" * 64


async def _forget_everything_finished(store: RevisionStore) -> None:
    """Retention with a cutoff a day ahead: every finished job counts as old."""
    cutoff = epoch_ms(SYSTEM_CLOCK) + round(DAY_S * 1000)
    while not (await store.forget_expired(cutoff, rows=100)).done:
        pass


async def test_a_backup_repeated_after_its_record_was_forgotten_runs_again(
    runner: JobRunner, store: RevisionStore
) -> None:
    """No record to answer from: the work runs again (Corestore's backup PUT answers the same
    record for the same body), and the answer is the same."""
    works, session = Works(), Session()
    first = await runner.submit(BACKUP, A, works.start, requester=session.request())
    await _forget_everything_finished(store)
    second = await runner.submit(BACKUP, A, works.start, requester=session.request())
    assert (first, len(works.runs)) == (second, 2)


async def test_a_restore_after_its_service_runs_were_forgotten_is_numbered_after_the_last(
    runner: JobRunner, store: RevisionStore
) -> None:
    """Run 1 is forgotten, run 2 (the service's latest) is kept: the next is run 3."""
    works, session = Works(), Session()
    await runner.submit(RESTORE, A, works.start, requester=session.request())
    await runner.submit(RESTORE, A, works.start, requester=session.request())
    await _forget_everything_finished(store)
    await runner.submit(RESTORE, A, works.start, requester=session.request())
    assert [job.run for job in works.keys] == [1, 2, 3]
    assert sorted(job.key.run for job in await store.list_jobs()) == [2, 3]
