"""Retention's SQL: one bounded step of forgetting old finished rows, one of returning pages.

`forget_step()` is one short transaction that deletes at most about `rows` rows:

1. node states in a `FORGETTABLE` status (`cleaned`) last changed before `cutoff_ms`, oldest
   first, a few at a time: first the rows that belong to them (`manifest_object`,
   `staged_chunk`, `staged_object`; a 10,000-object restore owns some 20,000), at most the
   step's budget; only once none is left, their `restore_plan` and `restore_state` rows (every
   child refers to its state `ON DELETE CASCADE`, so nothing can be orphaned either way). A
   restore whose rows outnumber one step's budget is forgotten over several steps; until its
   state row goes it reads as before (a `cleaned` state is terminal: nothing reads its staging
   rows or its manifest any more).
2. then, with what is left of the budget, relay jobs in a `FINISHED` status last changed before
   `cutoff_ms`, except the latest restore run of each service on its node: the store numbers a
   restore's run one past the service's highest, and a run number must never come again.

`vacuum_step()` gives up to `pages` free pages back to the file system (`PRAGMA
incremental_vacuum`, the database being in `auto_vacuum = INCREMENTAL`, see `startup.py`), one
short write each; `checkpoint()` then moves the WAL into the file and truncates both.

The status lists come from the domain's sets as parameters; the column names are constants.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import aiosqlite

from agent.domain.job_machine import FINISHED
from agent.domain.restore_machine import FORGETTABLE

__all__ = ["ForgetStep", "checkpoint", "forget_step", "page_size", "vacuum_step"]

# The restores one step takes on: a restore's own two rows (state, plan) count as little next
# to its children, so a step of `rows` deletions forgets at most `rows // _ROWS_PER_RESTORE`.
_ROWS_PER_RESTORE: Final = 20

_RESTORE_MARKS: Final = ", ".join("?" for _ in FORGETTABLE)
_JOB_MARKS: Final = ", ".join("?" for _ in FINISHED)

# The expired states of this step: the same rows for every statement of its transaction (the
# step holds the write lock, and deletes the states themselves last). Each statement begins
# with its DELETE (sqlite3 counts the rows a statement changed only for those).
_EXPIRED: Final = f"""
SELECT cluster_id, node_name, restore_id FROM restore_state
WHERE status IN ({_RESTORE_MARKS}) AND updated_at < ?
ORDER BY updated_at LIMIT ?
"""  # noqa: S608  # placeholders only

_CHILDREN: Final = ("manifest_object", "staged_chunk", "staged_object")


def _delete_children(table: str) -> str:
    key = ["cluster_id", "node_name", "restore_id", "object_path"]
    if table == "staged_chunk":
        key.append("chunk_offset")
    return f"""
DELETE FROM {table} WHERE ({", ".join(key)}) IN (
    SELECT {", ".join(f"t.{column}" for column in key)} FROM ({_EXPIRED}) AS e JOIN {table} AS t
    ON t.cluster_id = e.cluster_id AND t.node_name = e.node_name AND t.restore_id = e.restore_id
    LIMIT ?)
"""  # noqa: S608  # table and column names are constants


_DELETE_CHILDREN: Final = {table: _delete_children(table) for table in _CHILDREN}

_DELETE_PARENTS: Final = tuple(
    f"""
DELETE FROM {table} WHERE (cluster_id, node_name, restore_id) IN ({_EXPIRED})
"""  # noqa: S608  # table names are constants
    for table in ("restore_plan", "restore_state")
)


_DELETE_JOBS: Final = f"""
DELETE FROM relay_job WHERE (cluster_id, node_id, kind, backup_id, service_id, run) IN (
    SELECT j.cluster_id, j.node_id, j.kind, j.backup_id, j.service_id, j.run FROM relay_job AS j
    WHERE j.status IN ({_JOB_MARKS}) AND j.updated_at < ?
      AND NOT (j.kind = 'restore' AND j.run = (
          SELECT MAX(r.run) FROM relay_job AS r
          WHERE r.cluster_id = j.cluster_id AND r.node_id = j.node_id AND r.kind = 'restore'
            AND r.service_id = j.service_id))
    LIMIT ?)
"""  # noqa: S608  # placeholders only


@dataclass(frozen=True, slots=True)
class ForgetStep:
    """What one step deleted, and whether anything expired is left."""

    restores: int  # node states forgotten (with everything they owned)
    jobs: int  # relay jobs forgotten
    rows: int  # rows deleted in all
    done: bool  # nothing older than the cutoff is left to forget


async def forget_step(db: aiosqlite.Connection, *, cutoff_ms: int, rows: int) -> ForgetStep:
    """Delete at most about `rows` rows of what expired before `cutoff_ms`, in one transaction."""
    restores_at_once = max(1, rows // _ROWS_PER_RESTORE)
    expired = (*sorted(FORGETTABLE), cutoff_ms, restores_at_once)
    budget, deleted, restores, jobs = rows, 0, 0, 0
    await db.execute_fetchall("BEGIN IMMEDIATE")
    try:
        for table in _CHILDREN:
            count = await _changes(db, _DELETE_CHILDREN[table], (*expired, budget))
            deleted += count
            if count >= budget:
                budget = 0  # more may be left: the next step goes on
                break
            budget -= count
        if budget:  # every child of these states is gone: the states themselves
            await _changes(db, _DELETE_PARENTS[0], expired)
            restores = await _changes(db, _DELETE_PARENTS[1], expired)
            deleted += 2 * restores
            if restores >= restores_at_once:
                budget = 0  # more states may have expired
        if budget:
            jobs = await _changes(db, _DELETE_JOBS, (*sorted(FINISHED), cutoff_ms, budget))
            deleted += jobs
            if jobs >= budget:
                budget = 0
        await db.execute_fetchall("COMMIT")
    except BaseException:
        await db.rollback()
        raise
    return ForgetStep(restores=restores, jobs=jobs, rows=deleted, done=budget > 0)


async def _changes(db: aiosqlite.Connection, sql: str, params: tuple[object, ...]) -> int:
    async with db.execute(sql, params) as cursor:
        return max(cursor.rowcount, 0)


async def vacuum_step(db: aiosqlite.Connection, *, pages: int) -> int:
    """Give up to `pages` free pages back to the file system; how many were freed."""
    before = await _free_pages(db)
    if not before:
        return 0
    # One page per step of the statement: fetching every row runs it to the end.
    await db.execute_fetchall(f"PRAGMA incremental_vacuum({int(pages)})")
    return before - await _free_pages(db)


async def _free_pages(db: aiosqlite.Connection) -> int:
    rows = list(await db.execute_fetchall("PRAGMA freelist_count"))
    return int(rows[0][0])


async def page_size(db: aiosqlite.Connection) -> int:
    """The database's page size in bytes."""
    rows = list(await db.execute_fetchall("PRAGMA page_size"))
    return int(rows[0][0])


async def checkpoint(db: aiosqlite.Connection) -> None:
    """Move the WAL into the database file and truncate both to what they hold."""
    await db.execute_fetchall("PRAGMA wal_checkpoint(TRUNCATE)")
