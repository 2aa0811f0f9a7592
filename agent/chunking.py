"""Bytes the agent moves: the one re-chunker and the one hashing policy, for every transfer.

- `rechunk(source, chunk_size, ...)`: the pieces of a byte stream re-cut into chunks, first of
  the lengths in `boundaries` (the chunks Corestore already verified), then of `chunk_size`;
  the last one may be shorter. Each chunk costs at most one copy: its pieces (or the parts of
  them it needs) are joined once, and a piece that is exactly one chunk is passed on as it is.
  Only the chunk being filled is held. With a `limit`, no chunk reaching past it is handed out:
  the one that would raises instead (so at most one chunk's bytes are read past the limit).
- `Digests`: the sha256 of all the bytes that passed and of each chunk. A chunk of
  `THREAD_HASH_MIN` bytes or more is hashed in a worker thread (`asyncio.to_thread`; hashlib
  drops the GIL), so the event loop keeps serving the websocket while megabytes are hashed;
  a smaller one costs less to hash than to hand over.

Staging (Cloudly -> Corestore, `agent.restore.staging`) and both closure directions
(`agent.relay.closures`) use them.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterable, Callable, Sequence
from typing import Final

__all__ = ["THREAD_HASH_MIN", "Digests", "rechunk"]

THREAD_HASH_MIN: Final = 256 * 1024
"""Below this many bytes a worker thread costs more than hashing on the event loop."""


async def rechunk(
    source: AsyncIterable[bytes],
    chunk_size: int,
    *,
    boundaries: Sequence[int] = (),
    limit: int | None = None,
    too_long: Callable[[], Exception] | None = None,
) -> AsyncGenerator[bytes, None]:
    """The bytes of `source` cut into chunks: first of the lengths in `boundaries`, then of
    `chunk_size`; the last chunk may be shorter.

    The chunk that would carry the stream past `limit` bytes is not handed out: `too_long()` is
    raised instead (a `ValueError` without one); the chunks before it were all within the limit.
    """
    if chunk_size < 1 or any(length < 1 for length in boundaries):
        raise ValueError("chunk lengths must be positive")
    plan = deque(boundaries)
    target = plan.popleft() if plan else chunk_size
    pending: list[bytes | memoryview] = []
    pending_size = 0
    allowed = limit  # bytes the chunks still to come may carry (None: any number)

    def check(length: int) -> None:
        nonlocal allowed
        if allowed is None:
            return
        if length > allowed:
            raise too_long() if too_long is not None else ValueError("the stream is too long")
        allowed -= length

    async for piece in source:
        if not pending and len(piece) == target and type(piece) is bytes:
            check(target)
            yield piece  # exactly one chunk: no copy at all
            target = plan.popleft() if plan else chunk_size
            continue
        rest = memoryview(piece)
        while pending_size + len(rest) >= target:
            take = target - pending_size
            check(target)
            pending.append(rest[:take])
            rest = rest[take:]
            chunk = b"".join(pending)  # the one copy of these bytes
            pending.clear()
            pending_size = 0
            yield chunk
            target = plan.popleft() if plan else chunk_size
        if rest:
            pending.append(rest)
            pending_size += len(rest)
    if pending:
        check(pending_size)
        yield b"".join(pending)


class Digests:
    """The sha256 of every byte that passed (`hexdigest()`) and of each chunk (`chunk()`)."""

    def __init__(self) -> None:
        self._whole = hashlib.sha256()
        self.size = 0
        """Bytes that passed so far."""

    async def chunk(self, data: bytes) -> str:
        """Add `data` to the whole; the hex sha256 of `data` itself."""
        self.size += len(data)
        if len(data) >= THREAD_HASH_MIN:
            return await asyncio.to_thread(self._chunk, data)
        return self._chunk(data)

    async def add(self, data: bytes) -> None:
        """Add `data` to the whole (no digest of its own)."""
        self.size += len(data)
        if len(data) >= THREAD_HASH_MIN:
            await asyncio.to_thread(self._whole.update, data)
        else:
            self._whole.update(data)

    def hexdigest(self) -> str:
        """The hex sha256 of every byte added so far."""
        return self._whole.hexdigest()

    def _chunk(self, data: bytes) -> str:
        self._whole.update(data)
        return hashlib.sha256(data).hexdigest()
