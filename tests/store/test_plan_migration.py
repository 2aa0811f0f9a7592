"""Migration 4 on a database an earlier agent wrote: each plan leaves the hot row for its own
table, its manifest becomes keyed rows, and what was staged stays staged."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from agent.domain.restores import PreparedPlan, RestoreKey
from agent.store import DB_NAME, RevisionStore
from agent.store.codec import encode_state
from agent.store.schema import MIGRATIONS
from agent.store.startup import open_database
from tests.clock import ManualClock
from tests.store.states import KEY, node_state, plan

A, B = "a" * 64, "b" * 64
BARE = RestoreKey("cluster-1", "node-1", "restore-bare")


def _v3_plan() -> PreparedPlan:
    wire = plan(base=7).to_wire()
    wire["archiveManifest"]["objects"] = [
        {"path": "snap-1/a.bin", "size": 10, "sha256": A},
        {"path": "snap-1/b.bin", "size": 20, "sha256": B},
    ]
    return PreparedPlan.from_wire(wire)


PLAN = _v3_plan()


async def _schema_3_database(state_dir: Path, clock: ManualClock) -> None:
    """KEY staging with one of its two objects written (its chunk recorded), and a row whose
    private column holds no plan at all, as schema 3 stored them."""
    db = await open_database(
        state_dir / DB_NAME, busy_timeout=1, clock=clock, migrations=MIGRATIONS[:3]
    )
    private = json.dumps(PLAN.to_wire(), sort_keys=True, separators=(",", ":"))
    try:
        await db.executemany(
            "INSERT INTO restore_state VALUES (?, ?, ?, ?, ?, ?, ?, NULL, ?)",
            [
                (*_routing(KEY), 3, "staging", encode_state(KEY, node_state(KEY)), private, 5),
                (*_routing(BARE), 1, "preparing", encode_state(BARE, node_state(BARE)), "{}", 6),
            ],
        )
        await db.execute_fetchall(
            "INSERT INTO staged_chunk VALUES (?, ?, ?, 'snap-1/a.bin', 0, 10, ?)",
            (*_routing(KEY), A),
        )
        await db.execute_fetchall(
            "INSERT INTO staged_object VALUES (?, ?, ?, 'snap-1/a.bin', 10, ?, 5)",
            (*_routing(KEY), A),
        )
    finally:
        await db.close()


def _routing(key: RestoreKey) -> tuple[str, str, str]:
    return (key.cluster_id, key.node_name, key.restore_id)


@pytest.fixture
async def migrated(state_dir: Path, clock: ManualClock) -> RevisionStore:
    await _schema_3_database(state_dir, clock)
    return await RevisionStore.open(state_dir, clock=clock)


async def test_the_plan_reads_back_as_it_was_stored(migrated: RevisionStore) -> None:
    """Mappings, manifest objects in order and the manifest's extra fields come over."""
    async with migrated as store:
        assert await store.plan(KEY) == PLAN


async def test_the_state_row_keeps_its_state_and_loses_the_plan_column(
    migrated: RevisionStore,
) -> None:
    """The node state reads as before, at its revision; `private_json` is gone."""
    async with migrated as store:
        stored = await store.get(KEY)
        path = store.path
    assert stored is not None
    assert (stored.revision, stored.status, stored.updated_at) == (3, "staging", 5)
    with sqlite3.connect(path) as raw:
        columns = [row[1] for row in raw.execute("PRAGMA table_info(restore_state)")]
    raw.close()
    assert "private_json" not in columns


async def test_a_staged_object_stays_written_and_the_other_stays_to_stage(
    migrated: RevisionStore,
) -> None:
    """The manifest's rows meet the staging rows already there: staging is not complete."""
    async with migrated as store:
        written = await store.manifest_entry(KEY, "snap-1/a.bin")
        pending = await store.manifest_entry(KEY, "snap-1/b.bin")
        complete = await store.staging_complete(KEY)
    assert written is not None
    assert pending is not None
    assert (written.written, pending.written, complete) == (True, False, False)


async def test_the_plan_counts_come_over_for_the_operator_rows(migrated: RevisionStore) -> None:
    """Mappings, objects and bytes of the manifest, and the staging so far."""
    async with migrated as store:
        facts = await store.restore_facts(counted={"staging"})
    assert facts[_routing(KEY)] == (1, 2, 30, 10, 1)


async def test_a_row_without_a_plan_migrates_to_an_empty_one(migrated: RevisionStore) -> None:
    """A private column without a plan becomes no mapping and an empty manifest."""
    async with migrated as store:
        bare = await store.plan(BARE)
    assert (bare.resource_mappings, bare.archive_manifest.objects) == ([], [])
