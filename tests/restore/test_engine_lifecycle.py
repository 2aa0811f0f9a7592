"""The engine's own task: owned even when starting it is cancelled half-way."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agent.restore.background import WorkOwner
from agent.store import RevisionStore


async def test_a_cancelled_start_leaves_no_engine_task_running(tmp_path: Path) -> None:
    """`async with engine` cancelled while it waits for `run()` cancels and awaits that task."""
    store = await RevisionStore.open(tmp_path)
    try:
        owner = WorkOwner(store)
        with pytest.raises(TimeoutError):
            # timeout(0) cancels the entering task at its first wait: inside __aenter__.
            async with asyncio.timeout(0):
                await owner.__aenter__()
        leftover = [
            task
            for task in asyncio.all_tasks()
            if task.get_name() == "isolated-restore-engine" and not task.done()
        ]
        assert leftover == []
    finally:
        await store.aclose()
