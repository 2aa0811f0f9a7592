"""A `JobRunner` running on a store for the length of an `async for` (one pass): the fixture
in conftest.py uses it, and so do tests that stop a runner and start another on the same
store."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from agent.relay.runner import JobRunner
from agent.store import RevisionStore


async def running(store: RevisionStore) -> AsyncIterator[JobRunner]:
    """A started runner; closed (5 s bound) and awaited when the loop body ends."""
    runner = JobRunner(store)
    task = asyncio.create_task(runner.run())
    await runner.started()
    try:
        yield runner
    finally:
        await runner.close(5)
        await task
