"""`Reports`: what an operator and the metrics see of the store (`agent/watch/overview.py`,
`agent/watch/metrics.py`), read in one pass each.

The most recently changed node states (`list_states`), how many each status has
(`count_by_status`), per status of node states and relay jobs the count and the oldest change
with the file's size (`status_summary`, the metrics' gauges), and the sizes of each listed
state's plan and staging (`restore_facts`). Nothing here writes.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Final

from agent.domain.restores import StoredState
from agent.store.codec import to_stored
from agent.store.database import Database
from agent.store.files import database_bytes
from agent.store.node_states import STATE_COLUMNS
from agent.store.records import StatusSummary

__all__ = ["Reports"]

# The same key condition on the rows of a table aliased `t`, from the state row `s`.
_SAME_KEY: Final = (
    "{t}.cluster_id = s.cluster_id AND {t}.node_name = s.node_name "
    "AND {t}.restore_id = s.restore_id"
)


class Reports:
    """The store's node states and relay jobs counted and listed for an operator."""

    def __init__(self, database: Database) -> None:
        self._database = database

    async def list_states(self, limit: int = 500) -> list[StoredState]:
        """Up to `limit` node states, the most recently changed first."""
        async with self._database.connection() as db:
            rows = await db.execute_fetchall(
                f"SELECT {STATE_COLUMNS} FROM restore_state "  # noqa: S608
                "ORDER BY updated_at DESC, cluster_id, node_name, restore_id LIMIT ?",
                (limit,),
            )
        return [to_stored(row) for row in rows]

    async def count_by_status(self) -> dict[str, int]:
        """How many node states each status has (statuses without any are left out)."""
        async with self._database.connection() as db:
            rows = await db.execute_fetchall(
                "SELECT status, COUNT(*) FROM restore_state GROUP BY status"
            )
        return {str(status): int(count) for status, count in rows}

    async def status_summary(self) -> StatusSummary:
        """Per status the row count and the oldest `updated_at`, of node states and relay jobs
        (the metrics' gauges: how many, and how long the oldest has not moved)."""
        async with self._database.connection() as db:
            restores = await db.execute_fetchall(
                "SELECT status, COUNT(*), MIN(updated_at) FROM restore_state GROUP BY status"
            )
            jobs = await db.execute_fetchall(
                "SELECT kind, status, COUNT(*), MIN(updated_at) FROM relay_job"
                " GROUP BY kind, status"
            )
        return StatusSummary(
            restores={str(status): (int(n), int(oldest)) for status, n, oldest in restores},
            jobs={(str(k), str(status)): (int(n), int(oldest)) for k, status, n, oldest in jobs},
            database_bytes=database_bytes(self._database.path),
        )

    async def restore_facts(
        self, limit: int = 500, *, counted: Collection[str] = ()
    ) -> dict[tuple[str, str, str], tuple[int, int, int, int, int]]:
        """For the `limit` most recently changed node states (`list_states`' rows): (resource
        mappings, manifest objects, manifest bytes) of the plan and, for states in a `counted`
        status only, (accepted chunk bytes, objects marked written) of the staging, else 0s:
        counting staging rows costs a pass over them, worth it only while they grow."""
        marks = ", ".join("?" for _ in counted) or "NULL"
        chunks, objects = _SAME_KEY.format(t="c"), _SAME_KEY.format(t="o")
        async with self._database.connection() as db:
            rows = await db.execute_fetchall(
                "SELECT s.cluster_id, s.node_name, s.restore_id, "  # noqa: S608
                "COALESCE(p.mapping_count, 0), COALESCE(p.object_count, 0), "
                "COALESCE(p.manifest_bytes, 0), "
                f"CASE WHEN s.status IN ({marks}) THEN (SELECT COALESCE(SUM(c.length), 0) "
                f"FROM staged_chunk AS c WHERE {chunks}) ELSE 0 END, "
                f"CASE WHEN s.status IN ({marks}) THEN (SELECT COUNT(*) "
                f"FROM staged_object AS o WHERE {objects}) ELSE 0 END "
                "FROM restore_state AS s LEFT JOIN restore_plan AS p "
                f"ON {_SAME_KEY.format(t='p')} "
                "ORDER BY s.updated_at DESC, s.cluster_id, s.node_name, s.restore_id LIMIT ?",
                [*counted, *counted, limit],
            )
        return {
            (str(c), str(n), str(r)): (int(maps), int(objs), int(total), int(staged), int(done))
            for c, n, r, maps, objs, total, staged, done in rows
        }
