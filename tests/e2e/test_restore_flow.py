"""One isolated restore through the real agent session and the reference Corestore, end to end."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

import pytest

from agent.contracts.isolatedrestore import IsolatedRestoreNodeState
from devstack.driver import RestorePlan, StateSeen

MiB = 1024 * 1024


@pytest.fixture
def big_size() -> int:
    """A 256 MiB volume image next to the small objects."""
    return 256 * MiB


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(MiB):
            digest.update(block)
    return digest.hexdigest()


async def _on_disk_digests(stack: Any, plan: RestorePlan) -> dict[str, str]:
    return {
        spec.path: await asyncio.to_thread(_sha256_file, stack.staged_file(plan, spec.path))
        for spec in plan.objects
    }


@pytest.mark.parametrize("chunk_form", ["base64"])  # 9.5 s; the Buffer form takes 20 s
async def test_a_restore_with_a_256_mib_object_runs_from_prepare_to_cleaned(
    stack: Any, plan: RestorePlan
) -> None:
    """prepare -> stage x5 (one 256 MiB) -> execute -> ready -> cleanup -> cleaned, bytes proven."""
    seen: list[StateSeen] = []
    driver = stack.driver(
        plan,
        piece_size=MiB,
        on_progress=lambda event: seen.append(event) if isinstance(event, StateSeen) else None,
    )
    async with stack.agent(chunk_size=4 * MiB):
        assert (await driver.prepare())["status"] == "prepared"
        assert (await driver.stage_all())["status"] == "staging"
        assert (await driver.execute())["status"] == "restoring"
        ready = await driver.wait_until({"ready", "failed"})
        on_disk = await _on_disk_digests(stack, driver.plan)
        await driver.cleanup()
        cleaned = await driver.wait_until({"cleaned", "cleanup-failed"})
    assert ready["status"] == "ready", ready.get("lastErrorCode")
    assert ready["verification"]["status"] == "passed"
    assert sorted(ready["completedResourceMappingIds"]) == ["map-db", "map-media", "map-volume"]
    assert on_disk == {spec.path: spec.sha256 for spec in driver.plan.objects}
    assert cleaned["status"] == "cleaned"
    assert stack.leftovers() == []
    revisions = [event.revision for event in seen]
    assert revisions == sorted(set(revisions)), "every answer showed a newer revision"
    IsolatedRestoreNodeState.from_wire(cleaned)
