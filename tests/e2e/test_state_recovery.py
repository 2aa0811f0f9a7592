"""End to end: after a damaged state is salvaged or reset, nothing of it stays on Corestore.

A restore is left `cleanup-failed` (Corestore refused to delete its scratch resources), a
closure import is left open, and the state database is damaged where the restore's row lives.
The agent then refuses to start; an operator salvages (or resets) the state; the agent starts,
reconciles with the node's Corestore (agent/startup/reconcile.py): it adopts the restore it no
longer knew as `cleanup-failed` and aborts the import. Cloudly's next cleanup of the restore (its
stale revision is answered `revision-conflict` with the current one; the cleanup at that one
proceeds) ends `cleaned`, and Corestore's disk holds nothing of either.
"""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agent.contracts.relay import DatabaseClosureDescriptor
from agent.corestore.client import CorestoreClient
from agent.corestore.routes import RouteName
from agent.errors import CallFailed, StoreCorrupt
from agent.secret import Secret
from agent.store import DB_NAME, RevisionStore
from agent.store.recovery import read_recovery
from agent.store.salvage import reset, salvage
from devstack.corestore.services import receipt_for
from devstack.driver import RestorePlan

BEARER = "e2e-corestore-bearer-SENTINEL-77ab3f"  # conftest's
IMPORT = "closure-orphan-import-1"


async def _left_cleanup_failed(stack: Any, plan: RestorePlan) -> int:
    """A restore to `ready`, then a cleanup Corestore refuses: `cleanup-failed`; its revision."""
    async with stack.agent():
        driver = stack.driver(plan)
        await driver.prepare()
        await driver.stage_all()
        await driver.execute()
        await driver.wait_until({"ready"})
        stack.faults.fail_next(RouteName.DELETE_RESOURCE, status=409, code="busy", times=3)
        state = await stack.clean_up(driver)
    assert state["status"] == "cleanup-failed"
    return int(state["revision"])


async def _open_orphan_import(stack: Any) -> None:
    """A closure import opened and left, as a relay restore killed mid-import leaves one."""
    data = b"orphan closure bytes" * 100
    sha = hashlib.sha256(data).hexdigest()

    descriptor = DatabaseClosureDescriptor.model_validate(
        {
            "size": len(data),
            "sha256": sha,
            "receipt": receipt_for("svc-1", "backup-1", len(data), sha),
        }
    )
    async with CorestoreClient(stack.corestore.url, Secret(BEARER)) as client:
        await client.open_closure_import(
            IMPORT, service_id="svc-1", backup_id="backup-1", descriptor=descriptor
        )
        await client.put_closure_chunk(
            IMPORT, 0, data[:1000], hashlib.sha256(data[:1000]).hexdigest()
        )


def _damage_restore_rows(state: Path) -> None:
    """Overwrite the pages of the restore's own row (the restore_state table's b-tree): the
    database fails its integrity check and the restore's record is what is lost."""
    path = state / DB_NAME
    with sqlite3.connect(path) as db:
        root = db.execute(
            "SELECT rootpage FROM sqlite_schema WHERE name = 'restore_state'"
        ).fetchone()[0]
        page_size = db.execute("PRAGMA page_size").fetchone()[0]
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    with path.open("r+b") as raw:
        raw.seek((root - 1) * page_size)
        raw.write(b"\xa5" * 2048)


async def _metric(stack: Any, name: str) -> str:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://{stack.health}/metrics") as response,
    ):
        text = await response.text()
    return "\n".join(line for line in text.splitlines() if line.startswith(name))


@pytest.mark.parametrize("way", ["salvage", "reset"])
async def test_after_a_salvage_or_reset_nothing_of_the_lost_state_stays_on_corestore(
    stack: Any, plan: RestorePlan, way: str
) -> None:
    revision = await _left_cleanup_failed(stack, plan)
    await _open_orphan_import(stack)
    assert any(name.startswith("imports/") for name in stack.leftovers())
    assert any(name.startswith("scratch/") for name in stack.leftovers())
    _damage_restore_rows(stack.state_dir)
    with pytest.raises(StoreCorrupt):
        await RevisionStore.open(stack.state_dir)
    if way == "salvage":
        report = salvage(stack.state_dir, name=DB_NAME, now=1_800_000_000.0, sqlite3_cli="none")
        assert report.tables["restore_state"].kept == 0  # the restore's row was on that page
    else:
        reset(stack.state_dir, name=DB_NAME, now=1_800_000_000.0)
    aborts = stack.hits[RouteName.CLOSURE_IMPORT_ABORT]
    async with stack.agent() as status:
        driver = stack.driver(plan)
        adopted = await driver.wait_until({"cleanup-failed"}, timeout=30)
        await stack.wait_hits(RouteName.CLOSURE_IMPORT_ABORT, aborts + 1)
        assert adopted["lastErrorCode"] == "state-lost"
        assert adopted["sourceBackupId"] == "unknown"
        with pytest.raises(CallFailed) as stale:
            await driver.cleanup(expected_revision=revision)
        assert stale.value.error_data["code"] == "revision-conflict"
        current = stale.value.error_data["currentRevision"]
        await driver.cleanup(expected_revision=current)
        cleaned = await driver.wait_until({"cleaned", "cleanup-failed"}, timeout=30)
        orphans = await _metric(stack, "restore_agent_reconcile_orphans_total")
        recovered = await _metric(stack, "restore_agent_state_recovered_timestamp_seconds")
        del status
    assert cleaned["status"] == "cleaned"
    assert stack.leftovers() == []
    assert 'restore_agent_reconcile_orphans_total{what="restore"} 1.0' in orphans
    assert 'restore_agent_reconcile_orphans_total{what="import"} 1.0' in orphans
    how = "salvaged" if way == "salvage" else "reset"
    assert f'restore_agent_state_recovered_timestamp_seconds{{how="{how}"}} 1.8e+09' in recovered
    record = read_recovery(stack.state_dir)
    assert record is not None
    assert not record.pending
