"""Durable isolated-restore state: the revision store (aiosqlite, compare-and-swap in SQL).

- `store`: `RevisionStore` — open/check/migrate the database, `get`, `mutate`, `list_unfinished`,
  and the resumable-staging progress (`record_chunk`, `verified_chunks`, `mark_object_written`,
  `written_objects`, `forget_object`).
- relay jobs (`get_job`, `list_jobs`, `running_restore`, `move_job`; rows and SQL in `jobs`:
  `JobKey`, `StoredJob`).
- `records`: the typed values it takes and returns (`RestoreKey`, `StoredState`,
  `StatusSummary` for the metrics, ...).
- `schema`: the ordered migrations.
- `files`: directory/file modes and moving a damaged database aside.
"""

from agent.store.jobs import JobKey, StoredJob
from agent.store.records import ChunkRecord, ObjectRecord, RestoreKey, StatusSummary, StoredState
from agent.store.store import DB_NAME, RevisionStore

__all__ = [
    "DB_NAME",
    "ChunkRecord",
    "JobKey",
    "ObjectRecord",
    "RestoreKey",
    "RevisionStore",
    "StatusSummary",
    "StoredJob",
    "StoredState",
]
