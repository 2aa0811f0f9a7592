"""`Upkeep`: the calls retention makes (`retention.py` runs them; the SQL is `forgetting.py`'s).

One bounded step of forgetting what finished long ago (`forget_expired`, which drops the node
states `get()` keeps in memory: a forgotten state must not be answered from it), free pages
given back to the file system (`vacuum`), the WAL moved into the file (`checkpoint`), and the
files' size on disk (`file_bytes`).
"""

from __future__ import annotations

from agent.store import forgetting
from agent.store.codec import check_count
from agent.store.database import Database
from agent.store.files import database_bytes
from agent.store.node_states import StateMemory

__all__ = ["Upkeep"]


class Upkeep:
    """Forgetting, vacuuming and checkpointing, each a short hold of the connection."""

    def __init__(self, database: Database, memory: StateMemory) -> None:
        self._database = database
        self._memory = memory

    async def forget_expired(self, cutoff_ms: int, *, rows: int) -> forgetting.ForgetStep:
        """One bounded step of forgetting what finished before `cutoff_ms` (at most about
        `rows` rows, one transaction): `forgetting.forget_step`."""
        check_count("rows", rows, minimum=1)
        with self._memory.writing(None):
            async with self._database.connection(write=True) as db:
                return await forgetting.forget_step(db, cutoff_ms=cutoff_ms, rows=rows)

    async def vacuum(self, *, pages: int) -> int:
        """Give up to `pages` free pages back to the file system; the bytes freed."""
        check_count("pages", pages, minimum=1)
        async with self._database.connection() as db:
            freed = await forgetting.vacuum_step(db, pages=pages)
            return freed * await forgetting.page_size(db) if freed else 0

    async def checkpoint(self) -> None:
        """Move the WAL into the database file; truncate the WAL."""
        async with self._database.connection() as db:
            await forgetting.checkpoint(db)

    def file_bytes(self) -> int:
        """The database's files on disk now: the database and its WAL, in bytes."""
        return database_bytes(self._database.path)
