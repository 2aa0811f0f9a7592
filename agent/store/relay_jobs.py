"""`RelayJobs`: the relay's jobs (`agent.relay`) as the store keeps them, over `job_table.py`.

Each call takes the connection (`database.py`) and runs `job_table`'s SQL on it: a job read by
its key, the jobs listed, a service's running or last restore run, its answer known delivered,
and its compare-and-swap move (`move_job`, one transaction, stamped with the store's clock).
"""

from __future__ import annotations

from agent.domain.job_machine import JobOp, JobStatus
from agent.domain.jobs import JobKey, StoredJob
from agent.domain.outcomes import JobResult, RunPlan
from agent.errors import InvalidState
from agent.store import job_table
from agent.store.codec import is_sha256
from agent.store.database import Database

__all__ = ["RelayJobs"]


class RelayJobs:
    """The relay jobs: read, listed, moved."""

    def __init__(self, database: Database) -> None:
        self._database = database

    async def get_job(self, key: JobKey) -> StoredJob | None:
        """The relay job stored under `key`, or None."""
        async with self._database.connection() as db:
            return await job_table.get_job(db, key)

    async def list_jobs(self, status: JobStatus | None = None) -> list[StoredJob]:
        """Every relay job (or those in `status`), oldest change first."""
        async with self._database.connection() as db:
            return await job_table.list_jobs(db, status)

    async def running_restore(
        self, cluster_id: str, node_id: str, service_id: str
    ) -> StoredJob | None:
        """The restore of `service_id` on `node_id` the store holds as `running`, or None."""
        async with self._database.connection() as db:
            return await job_table.running_restore(db, cluster_id, node_id, service_id)

    async def last_restore(
        self, cluster_id: str, node_id: str, service_id: str
    ) -> StoredJob | None:
        """The last restore run of `service_id` on `node_id` (the highest run), or None."""
        async with self._database.connection() as db:
            return await job_table.last_restore(db, cluster_id, node_id, service_id)

    async def mark_delivered(self, key: JobKey, *, revision: int) -> bool:
        """Record that the answer of the job at `revision` reached Cloudly (False: the job
        moved on since, or it was recorded already)."""
        async with self._database.connection(write=True) as db:
            now = self._database.now_ms()
            return await job_table.mark_delivered(db, key, revision=revision, now=now)

    async def move_job(
        self,
        key: JobKey,
        *,
        op: JobOp,
        expected_revision: int,
        digest: str,
        result: JobResult | None = None,
        plan: RunPlan | None = None,
    ) -> StoredJob:
        """Apply `op` to the relay job at `expected_revision` (one transaction), or raise
        `RevisionConflict`/`IllegalTransition` and change nothing. `plan`: a restore run's, when
        it starts (kept by every later move)."""
        if not is_sha256(digest):
            raise InvalidState("a job digest must be 64 lower-case hex characters")
        async with self._database.connection(write=True) as db:
            return await job_table.move_job(
                db,
                key,
                op=op,
                expected_revision=expected_revision,
                digest=digest,
                now=self._database.now_ms(),
                result=result,
                plan=plan,
            )
