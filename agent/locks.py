"""`KeyedLocks`: one holder at a time per key, for keys that come and go.

The isolated-restore engine serialises the mutating requests of one restore, the relay the jobs
of one backup key. A lock exists only while someone holds or waits for it, so a long-running
agent keeps no lock per key it ever saw.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Hashable
from typing import Generic, TypeVar

__all__ = ["KeyedLocks"]

_K = TypeVar("_K", bound=Hashable)


class KeyedLocks(Generic[_K]):
    """An `asyncio.Lock` per key, dropped when its last user leaves."""

    def __init__(self) -> None:
        self._locks: dict[_K, tuple[asyncio.Lock, int]] = {}

    def __len__(self) -> int:
        return len(self._locks)

    @contextlib.asynccontextmanager
    async def hold(self, key: _K) -> AsyncIterator[None]:
        """Hold the lock of `key` for the block (waiting for the current holder first)."""
        lock, users = self._locks.get(key, (asyncio.Lock(), 0))
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users <= 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)
