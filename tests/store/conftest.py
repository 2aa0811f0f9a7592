"""Fixtures for the revision store tests: real SQLite files in tmp_path, a manual clock.

Test modules cannot import this file (importlib mode), so the shared values travel as fixtures:
`state_dir`, `clock`, `store` (open on a fresh file) and `prepared_store` (`KEY` at revision 2,
status prepared, written by one `prepare` request with digest "a" * 64).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent.domain.restore_machine import Op
from agent.store import RevisionStore
from tests.clock import ManualClock
from tests.store.states import KEY, node_state, plan

NOW = 1_700_000_000.0  # 2023-11-14T22:13:20Z


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    """Where the store keeps its database (created by the store itself)."""
    return tmp_path / "state"


@pytest.fixture
def clock() -> ManualClock:
    """The store's clock, at NOW until a test advances it."""
    return ManualClock(start=NOW)


@pytest.fixture
async def store(state_dir: Path, clock: ManualClock) -> AsyncIterator[RevisionStore]:
    """An open store on a fresh file, closed after the test."""
    opened = await RevisionStore.open(state_dir, clock=clock)
    try:
        yield opened
    finally:
        await opened.aclose()


@pytest.fixture
async def prepared_store(store: RevisionStore) -> RevisionStore:
    """`store` holding KEY at revision 2 in status prepared."""
    state = node_state()
    await store.mutate(
        KEY,
        expected_revision=0,
        op=Op.PREPARE,
        state=state,
        plan=plan(),
        request_digest="a" * 64,
    )
    await store.mutate(KEY, expected_revision=1, op=Op.PREPARE_SUCCEEDED, state=state)
    return store
