"""`Plans`: the plan prepare fixed, read back by the work that needs it, and no more of it.

The engine's `PreparedPlan` is written once, with the state it belongs to (`node_states.py`,
in the transaction that creates the row), and never again: its mappings and manifest live in
`restore_plan`, its manifest's objects are rows of `manifest_object`. A request reads the small
state row only; the manifest is asked by key (`manifest_entry`: in the manifest? written?;
`staging_complete`), the mappings only by the work that needs them (`resource_mappings`), the
whole plan only by a prepare's work (`plan`). The JSON is read by `codec.py` only.
"""

from __future__ import annotations

import asyncio

from agent.contracts.isolatedrestore import ResourceMapping
from agent.domain.restores import PreparedPlan, RestoreKey
from agent.store.codec import read_mappings, read_plan
from agent.store.database import Database
from agent.store.node_states import KEY_WHERE, not_found
from agent.store.records import ManifestEntry

__all__ = ["Plans"]


class Plans:
    """The plan of a restore, by the parts its readers ask."""

    def __init__(self, database: Database) -> None:
        self._database = database

    async def plan(self, key: RestoreKey) -> PreparedPlan:
        """The whole plan of `key` (its manifest included); `RestoreNotFound` without one."""
        async with self._database.connection() as db:
            rows = await db.execute_fetchall(
                "SELECT mappings_json, manifest_json FROM restore_plan "  # noqa: S608
                f"WHERE {KEY_WHERE}",
                key.as_params(),
            )
        for mappings_json, manifest_json in rows:
            # The whole manifest (10,000 objects take ~40 ms to validate): off the loop.
            return await asyncio.to_thread(read_plan, mappings_json, manifest_json)
        raise not_found(key)

    async def resource_mappings(self, key: RestoreKey) -> list[ResourceMapping]:
        """The plan's resource mappings of `key` (its manifest left unread)."""
        async with self._database.connection() as db:
            rows = await db.execute_fetchall(
                f"SELECT mappings_json FROM restore_plan WHERE {KEY_WHERE}",  # noqa: S608
                key.as_params(),
            )
        for (mappings_json,) in rows:
            return read_mappings(mappings_json)
        raise not_found(key)

    async def manifest_entry(self, key: RestoreKey, object_path: str) -> ManifestEntry | None:
        """The manifest's object at `object_path` and whether it is written, or None when the
        manifest of `key` lists no such path (one keyed lookup, whatever the manifest's size)."""
        async with self._database.connection() as db:
            rows = await db.execute_fetchall(
                "SELECT m.size, m.sha256, EXISTS (SELECT 1 FROM staged_object AS o "
                "WHERE o.cluster_id = m.cluster_id AND o.node_name = m.node_name "
                "AND o.restore_id = m.restore_id AND o.object_path = m.object_path) "
                "FROM manifest_object AS m WHERE m.cluster_id = :cluster_id "
                "AND m.node_name = :node_name AND m.restore_id = :restore_id "
                "AND m.object_path = :path",
                {**key.as_params(), "path": object_path},
            )
        return next((ManifestEntry(size, sha256, bool(w)) for size, sha256, w in rows), None)

    async def staging_complete(self, key: RestoreKey) -> bool:
        """Whether every manifest object of `key` is written with its manifest size and sha256
        (true for an empty manifest)."""
        async with self._database.connection() as db:
            rows = await db.execute_fetchall(
                "SELECT NOT EXISTS (SELECT 1 FROM manifest_object AS m "
                "WHERE m.cluster_id = :cluster_id AND m.node_name = :node_name "
                "AND m.restore_id = :restore_id AND NOT EXISTS (SELECT 1 FROM staged_object AS o "
                "WHERE o.cluster_id = m.cluster_id AND o.node_name = m.node_name "
                "AND o.restore_id = m.restore_id AND o.object_path = m.object_path "
                "AND o.size = m.size AND o.sha256 = m.sha256))",
                key.as_params(),
            )
        return bool(next(iter(rows))[0])
