"""The store's reader connection: `get()` waits for no write and sees every committed one."""

from __future__ import annotations

import asyncio

import pytest

from agent.domain.restore_machine import Op
from agent.errors import StoreError
from agent.store import RevisionStore
from tests.store.states import KEY, node_state


async def test_a_read_is_answered_while_a_write_holds_the_connection(
    prepared_store: RevisionStore,
) -> None:
    """With the writer's connection taken (a long transaction, queued chunk records), `get()`
    still answers: a status never queues behind staging's writes."""
    async with prepared_store._lock:  # what every write holds while it runs
        async with asyncio.timeout(5):
            stored = await prepared_store.get(KEY)
    assert stored is not None
    assert stored.revision == 2


async def test_a_read_sees_the_write_that_just_committed(prepared_store: RevisionStore) -> None:
    """The reader is not behind: a mutation's new revision is what the next `get()` reads."""
    written = await prepared_store.mutate(
        KEY, expected_revision=2, op=Op.STAGE, state=node_state(), request_digest="b" * 64
    )
    stored = await prepared_store.get(KEY)
    assert stored is not None
    assert (stored.revision, stored.status) == (written.revision, written.status) == (3, "staging")


async def test_a_read_after_close_is_a_store_error(prepared_store: RevisionStore) -> None:
    """Closed is closed for the reader too."""
    await prepared_store.aclose()
    with pytest.raises(StoreError, match="closed"):
        await prepared_store.get(KEY)
