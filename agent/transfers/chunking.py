"""Bytes the agent moves: the one re-chunker and the one hashing policy, for every transfer.

- `rechunk(source, chunk_size, ...)`: the pieces of a byte stream re-cut into chunks, first of
  the lengths in `boundaries` (the chunks Corestore already verified), then of `chunk_size`;
  the last one may be shorter. Each chunk costs at most one copy: its pieces (or the parts of
  them it needs) are joined once, and a piece that is exactly one chunk is passed on as it is.
  Only the chunk being filled is held. With a `limit`, no chunk reaching past it is handed out:
  the one that would raises instead (so at most one chunk's bytes are read past the limit).
  With `buffers` (`ChunkBuffers`, drawn from the transfer's share of the byte budget) every
  piece is copied into a reused buffer at once and let go before the next is read, so what the
  transfer holds is exactly its buffers: a chunk comes out as a view of one, and goes back with
  `buffers.put_back(chunk)` once Corestore took it.
- `Digests`: the sha256 of all the bytes that passed and of each chunk. A chunk of
  `THREAD_HASH_MIN` bytes or more is hashed in a worker thread (`asyncio.to_thread`; hashlib
  drops the GIL), so the event loop keeps serving the websocket while megabytes are hashed;
  a smaller one costs less to hash than to hand over. Where the CPU has the SHA extensions the
  optional native `agent._sha256pair` computes both digests in one pass over a chunk (about
  0.7x the CPU of hashing it twice); elsewhere hashlib hashes it twice. `DIGESTS_BACKEND` says
  which (in the start-up line).

Staging (Cloudly -> Corestore, `agent.restore.staging`) and both closure directions
(`agent.relay.closures`) use them.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterable, Callable, Sequence
from typing import Final, Protocol

try:
    from agent._sha256pair import Sha256Pair, available as _pair_available
except ImportError:  # pragma: no cover - built wherever a C compiler was; tests assert it is
    _PAIR = False
else:
    _PAIR = _pair_available()

__all__ = ["DIGESTS_BACKEND", "THREAD_HASH_MIN", "ChunkBuffers", "Digests", "Draws", "rechunk"]

DIGESTS_BACKEND: Final = "sha-ni-pair" if _PAIR else "hashlib"
"""How `Digests` hashes: both digests in one pass (`sha-ni-pair`), or hashlib twice."""

Chunk = bytes | memoryview

THREAD_HASH_MIN: Final = 256 * 1024
"""Below this many bytes a worker thread costs more than hashing on the event loop."""


class Draws(Protocol):
    """What `ChunkBuffers` needs of a transfer's holding (`agent.transfers.budget.Holding`)."""

    async def take(self, size: int) -> None: ...

    def try_take(self, size: int) -> bool: ...

    def most_at_once(self, size: int) -> int: ...

    def give(self, size: int) -> None: ...


class ChunkBuffers:
    """The buffers one transfer assembles its chunks in, each `size` bytes, reused.

    `get()` hands out a free one; else draws a new one from `draws` when the budget has room
    (at once or not at all; at most `most` buffers); else waits for one to come back
    (`put_back`, after Corestore took its chunk). Only the first is waited for in the budget's
    queue: the transfer holds nothing yet. Without `draws` buffers are simply made."""

    def __init__(self, size: int, *, most: int, draws: Draws | None = None) -> None:
        if size < 1 or most < 1:
            raise ValueError("buffers need a positive size and count")
        self.size = size
        self._most = most
        self._draws = draws
        self._free: list[bytearray] = []
        self._made = 0
        self._back = asyncio.Event()

    @property
    def made(self) -> int:
        """Buffers drawn so far (each `size` bytes)."""
        return self._made

    async def get(self) -> bytearray:
        """A buffer to fill (its content is stale)."""
        while not self._free:
            if self._made == 0 and self._draws is not None:
                await self._draws.take(self.size)
                return self._make()
            if self._made < self._most and (self._draws is None or self._draws.try_take(self.size)):
                return self._make()
            self._back.clear()
            await self._back.wait()
        return self._free.pop()

    async def prime(self, *, whole: bool = False) -> None:
        """Draw the first buffer now, waiting in the budget's queue: before the stream is read,
        so a transfer that reads always holds a buffer to empty its stream into.

        `whole`: every buffer the transfer may use (`most`, or as many as the budget can ever
        give one draw), in one draw. A transfer then moves at its full depth from its first
        byte, or waits holding nothing: the transfers moving at once are of equal standing.
        Drawn one by one, the first ones to move held a single buffer each while others waited
        for their first (a further buffer does not pass a waiting draw), and moved at 7 MB/s
        where the ones after them moved at 18 to 37 (docs/benchmarks.md, "Cloudly keeps
        control")."""
        if not whole or self._draws is None or self._made or self._free:
            self._free.append(await self.get())
            return
        count = max(1, min(self._most, self._draws.most_at_once(self.size)))
        await self._draws.take(self.size * count)
        self._free.extend(self._make() for _ in range(count))

    def put_back(self, chunk: Chunk) -> None:
        """A chunk `rechunk` handed out is done with: its buffer is free again."""
        if isinstance(chunk, memoryview) and isinstance(chunk.obj, bytearray):
            self._free.append(chunk.obj)
            self._back.set()

    def close(self) -> None:
        """Let go of the free buffers now (an error's traceback may keep their owner alive
        until the cycle collector runs; the buffers need not wait for it)."""
        self._free.clear()

    def _make(self) -> bytearray:
        self._made += 1
        return bytearray(self.size)


async def rechunk(
    source: AsyncIterable[bytes],
    chunk_size: int,
    *,
    boundaries: Sequence[int] = (),
    limit: int | None = None,
    too_long: Callable[[], Exception] | None = None,
    buffers: ChunkBuffers | None = None,
) -> AsyncGenerator[Chunk, None]:
    """The bytes of `source` cut into chunks: first of the lengths in `boundaries`, then of
    `chunk_size`; the last chunk may be shorter.

    The chunk that would carry the stream past `limit` bytes is not handed out: `too_long()` is
    raised instead (a `ValueError` without one); the chunks before it were all within the limit.
    With `buffers`, a chunk no longer than their size is a view of one of them (copied into as
    the pieces came), to be put back.
    """
    if chunk_size < 1 or any(length < 1 for length in boundaries):
        raise ValueError("chunk lengths must be positive")
    if buffers is not None:
        async for chunk in _rechunk_into(source, chunk_size, boundaries, limit, too_long, buffers):
            yield chunk
        return
    plan = deque(boundaries)
    target = plan.popleft() if plan else chunk_size
    pending: list[bytes | memoryview] = []
    pending_size = 0
    check = _allowance(limit, too_long)

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


def _allowance(
    limit: int | None, too_long: Callable[[], Exception] | None
) -> Callable[[int], None]:
    """`check(length)` for each chunk about to be handed out: the chunks together may carry at
    most `limit` bytes (None: any number); the one that would go past it raises `too_long()`
    (a `ValueError` without one)."""
    allowed = limit

    def check(length: int) -> None:
        nonlocal allowed
        if allowed is None:
            return
        if length > allowed:
            raise too_long() if too_long is not None else ValueError("the stream is too long")
        allowed -= length

    return check


async def _rechunk_into(
    source: AsyncIterable[bytes],
    chunk_size: int,
    boundaries: Sequence[int],
    limit: int | None,
    too_long: Callable[[], Exception] | None,
    buffers: ChunkBuffers,
) -> AsyncGenerator[Chunk, None]:
    """`rechunk` copying every piece into a buffer at once (no piece outlives its turn)."""
    plan = deque(boundaries)
    check = _allowance(limit, too_long)

    def next_target() -> int:
        return plan.popleft() if plan else chunk_size

    target = next_target()
    buffer: bytearray | None = None
    joined: list[bytes] = []  # a target larger than a buffer (a resumed prefix): joined
    filled = 0
    async for piece in source:
        rest = memoryview(piece)
        while rest:
            if buffer is None and not joined and target <= buffers.size:
                buffer = await buffers.get()
            take = min(target - filled, len(rest))
            if buffer is not None:
                # Through a view: a bytearray's own slice assignment from a memoryview first
                # copies it into a temporary bytearray (CPython's bytearray_ass_subscript).
                memoryview(buffer)[filled : filled + take] = rest[:take]
            else:
                joined.append(bytes(rest[:take]))
            rest = rest[take:]
            filled += take
            if filled == target:
                check(target)
                if buffer is not None:
                    chunk: Chunk = memoryview(buffer)[:target]
                    buffer = None
                else:
                    chunk = b"".join(joined)
                    joined.clear()
                filled = 0
                target = next_target()
                yield chunk
        del piece, rest  # the piece is copied: let it go before the next is read
    if filled:
        check(filled)
        yield memoryview(buffer)[:filled] if buffer is not None else b"".join(joined)


class _Twice:
    """`Sha256Pair`'s interface by hashlib: each piece is hashed on its own and again as part of
    the whole (where the CPU has no SHA extensions)."""

    def __init__(self) -> None:
        self._whole = hashlib.sha256()

    def update(self, data: Chunk, /) -> None:
        self._whole.update(data)

    def update_piece(self, data: Chunk, /) -> bytes:
        self._whole.update(data)
        return hashlib.sha256(data).digest()

    def digest(self) -> bytes:
        return self._whole.digest()


class Digests:
    """The sha256 of every byte that passed (`hexdigest()`) and of each chunk (`chunk()`)."""

    def __init__(self, *, pair: bool = _PAIR) -> None:
        """`pair`: both digests in one pass (where the CPU can; tests compare both ways)."""
        self._both: Sha256Pair | _Twice = Sha256Pair() if pair else _Twice()
        self.size = 0
        """Bytes that passed so far."""

    async def chunk(self, data: Chunk) -> str:
        """Add `data` to the whole; the hex sha256 of `data` itself."""
        self.size += len(data)
        if len(data) >= THREAD_HASH_MIN:
            return (await asyncio.to_thread(self._both.update_piece, data)).hex()
        return self._both.update_piece(data).hex()

    async def add(self, data: Chunk) -> None:
        """Add `data` to the whole (no digest of its own)."""
        self.size += len(data)
        if len(data) >= THREAD_HASH_MIN:
            await asyncio.to_thread(self._both.update, data)
        else:
            self._both.update(data)

    def hexdigest(self) -> str:
        """The hex sha256 of every byte added so far."""
        return self._both.digest().hex()
