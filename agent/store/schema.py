"""The state database schema as an ordered tuple of migrations.

`MIGRATIONS[i]` takes the schema from version `i` to version `i + 1`. A released migration is
never edited, only followed by a new one: the `schema_version` table records which ones ran
(one row per version), and `RevisionStore.open()` runs the missing ones, all in one
transaction, and refuses a database whose version is newer than this agent knows.

Tables (version 1):

- `restore_state`: one row per (cluster_id, node_name, restore_id). `revision` >= 1 (an absent
  row is revision 0), `status` one of `TIsolatedRestoreNodeStatus`, `state_json` the wire state
  *without* the fields the store owns (routing key, revision, status, updatedAt), `private_json`
  the engine's private fields (its `PreparedPlan`, see `codec.py`), `mutation_digest` the
  request digest of the last request that mutated the row, `updated_at` in epoch milliseconds.
- `staged_chunk`: resumable staging progress, one row per chunk written to Corestore.
- `staged_object`: objects proven complete (size and sha256 checked).

Version 2 adds `relay_job`: one row per relay backup or restore, keyed by (cluster_id, node_id,
kind, backup_id, service_id). `status` one of `agent.domain.job_machine.JOB_STATUSES`,
`revision` >= 1 (advanced by every move of the job table), `request_digest` the canonical
digest of the request that owns the key, `result_json` the recorded outcome (`{"response",
"report"}` once succeeded, `{"error"}` once failed, NULL while running), `attempts` how many
times the work started, `created_at`/`updated_at` in epoch milliseconds.

Version 3 numbers restores: a backup may be restored many times, so a restore row is one run,
keyed by (cluster_id, node_id, kind, backup_id, service_id, run). `run` is 0 for a backup (one
backupId is one backup) and 1, 2, ... per (cluster_id, node_id, service_id) for restores; a
unique partial index holds at most one `running` restore per service on a node. Existing rows
move over as they are, each restore numbered in the order it was created, except a restore
left `running`: the migration runs at start-up, before any work, so that run was interrupted
by the agent stopping. It becomes `failed` with the error the agent records for an interrupted
restore (`shutting-down`, retryable; docs/relay.md) and its revision moves on, so two of them
for one service can never break the index and the next request restores anew.

Version 4 keeps the prepare request's plan out of the hot row. The plan never changes after
prepare, yet every request read `private_json` (the whole manifest) and every mutation wrote
and returned it: `restore_plan` now holds it once (`mappings_json`, `manifest_json`, read only
by the work that needs them, with the counts the operator's rows show), and `manifest_object`
indexes the manifest by path, so "is this object in the manifest" and "is it written" are keyed
lookups. Existing rows are split with SQLite's JSON functions, then `private_json` is dropped.
The status indexes gain `updated_at` (retention finds old finished rows by them) and restore
runs get an index of their own (a restore's `start` numbers its run by it). Retention may delete
a restore's rows in several transactions, its children first: every child table refers to its
`restore_state` row `ON DELETE CASCADE`, so a parent's delete never leaves an orphan.

Version 5 keeps what a repeat is judged by (docs/relay.md, "Jobs and repeats"). `plan_json`
is a restore run's plan, fixed when it starts: its destructive effects on the node, each under
the idempotency key Corestore applies once, and its outcome once all are applied
(`agent.domain.outcomes.RunPlan`); a resumed run keeps it. `delivered_at` (epoch ms) is when
the job's recorded answer was known to have reached Cloudly (the ping rule), NULL while it is
not known; every move of the job clears it. Rows an older agent finished count as delivered
(that agent answered every restore by running it), so nothing changes for them.

SQL only, no Python values: the status list is written out, not generated, so that changing
the state machine can never silently rewrite a released migration.
"""

from __future__ import annotations

import sqlite3
from typing import Final

from agent.errors import InvalidState

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "VERSION_TABLE", "split_statements"]

VERSION_TABLE: Final = """
CREATE TABLE IF NOT EXISTS schema_version (
    version    INTEGER PRIMARY KEY CHECK (version >= 1),
    applied_at INTEGER NOT NULL
)
"""

_V1: Final = """
CREATE TABLE restore_state (
    cluster_id      TEXT    NOT NULL CHECK (length(cluster_id) > 0),
    node_name       TEXT    NOT NULL CHECK (length(node_name) > 0),
    restore_id      TEXT    NOT NULL CHECK (length(restore_id) > 0),
    revision        INTEGER NOT NULL CHECK (typeof(revision) = 'integer' AND revision >= 1),
    status          TEXT    NOT NULL CHECK (status IN (
                        'preparing', 'prepared', 'staging', 'restoring', 'verifying',
                        'ready', 'failed', 'cleaning', 'cleaned', 'cleanup-failed')),
    state_json      TEXT    NOT NULL,
    private_json    TEXT    NOT NULL,
    mutation_digest TEXT    CHECK (mutation_digest IS NULL OR length(mutation_digest) = 64),
    updated_at      INTEGER NOT NULL,
    PRIMARY KEY (cluster_id, node_name, restore_id)
) WITHOUT ROWID;

CREATE INDEX restore_state_by_status ON restore_state (status);

CREATE TABLE staged_chunk (
    cluster_id   TEXT    NOT NULL,
    node_name    TEXT    NOT NULL,
    restore_id   TEXT    NOT NULL,
    object_path  TEXT    NOT NULL CHECK (length(object_path) > 0),
    chunk_offset INTEGER NOT NULL CHECK (typeof(chunk_offset) = 'integer' AND chunk_offset >= 0),
    length       INTEGER NOT NULL CHECK (typeof(length) = 'integer' AND length > 0),
    sha256       TEXT    NOT NULL CHECK (length(sha256) = 64),
    PRIMARY KEY (cluster_id, node_name, restore_id, object_path, chunk_offset),
    FOREIGN KEY (cluster_id, node_name, restore_id)
        REFERENCES restore_state (cluster_id, node_name, restore_id) ON DELETE CASCADE
) WITHOUT ROWID;

CREATE TABLE staged_object (
    cluster_id  TEXT    NOT NULL,
    node_name   TEXT    NOT NULL,
    restore_id  TEXT    NOT NULL,
    object_path TEXT    NOT NULL CHECK (length(object_path) > 0),
    size        INTEGER NOT NULL CHECK (typeof(size) = 'integer' AND size >= 0),
    sha256      TEXT    NOT NULL CHECK (length(sha256) = 64),
    written_at  INTEGER NOT NULL,
    PRIMARY KEY (cluster_id, node_name, restore_id, object_path),
    FOREIGN KEY (cluster_id, node_name, restore_id)
        REFERENCES restore_state (cluster_id, node_name, restore_id) ON DELETE CASCADE
) WITHOUT ROWID;
"""

_V2: Final = """
CREATE TABLE relay_job (
    cluster_id     TEXT    NOT NULL CHECK (length(cluster_id) > 0),
    node_id        TEXT    NOT NULL CHECK (length(node_id) > 0),
    kind           TEXT    NOT NULL CHECK (kind IN ('backup', 'restore')),
    backup_id      TEXT    NOT NULL CHECK (length(backup_id) > 0),
    service_id     TEXT    NOT NULL CHECK (length(service_id) > 0),
    revision       INTEGER NOT NULL CHECK (typeof(revision) = 'integer' AND revision >= 1),
    status         TEXT    NOT NULL CHECK (status IN ('running', 'succeeded', 'failed')),
    request_digest TEXT    NOT NULL CHECK (length(request_digest) = 64),
    result_json    TEXT,
    attempts       INTEGER NOT NULL CHECK (typeof(attempts) = 'integer' AND attempts >= 1),
    created_at     INTEGER NOT NULL,
    updated_at     INTEGER NOT NULL,
    PRIMARY KEY (cluster_id, node_id, kind, backup_id, service_id)
) WITHOUT ROWID;

CREATE INDEX relay_job_by_status ON relay_job (status);
"""

_V3: Final = """
CREATE TABLE relay_job_v3 (
    cluster_id     TEXT    NOT NULL CHECK (length(cluster_id) > 0),
    node_id        TEXT    NOT NULL CHECK (length(node_id) > 0),
    kind           TEXT    NOT NULL CHECK (kind IN ('backup', 'restore')),
    backup_id      TEXT    NOT NULL CHECK (length(backup_id) > 0),
    service_id     TEXT    NOT NULL CHECK (length(service_id) > 0),
    run            INTEGER NOT NULL CHECK (typeof(run) = 'integer'
                       AND ((kind = 'backup' AND run = 0) OR (kind = 'restore' AND run >= 1))),
    revision       INTEGER NOT NULL CHECK (typeof(revision) = 'integer' AND revision >= 1),
    status         TEXT    NOT NULL CHECK (status IN ('running', 'succeeded', 'failed')),
    request_digest TEXT    NOT NULL CHECK (length(request_digest) = 64),
    result_json    TEXT,
    attempts       INTEGER NOT NULL CHECK (typeof(attempts) = 'integer' AND attempts >= 1),
    created_at     INTEGER NOT NULL,
    updated_at     INTEGER NOT NULL,
    PRIMARY KEY (cluster_id, node_id, kind, backup_id, service_id, run)
) WITHOUT ROWID;

INSERT INTO relay_job_v3 (
    cluster_id, node_id, kind, backup_id, service_id, run, revision, status, request_digest,
    result_json, attempts, created_at, updated_at)
SELECT cluster_id, node_id, kind, backup_id, service_id,
       CASE kind WHEN 'backup' THEN 0 ELSE ROW_NUMBER() OVER (
           PARTITION BY cluster_id, node_id, kind, service_id
           ORDER BY created_at, backup_id) END,
       CASE WHEN kind = 'restore' AND status = 'running' THEN revision + 1 ELSE revision END,
       CASE WHEN kind = 'restore' AND status = 'running' THEN 'failed' ELSE status END,
       request_digest,
       CASE WHEN kind = 'restore' AND status = 'running'
            THEN '{"error":{"code":"shutting-down","message":"the agent stopped while this '
                 || 'restore ran; it is not resumed: a new request restores anew",'
                 || '"retryable":true}}'
            ELSE result_json END,
       attempts, created_at,
       CASE WHEN kind = 'restore' AND status = 'running'
            THEN CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)
            ELSE updated_at END
FROM relay_job;

DROP TABLE relay_job;

ALTER TABLE relay_job_v3 RENAME TO relay_job;

CREATE INDEX relay_job_by_status ON relay_job (status);

CREATE UNIQUE INDEX relay_job_one_running_restore ON relay_job (cluster_id, node_id, service_id)
    WHERE kind = 'restore' AND status = 'running';
"""

_V4: Final = """
CREATE TABLE restore_plan (
    cluster_id     TEXT    NOT NULL,
    node_name      TEXT    NOT NULL,
    restore_id     TEXT    NOT NULL,
    mappings_json  TEXT    NOT NULL,
    manifest_json  TEXT    NOT NULL,
    mapping_count  INTEGER NOT NULL CHECK (typeof(mapping_count) = 'integer'
                                           AND mapping_count >= 0),
    object_count   INTEGER NOT NULL CHECK (typeof(object_count) = 'integer'
                                           AND object_count >= 0),
    manifest_bytes INTEGER NOT NULL CHECK (typeof(manifest_bytes) = 'integer'
                                           AND manifest_bytes >= 0),
    PRIMARY KEY (cluster_id, node_name, restore_id),
    FOREIGN KEY (cluster_id, node_name, restore_id)
        REFERENCES restore_state (cluster_id, node_name, restore_id) ON DELETE CASCADE
) WITHOUT ROWID;

CREATE TABLE manifest_object (
    cluster_id  TEXT    NOT NULL,
    node_name   TEXT    NOT NULL,
    restore_id  TEXT    NOT NULL,
    object_path TEXT    NOT NULL CHECK (length(object_path) > 0),
    size        INTEGER NOT NULL CHECK (typeof(size) = 'integer' AND size >= 0),
    sha256      TEXT    NOT NULL CHECK (length(sha256) = 64),
    PRIMARY KEY (cluster_id, node_name, restore_id, object_path),
    FOREIGN KEY (cluster_id, node_name, restore_id)
        REFERENCES restore_state (cluster_id, node_name, restore_id) ON DELETE CASCADE
) WITHOUT ROWID;

INSERT INTO restore_plan (
    cluster_id, node_name, restore_id, mappings_json, manifest_json, mapping_count,
    object_count, manifest_bytes)
SELECT cluster_id, node_name, restore_id,
       COALESCE(json_extract(private_json, '$.resourceMappings'), '[]'),
       COALESCE(json_extract(private_json, '$.archiveManifest'), '{"objects":[]}'),
       COALESCE(json_array_length(private_json, '$.resourceMappings'), 0),
       COALESCE(json_array_length(private_json, '$.archiveManifest.objects'), 0),
       (SELECT COALESCE(SUM(json_extract(entry.value, '$.size')), 0)
        FROM json_each(private_json, '$.archiveManifest.objects') AS entry)
FROM restore_state;

INSERT INTO manifest_object (cluster_id, node_name, restore_id, object_path, size, sha256)
SELECT state.cluster_id, state.node_name, state.restore_id,
       json_extract(entry.value, '$.path'), json_extract(entry.value, '$.size'),
       json_extract(entry.value, '$.sha256')
FROM restore_state AS state, json_each(state.private_json, '$.archiveManifest.objects') AS entry;

ALTER TABLE restore_state DROP COLUMN private_json;

DROP INDEX restore_state_by_status;

CREATE INDEX restore_state_by_status ON restore_state (status, updated_at);

DROP INDEX relay_job_by_status;

CREATE INDEX relay_job_by_status ON relay_job (status, updated_at);

CREATE INDEX relay_job_restore_runs ON relay_job (cluster_id, node_id, service_id, run)
    WHERE kind = 'restore';
"""

_V5: Final = """
ALTER TABLE relay_job ADD COLUMN plan_json TEXT;

ALTER TABLE relay_job ADD COLUMN delivered_at INTEGER;

UPDATE relay_job SET delivered_at = updated_at WHERE status != 'running';
"""

MIGRATIONS: Final[tuple[str, ...]] = (_V1, _V2, _V3, _V4, _V5)
"""Ordered; index `i` upgrades version `i` to `i + 1`."""

SCHEMA_VERSION: Final = len(MIGRATIONS)


def split_statements(script: str) -> list[str]:
    """The complete SQL statements of `script`, in order (semicolons in literals are safe).

    `executescript` would commit any open transaction first, so migrations run statement by
    statement inside the store's own transaction.
    """
    statements: list[str] = []
    buffer = ""
    for piece in script.split(";"):
        buffer += piece + ";"
        if sqlite3.complete_statement(buffer):
            if buffer.strip(" \t\r\n;"):
                statements.append(buffer.strip())
            buffer = ""
    if buffer.strip(" \t\r\n;"):
        raise InvalidState("migration ends with an incomplete SQL statement")
    return statements
