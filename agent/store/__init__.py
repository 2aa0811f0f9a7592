"""Durable state: the revision store (aiosqlite, compare-and-swap in SQL over the domain's tables).

It takes and returns the domain's values (`agent.domain`: `RestoreKey`, `StoredState`,
`JobKey`, `StoredJob`) and builds its SQL from the domain's transition tables; it imports no
engine.

- `store`: `RevisionStore` — opens (checks, migrates) the database; each of its calls is the
  method of the small object that owns its concern, each over `database`'s connections:
  `node_states` (`get`, `kept`, `mutate`, `list_unfinished`; the plan written with a new
  state), `plans` (`plan`, `resource_mappings`, `manifest_entry`, `staging_complete`),
  `staging` (the resumable-staging progress: `record_chunk`, `verified_chunks`,
  `mark_object_written`, `written_objects`, `forget_object`), `relay_jobs` (`get_job`,
  `list_jobs`, `running_restore`, `last_restore`, `mark_delivered`, `move_job`; their SQL in
  `job_table`), `reports` (what an operator and the metrics see) and `upkeep` (retention's
  steps; their SQL in `forgetting`).
- `database`: the connections, their lock, sqlite3's failures as `StoreError`, a write the disk
  refused (`faults`).
- `records`: the records it returns (`ChunkRecord`, `ObjectRecord`, `ManifestEntry`) and
  `StatusSummary` for the metrics.
- `codec`: node states and plans to JSON and back; `transitions`: a table's moves as SQL.
- `schema`: the ordered migrations; `startup`: the start-up checks.
- `files`: directory/file modes, moving a damaged database aside and the files named after it.
- `salvage` (`state salvage|reset`, reading with `damaged_reads`), `rollback` (`state
  rollback`), both reading a file's schema with `file_schema`; `recovery`: their record.
- `statedir`: the state directory the store lives in: its checks, its creation, the one-agent
  lock and the record of a refused start.
"""

from agent.store.records import ChunkRecord, ObjectRecord, StatusSummary
from agent.store.store import DB_NAME, RevisionStore

__all__ = ["DB_NAME", "ChunkRecord", "ObjectRecord", "RevisionStore", "StatusSummary"]
