"""The database file gives freed pages back: a new file from the start, an older one after one
`VACUUM` at start-up, unless there is no room for it (then it opens as it was)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from agent.store import DB_NAME, RevisionStore
from agent.store.schema import MIGRATIONS, split_statements
from agent.store.startup import open_database
from tests.clock import ManualClock
from tests.store.states import KEY

INCREMENTAL = 2


def _auto_vacuum(path: Path) -> int:
    with sqlite3.connect(path) as raw:
        mode = int(raw.execute("PRAGMA auto_vacuum").fetchone()[0])
    raw.close()
    return mode


def _older_database(state_dir: Path) -> Path:
    """Schema 3 as an earlier agent made it (auto_vacuum NONE), holding one node state."""
    state_dir.mkdir(mode=0o700)
    path = state_dir / DB_NAME
    raw = sqlite3.connect(path, isolation_level=None)
    try:
        raw.execute("PRAGMA journal_mode = WAL")
        raw.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at INTEGER)")
        for version, migration in enumerate(MIGRATIONS[:3], start=1):
            for statement in split_statements(migration):
                raw.execute(statement)
            raw.execute("INSERT INTO schema_version VALUES (?, 0)", (version,))
        raw.execute(
            "INSERT INTO restore_state VALUES (?, ?, ?, 2, 'prepared', ?, ?, NULL, 7)",
            (
                KEY.cluster_id,
                KEY.node_name,
                KEY.restore_id,
                '{"sourceBackupId":"backup-1","sourceServiceId":"service-1",'
                '"scratchNamespaceId":"scratch-1","stagingArchiveId":"staging-1",'
                '"completedResourceMappingIds":[],'
                '"verification":{"status":"pending","results":[]}}',
                '{"resourceMappings":[],"archiveManifest":{"objects":[]}}',
            ),
        )
    finally:
        raw.close()
    path.chmod(0o600)
    return path


async def test_a_new_database_gives_freed_pages_back_from_the_start(state_dir: Path) -> None:
    """auto_vacuum is INCREMENTAL in a file this agent made."""
    async with await RevisionStore.open(state_dir) as store:
        path = store.path
    assert _auto_vacuum(path) == INCREMENTAL


async def test_an_older_database_is_rewritten_once_keeping_its_rows(
    state_dir: Path, clock: ManualClock
) -> None:
    """The start-up `VACUUM` switches the mode; the state reads as before."""
    path = _older_database(state_dir)
    assert _auto_vacuum(path) == 0
    async with await RevisionStore.open(state_dir, clock=clock) as store:
        stored = await store.get(KEY)
    assert _auto_vacuum(path) == INCREMENTAL
    assert stored is not None
    assert (stored.revision, stored.status, stored.updated_at) == (2, "prepared", 7)


async def test_without_room_for_a_copy_an_older_database_opens_as_it_was(
    state_dir: Path, clock: ManualClock
) -> None:
    """Less free space than twice the file: no `VACUUM`, the mode stays, the rows serve, and
    the observer hears it (the metric `..._vacuum_failures_total{reason="skipped"}`)."""
    path = _older_database(state_dir)
    heard: list[str] = []

    class Observer:
        def vacuum_failed(self, *, reason: str) -> None:
            heard.append(reason)

    db = await open_database(
        path,
        busy_timeout=1,
        clock=clock,
        free_bytes=lambda _: 0,
        observer=Observer(),  # type: ignore[arg-type]
    )
    try:
        rows = list(await db.execute_fetchall("SELECT revision FROM restore_state"))
    finally:
        await db.close()
    assert (_auto_vacuum(path), rows, heard) == (0, [(2,)], ["skipped"])
