"""The relay tests' store (a real SQLite file in a tmp dir) and a running `JobRunner` on it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent.relay.runner import JobRunner
from agent.store import RevisionStore
from tests.relay._runners import running


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[RevisionStore]:
    opened = await RevisionStore.open(tmp_path / "state")
    try:
        yield opened
    finally:
        await opened.aclose()


@pytest.fixture
async def runner(store: RevisionStore) -> AsyncIterator[JobRunner]:
    async for started in running(store):
        yield started
