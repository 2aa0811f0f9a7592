"""`StagingProgress`: what a restore's staging has put into Corestore, so a stage resumes.

Private progress, not the node state: recording a chunk or a written object moves no revision.
A chunk Corestore accepted is a row of `staged_chunk` (by object path and offset; the same
offset recorded again replaces it), an object proven complete a row of `staged_object`. Both
refer to their node state, so a record for a restore the store holds no state of is refused by
the foreign key and answered `RestoreNotFound`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Final

from agent.domain.restores import RestoreKey
from agent.store.codec import check_count, check_path, check_sha256
from agent.store.database import Database
from agent.store.node_states import KEY_WHERE, not_found
from agent.store.records import ChunkRecord, ObjectRecord

__all__ = ["StagingProgress"]

_FOREIGN_KEY: Final = 787  # SQLITE_CONSTRAINT_FOREIGNKEY


class StagingProgress:
    """The chunks and written objects of each restore's staging."""

    def __init__(self, database: Database) -> None:
        self._database = database

    async def record_chunk(
        self, key: RestoreKey, object_path: str, offset: int, length: int, sha256: str
    ) -> None:
        """Remember that Corestore accepted `length` bytes of `object_path` at `offset`.

        Recording the same offset again replaces the record (the later write is what Corestore
        holds). `RestoreNotFound` when no state exists under `key`.
        """
        check_path(object_path)
        check_count("offset", offset, minimum=0)
        check_count("length", length, minimum=1)
        check_sha256(sha256)
        async with self._database.connection(write=True) as db, _missing_state_is_not_found(key):
            await db.execute_fetchall(
                "INSERT INTO staged_chunk (cluster_id, node_name, restore_id, object_path, "
                "chunk_offset, length, sha256) VALUES (:cluster_id, :node_name, :restore_id, "
                ":path, :offset, :length, :sha256) "
                "ON CONFLICT (cluster_id, node_name, restore_id, object_path, chunk_offset) "
                "DO UPDATE SET length = excluded.length, sha256 = excluded.sha256",
                {
                    **key.as_params(),
                    "path": object_path,
                    "offset": offset,
                    "length": length,
                    "sha256": sha256,
                },
            )
        self._database.observer.chunk_recorded(length=length)

    async def verified_chunks(self, key: RestoreKey, object_path: str) -> list[ChunkRecord]:
        """The recorded chunks of `object_path`, by offset."""
        async with self._database.connection() as db:
            rows = await db.execute_fetchall(
                "SELECT object_path, chunk_offset, length, sha256 FROM staged_chunk "  # noqa: S608
                f"WHERE {KEY_WHERE} AND object_path = :path ORDER BY chunk_offset",
                {**key.as_params(), "path": object_path},
            )
        return [ChunkRecord(*row) for row in rows]

    async def mark_object_written(
        self, key: RestoreKey, object_path: str, size: int, sha256: str
    ) -> None:
        """Remember that `object_path` is complete with `size` bytes hashing to `sha256`."""
        check_path(object_path)
        check_count("size", size, minimum=0)
        check_sha256(sha256)
        async with self._database.connection(write=True) as db, _missing_state_is_not_found(key):
            await db.execute_fetchall(
                "INSERT INTO staged_object (cluster_id, node_name, restore_id, object_path, "
                "size, sha256, written_at) VALUES (:cluster_id, :node_name, :restore_id, :path, "
                ":size, :sha256, :now) "
                "ON CONFLICT (cluster_id, node_name, restore_id, object_path) DO UPDATE SET "
                "size = excluded.size, sha256 = excluded.sha256, written_at = excluded.written_at",
                {
                    **key.as_params(),
                    "path": object_path,
                    "size": size,
                    "sha256": sha256,
                    "now": self._database.now_ms(),
                },
            )
        self._database.observer.object_written(size=size)

    async def written_objects(self, key: RestoreKey) -> list[ObjectRecord]:
        """The objects marked written under `key`, by path."""
        async with self._database.connection() as db:
            rows = await db.execute_fetchall(
                "SELECT object_path, size, sha256, written_at FROM staged_object "  # noqa: S608
                f"WHERE {KEY_WHERE} ORDER BY object_path",
                key.as_params(),
            )
        return [ObjectRecord(*row) for row in rows]

    async def forget_object(self, key: RestoreKey, object_path: str) -> None:
        """Drop the chunks and the written mark of `object_path` (one transaction)."""
        params = {**key.as_params(), "path": object_path}
        async with self._database.transaction() as db:
            await db.execute_fetchall(
                f"DELETE FROM staged_object WHERE {KEY_WHERE} AND object_path = :path",  # noqa: S608
                params,
            )
            await db.execute_fetchall(
                f"DELETE FROM staged_chunk WHERE {KEY_WHERE} AND object_path = :path",  # noqa: S608
                params,
            )


@asynccontextmanager
async def _missing_state_is_not_found(key: RestoreKey) -> AsyncIterator[None]:
    """Turn the foreign-key failure of a progress row without a state into `RestoreNotFound`."""
    try:
        yield
    except sqlite3.IntegrityError as exc:
        if exc.sqlite_errorcode == _FOREIGN_KEY:
            raise not_found(key) from exc
        raise
