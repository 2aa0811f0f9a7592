"""The `relay_job` table's SQL: its rows read back, its compare-and-swap moves from the job table.

A row reads back as the domain's `StoredJob` under its `JobKey` (`agent.domain.jobs`); a
restore's `start` numbers its run (its key is given with `run` 0). `move_job()` is one SQL
statement, hence one transaction: an `INSERT ... ON CONFLICT DO NOTHING` for `start` (revision
0 -> 1), otherwise an `UPDATE ... SET revision = revision + 1, status = CASE status ... END
WHERE <key> AND revision = :expected AND status IN (<statuses the operation may leave>)` built
from `agent.domain.job_machine.JOB_TABLE`. When no row changed,
the row is read once to say why (`RevisionConflict` or `IllegalTransition`). The schema holds
at most one `running` restore per service on a node (a unique partial index), so two restores
of one service can never both be persisted as running.

What a row holds is plain JSON written here only: the recorded outcome (`result`, an
`agent.domain.outcomes.JobResult`), a restore run's plan and the request digest, and when its
answer was known delivered (`mark_delivered`). Never a secret: the relay requests carry none,
and `encode_result` refuses any value JSON cannot represent (a `Secret` among them).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from typing import Any, Final

import aiosqlite

from agent.domain.job_machine import JOB_KINDS, JOB_STATUSES, JOB_TABLE, JobKind, JobOp, JobStatus
from agent.domain.jobs import JobKey, StoredJob
from agent.domain.outcomes import JobResult, RunPlan, result_from_json
from agent.errors import IllegalTransition, InvalidState, RevisionConflict, StoreError
from agent.store.transitions import status_moves

__all__ = [
    "encode_result",
    "get_job",
    "last_restore",
    "list_jobs",
    "mark_delivered",
    "move_job",
    "running_restore",
]

_COLUMNS: Final = (
    "cluster_id, node_id, kind, backup_id, service_id, run, revision, status, request_digest, "
    "result_json, attempts, created_at, updated_at, plan_json, delivered_at"
)
_KEY_WHERE: Final = (
    "cluster_id = :cluster_id AND node_id = :node_id AND kind = :kind "
    "AND backup_id = :backup_id AND service_id = :service_id AND run = :run"
)
_STATUS: Final[dict[str, JobStatus]] = {status: status for status in JOB_STATUSES}
_KIND: Final[dict[str, JobKind]] = {kind: kind for kind in JOB_KINDS}


def encode_result(result: JobResult | RunPlan | None) -> str | None:
    """`result` (or a plan) as JSON text; `InvalidState` for anything JSON cannot hold (a
    `Secret` smuggled into a report)."""
    if result is None:
        return None
    try:
        return json.dumps(result.to_json(), sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidState(f"a relay job result must be plain JSON: {exc}") from None


def _to_job(row: Iterable[Any]) -> StoredJob:
    (cluster, node, kind, backup, service, run, revision, status, digest, result, attempts,
     created, updated, plan, delivered) = tuple(row)  # fmt: skip
    try:
        return StoredJob(
            JobKey(cluster, node, _KIND[kind], backup, service, run),
            revision,
            _STATUS[status],
            digest,
            None if result is None else result_from_json(json.loads(result)),
            attempts,
            created,
            updated,
            plan=None if plan is None else RunPlan.from_json(json.loads(plan)),
            delivered_at=delivered,
        )
    except (KeyError, ValueError, InvalidState) as exc:
        raise StoreError(f"a relay job row does not read back: {type(exc).__name__}") from exc


async def get_job(db: aiosqlite.Connection, key: JobKey) -> StoredJob | None:
    """The job stored under `key`, or None."""
    rows = await db.execute_fetchall(
        f"SELECT {_COLUMNS} FROM relay_job WHERE {_KEY_WHERE}",  # noqa: S608
        key.as_params(),
    )
    return next((_to_job(row) for row in rows), None)


async def list_jobs(db: aiosqlite.Connection, status: JobStatus | None = None) -> list[StoredJob]:
    """Every job (or those in `status`), oldest change first."""
    where = "" if status is None else "WHERE status = :status"
    rows = await db.execute_fetchall(
        f"SELECT {_COLUMNS} FROM relay_job {where} "  # noqa: S608
        "ORDER BY updated_at, cluster_id, node_id, kind, backup_id, service_id, run",
        {"status": status},
    )
    return [_to_job(row) for row in rows]


async def last_restore(
    db: aiosqlite.Connection, cluster_id: str, node_id: str, service_id: str
) -> StoredJob | None:
    """The restore run of `service_id` on the node with the highest run number, or None
    (retention always keeps it: `agent.store.forgetting`)."""
    rows = await db.execute_fetchall(
        f"SELECT {_COLUMNS} FROM relay_job "  # noqa: S608
        "WHERE cluster_id = ? AND node_id = ? AND kind = 'restore' AND service_id = ? "
        "ORDER BY run DESC LIMIT 1",
        (cluster_id, node_id, service_id),
    )
    return next((_to_job(row) for row in rows), None)


async def mark_delivered(db: aiosqlite.Connection, key: JobKey, *, revision: int, now: int) -> bool:
    """Record that the answer the job gave at `revision` reached Cloudly; False when the job
    moved on since (a newer outcome, or its work runs again) or it was recorded already."""
    rows = await db.execute_fetchall(
        f"UPDATE relay_job SET delivered_at = :now WHERE {_KEY_WHERE} "  # noqa: S608
        "AND revision = :revision AND status != 'running' AND delivered_at IS NULL "
        "RETURNING revision",
        {**key.as_params(), "revision": revision, "now": now},
    )
    return bool(list(rows))


async def running_restore(
    db: aiosqlite.Connection, cluster_id: str, node_id: str, service_id: str
) -> StoredJob | None:
    """The restore of `service_id` on the node that is `running` in the store, or None (the
    schema holds at most one)."""
    rows = await db.execute_fetchall(
        f"SELECT {_COLUMNS} FROM relay_job "  # noqa: S608
        "WHERE cluster_id = ? AND node_id = ? AND kind = 'restore' AND service_id = ? "
        "AND status = 'running'",
        (cluster_id, node_id, service_id),
    )
    return next((_to_job(row) for row in rows), None)


# A restore's `start` numbers its run: one more than the service's last on that node. Any
# uniqueness conflict (the backup's key, or a second running restore of the service) inserts
# nothing, and the caller reads why.
_INSERT: Final = f"""
INSERT INTO relay_job ({_COLUMNS})
VALUES (:cluster_id, :node_id, :kind, :backup_id, :service_id,
        CASE :kind WHEN 'restore' THEN (
            SELECT COALESCE(MAX(run), 0) + 1 FROM relay_job
            WHERE cluster_id = :cluster_id AND node_id = :node_id AND kind = 'restore'
                  AND service_id = :service_id)
        ELSE 0 END,
        1, :to_status, :digest, NULL, 1, :now, :now, :plan_json, NULL)
ON CONFLICT DO NOTHING
RETURNING {_COLUMNS}
"""  # noqa: S608  # placeholders only; column names are constants


def _update_statement(op: JobOp) -> tuple[str, dict[str, str]] | None:
    moves = status_moves(JOB_TABLE, op)
    if moves is None:
        return None
    # A move back to `running` is a new attempt: its old outcome no longer stands.
    restarts = op in (JobOp.RESUME, JobOp.RETRY)
    sql = f"""
UPDATE relay_job
SET revision = revision + 1,
    status = {moves.case},
    result_json = :result_json,
    plan_json = COALESCE(:plan_json, plan_json),
    delivered_at = NULL,
    attempts = attempts + {1 if restarts else 0},
    updated_at = :now
WHERE {_KEY_WHERE} AND revision = :expected AND request_digest = :digest
      AND status IN ({moves.allowed})
RETURNING {_COLUMNS}
"""  # noqa: S608  # placeholders only; the shape comes from the transition table
    return sql, moves.params


_UPDATES: Final = {op: st for op in JobOp if (st := _update_statement(op)) is not None}


async def move_job(
    db: aiosqlite.Connection,
    key: JobKey,
    *,
    op: JobOp,
    expected_revision: int,
    digest: str,
    now: int,
    result: JobResult | None = None,
    plan: RunPlan | None = None,
) -> StoredJob:
    """Apply `op` at `expected_revision` in one statement; the new row, or why not. `plan`
    (a restore run's, at `start`) is kept by every later move that gives none; every move
    clears `delivered_at` (a new answer is not delivered yet).

    Raises `RevisionConflict` (the revision moved, or another body owns the key),
    `IllegalTransition` (revision current, `op` illegal in its status).
    """
    params: dict[str, Any] = {
        **key.as_params(),
        "expected": expected_revision,
        "digest": digest,
        "now": now,
        "result_json": encode_result(result),
        "plan_json": encode_result(plan),
    }
    if op is JobOp.START and key.run != 0:
        raise InvalidState("a job is started with run 0: the store numbers a restore's run")
    rows: Iterable[sqlite3.Row] = ()
    insert_to = JOB_TABLE.sources(op).get(None)
    update = _UPDATES.get(op)
    if expected_revision == 0 and insert_to is not None:
        rows = await db.execute_fetchall(_INSERT, {**params, "to_status": insert_to})
    elif expected_revision > 0 and update is not None:
        sql, status_params = update
        rows = await db.execute_fetchall(sql, {**params, **status_params})
    for row in rows:
        return _to_job(row)
    if op is JobOp.START and key.kind == "restore":
        current = await running_restore(db, key.cluster_id, key.node_id, key.service_id)
    else:
        current = await get_job(db, key)
    revision = 0 if current is None else current.revision
    status = None if current is None else current.status
    if revision != expected_revision or (current is not None and current.request_digest != digest):
        raise RevisionConflict(expected=expected_revision, current=revision, status=status)
    raise IllegalTransition(operation=op.value, status=status, current=revision)
