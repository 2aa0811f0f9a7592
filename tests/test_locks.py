"""Keyed locks: one holder per key, other keys free, nothing kept once unused."""

from __future__ import annotations

import asyncio

import pytest

from agent.locks import KeyedLocks


async def test_holders_of_one_key_take_turns() -> None:
    """A second holder of the same key waits until the first leaves."""
    locks: KeyedLocks[str] = KeyedLocks()
    order: list[str] = []
    release = asyncio.Event()

    async def first() -> None:
        async with locks.hold("k"):
            order.append("first in")
            await release.wait()
            order.append("first out")

    async def second() -> None:
        async with locks.hold("k"):
            order.append("second in")

    async with asyncio.TaskGroup() as group:
        group.create_task(first())
        await asyncio.sleep(0)  # let the first take the lock
        waiter = group.create_task(second())
        await asyncio.sleep(0)
        assert not waiter.done()
        release.set()
    assert order == ["first in", "first out", "second in"]


async def test_another_key_is_not_blocked() -> None:
    """Holding one key does not delay a holder of another."""
    locks: KeyedLocks[str] = KeyedLocks()
    async with locks.hold("a"), asyncio.timeout(1), locks.hold("b"):
        assert len(locks) == 2


async def test_a_lock_is_dropped_when_its_last_user_leaves() -> None:
    """No lock is kept for a key nobody holds or waits for, even after a failure inside."""
    locks: KeyedLocks[int] = KeyedLocks()
    for key in range(100):
        async with locks.hold(key):
            pass
    with pytest.raises(RuntimeError):
        async with locks.hold(7):
            raise RuntimeError("inside")
    assert len(locks) == 0
