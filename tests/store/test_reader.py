"""What `get()` answers: from memory what the store last wrote or read, else from the reader
connection, which waits for no write and sees every committed one."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import aiosqlite
import pytest

from agent.domain.restore_machine import Op
from agent.domain.restores import RestoreKey
from agent.errors import RevisionConflict, StoreError
from agent.store import RevisionStore, node_states
from tests.store.states import KEY, node_state, plan


class CountingReader:
    """The store's reader connection, counting its reads; with `hold` set, each read waits
    for `release` after it has read (and says so on `read`)."""

    def __init__(self, inner: aiosqlite.Connection, *, hold: bool = False) -> None:
        self.inner = inner
        self.reads = 0
        self.hold = hold
        self.read = asyncio.Event()
        self.release = asyncio.Event()

    async def execute_fetchall(self, sql: str, parameters: Any) -> Iterable[Any]:
        rows = await self.inner.execute_fetchall(sql, parameters)
        self.reads += 1
        if self.hold:
            self.read.set()
            await self.release.wait()
        return rows

    async def close(self) -> None:
        await self.inner.close()


def counting(store: RevisionStore, *, hold: bool = False) -> CountingReader:
    reader = CountingReader(store._database._reader, hold=hold)  # type: ignore[arg-type]
    store._database._reader = reader  # type: ignore[assignment]
    return reader


async def reopened(store: RevisionStore) -> RevisionStore:
    """A second store on the file of `store`, closed first (nothing kept in memory yet)."""
    await store.aclose()
    return await RevisionStore.open(store.path.parent)


async def test_a_read_is_answered_while_a_write_holds_the_connection(
    prepared_store: RevisionStore,
) -> None:
    """With the writer's connection taken (a long transaction, queued chunk records), `get()`
    still answers: a status never queues behind staging's writes."""
    async with prepared_store._database._lock:  # what every write holds while it runs
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


async def test_a_state_the_store_wrote_is_answered_without_reading_the_file(
    prepared_store: RevisionStore,
) -> None:
    """The row a mutation returned is what `get()` answers, with no read: a status call under
    sixteen stages waited 27 ms (p99) for the reader's thread and back."""
    reader = counting(prepared_store)
    written = await prepared_store.mutate(
        KEY, expected_revision=2, op=Op.STAGE, state=node_state(), request_digest="b" * 64
    )
    assert await prepared_store.get(KEY) == written
    assert reader.reads == 0


async def test_a_state_read_once_is_answered_from_memory_after(
    prepared_store: RevisionStore,
) -> None:
    """A store opened on an existing file reads a state once, then answers from memory."""
    store = await reopened(prepared_store)
    try:
        reader = counting(store)
        first = await store.get(KEY)
        assert (await store.get(KEY), reader.reads) == (first, 1)
        assert first is not None
        assert first.revision == 2
    finally:
        await store.aclose()


async def test_an_absent_state_is_read_again_each_time(store: RevisionStore) -> None:
    """None is never kept: the next `prepare` may create the row at any moment."""
    reader = counting(store)
    assert (await store.get(KEY), await store.get(KEY), reader.reads) == (None, None, 2)


async def test_a_read_that_overlapped_a_write_is_not_kept(prepared_store: RevisionStore) -> None:
    """A read of revision 2 that ends after a write of revision 3: the read answers what it
    read, and the next `get()` answers revision 3, not the overlapping read's row."""
    store = await reopened(prepared_store)
    try:
        reader = counting(store, hold=True)
        overlapping = asyncio.create_task(store.get(KEY))
        await reader.read.wait()
        written = await store.mutate(
            KEY, expected_revision=2, op=Op.STAGE, state=node_state(), request_digest="b" * 64
        )
        reader.release.set()
        old = await overlapping
        assert old is not None
        assert (old.revision, written.revision) == (2, 3)
        assert await store.get(KEY) == written
    finally:
        await store.aclose()


async def test_a_refused_write_keeps_nothing_and_the_next_read_goes_to_the_file(
    prepared_store: RevisionStore,
) -> None:
    """A conflict means the store's memory may be behind: the key is read from the file next."""
    reader = counting(prepared_store)
    with pytest.raises(RevisionConflict):
        await prepared_store.mutate(KEY, expected_revision=7, op=Op.STAGE, state=node_state())
    stored = await prepared_store.get(KEY)
    assert stored is not None
    assert (stored.revision, reader.reads) == (2, 1)


async def test_memory_holds_the_most_recently_used_states_only(
    store: RevisionStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past `CACHED_STATES` the least recently used state is read from the file again."""
    monkeypatch.setattr(node_states, "CACHED_STATES", 2)
    keys = [KEY, *(RestoreKey("cluster-1", "node-1", f"restore-{n}") for n in "bc")]
    for key in keys:
        await store.mutate(
            key, expected_revision=0, op=Op.PREPARE, state=node_state(key), plan=plan()
        )
    reader = counting(store)
    for key in reversed(keys):
        assert await store.get(key) is not None
    assert reader.reads == 1  # KEY, the first written, was let go


async def test_kept_answers_from_memory_only(prepared_store: RevisionStore) -> None:
    """`kept()` (a status answered without waiting): the state in memory, else None; nothing
    once the store is closed."""
    store = await reopened(prepared_store)
    try:
        assert store.kept(KEY) is None  # not read yet: `get()` reads it
        read = await store.get(KEY)
        assert store.kept(KEY) == read
    finally:
        await store.aclose()
    assert store.kept(KEY) is None
