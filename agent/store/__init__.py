"""Durable state: the revision store (aiosqlite, compare-and-swap in SQL over the domain's tables).

It takes and returns the domain's values (`agent.domain`: `RestoreKey`, `StoredState`,
`JobKey`, `StoredJob`) and builds its SQL from the domain's transition tables; it imports no
engine.

- `store`: `RevisionStore` — open/check/migrate the database, `get`, `mutate`, `list_unfinished`,
  the plan written once at prepare (`plan`, `resource_mappings`, `manifest_entry`,
  `staging_complete`), the resumable-staging progress (`record_chunk`, `verified_chunks`,
  `mark_object_written`, `written_objects`, `forget_object`) and the relay jobs (`get_job`,
  `list_jobs`, `running_restore`, `move_job`; their SQL in `job_table`).
- `records`: the records it returns (`ChunkRecord`, `ObjectRecord`, `ManifestEntry`) and
  `StatusSummary` for the metrics.
- `codec`: node states and plans to JSON and back; `transitions`: a table's moves as SQL.
- `schema`: the ordered migrations; `startup`: the start-up checks.
- `files`: directory/file modes and moving a damaged database aside.
"""

from agent.store.records import ChunkRecord, ObjectRecord, StatusSummary
from agent.store.store import DB_NAME, RevisionStore

__all__ = ["DB_NAME", "ChunkRecord", "ObjectRecord", "RevisionStore", "StatusSummary"]
