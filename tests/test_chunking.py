"""The one re-chunker and hashing policy: chunk lengths, one copy per chunk, the limit, and
large chunks hashed off the event loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import tracemalloc
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

import pytest

from agent.transfers.budget import ByteBudget
from agent.transfers.chunking import THREAD_HASH_MIN, ChunkBuffers, Digests, rechunk


class Pieces:
    """A byte source yielding `pieces` in order; `taken` counts the pieces handed out."""

    def __init__(self, pieces: Iterable[bytes]) -> None:
        self.pieces = list(pieces)
        self.taken = 0

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._each()

    async def _each(self) -> AsyncIterator[bytes]:
        for piece in self.pieces:
            self.taken += 1
            yield piece


async def _all(chunks: Any) -> list[bytes]:
    return [chunk async for chunk in chunks]


async def test_rechunk_follows_recorded_boundaries_then_the_chunk_size() -> None:
    """Pieces are re-cut to the given lengths first, then to chunk_size; the tail is short."""
    source = Pieces([b"abc", b"defgh", b"ij", b"klmnopq"])
    chunks = await _all(rechunk(source, 4, boundaries=[2, 5]))
    assert chunks == [b"ab", b"cdefg", b"hijk", b"lmno", b"pq"]


async def test_a_piece_that_is_exactly_one_chunk_is_passed_on_uncopied() -> None:
    """A piece of the chunk's length, with nothing pending, is the chunk itself."""
    first, second = b"x" * 4, b"y" * 4
    chunks = await _all(rechunk(Pieces([first, second]), 4))
    assert chunks[0] is first
    assert chunks[1] is second


async def test_chunks_joined_from_many_pieces_hold_exactly_their_bytes() -> None:
    """Every length of piece, cut to every chunk size: the chunks are the stream, in order,
    each `chunk_size` long but the last."""
    data = bytes(range(256)) * 3
    for piece in (1, 7, 64, 100, 768):
        for size in (1, 5, 64, 300, 1000):
            source = Pieces(data[i : i + piece] for i in range(0, len(data), piece))
            chunks = await _all(rechunk(source, size))
            assert b"".join(chunks) == data
            assert all(len(chunk) == size for chunk in chunks[:-1])
            assert 0 < len(chunks[-1]) <= size


async def test_no_chunk_past_the_limit_is_handed_out() -> None:
    """The chunks within `limit` pass; the one that would carry the stream past it raises
    `too_long()` instead, whether it is a full chunk or the tail."""

    class TooLong(Exception):
        pass

    full = rechunk(Pieces([b"aaaa", b"bb", b"cc", b"dd"]), 4, limit=7, too_long=TooLong)
    assert await anext(full) == b"aaaa"
    with pytest.raises(TooLong):
        await anext(full)
    tail = rechunk(Pieces([b"aaaa", b"bbbb"]), 3, limit=7, too_long=TooLong)
    assert [await anext(tail), await anext(tail)] == [b"aaa", b"abb"]
    with pytest.raises(TooLong):
        await anext(tail)
    exact = rechunk(Pieces([b"aaaa", b"bbb"]), 4, limit=7, too_long=TooLong)
    assert await _all(exact) == [b"aaaa", b"bbb"]


@pytest.mark.parametrize("lengths", [[0], [3, 0]])
async def test_a_chunk_length_that_is_not_positive_is_refused(lengths: list[int]) -> None:
    """A zero chunk size or boundary is a bug, refused before a byte is read."""
    chunk_size, *boundaries = lengths
    with pytest.raises(ValueError, match="positive"):
        await _all(rechunk(Pieces([b"abc"]), chunk_size or 4, boundaries=boundaries or [0]))


async def test_digests_are_the_sha256_of_each_chunk_and_of_the_whole() -> None:
    """`chunk()` answers the chunk's own digest; `hexdigest()` is of everything added."""
    digests = Digests()
    parts = [b"first", b"x" * THREAD_HASH_MIN, b"last"]
    answered = [await digests.chunk(part) for part in parts[:2]]
    await digests.add(parts[2])
    assert answered == [hashlib.sha256(part).hexdigest() for part in parts[:2]]
    assert digests.hexdigest() == hashlib.sha256(b"".join(parts)).hexdigest()
    assert digests.size == sum(map(len, parts))


class _CountingExecutor(concurrent.futures.ThreadPoolExecutor):
    """The loop's default executor, counting what it is handed."""

    handed = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        type(self).handed += 1
        return super().submit(fn, *args, **kwargs)


async def test_only_large_pieces_are_hashed_in_a_worker_thread() -> None:
    """From `THREAD_HASH_MIN` bytes on, hashing (a chunk's or the whole's) leaves the event
    loop; below it, it stays."""
    executor = _CountingExecutor(max_workers=1)
    asyncio.get_running_loop().set_default_executor(executor)
    try:
        digests = Digests()
        await digests.chunk(b"s" * (THREAD_HASH_MIN - 1))
        await digests.add(b"s" * (THREAD_HASH_MIN - 1))
        assert _CountingExecutor.handed == 0
        await digests.chunk(b"l" * THREAD_HASH_MIN)
        await digests.add(b"l" * THREAD_HASH_MIN)
        assert _CountingExecutor.handed == 2
    finally:
        executor.shutdown(wait=True)


# --- chunks in buffers drawn from the byte budget ------------------------------------------


async def test_chunks_in_buffers_hold_exactly_the_streams_bytes() -> None:
    """With buffers every chunk is a view of one (copied into as pieces came), the stream in
    order, also across recorded boundaries, one longer than a buffer included (joined)."""
    data = bytes(range(256)) * 5
    for piece in (1, 7, 100, 1280):
        buffers = ChunkBuffers(64, most=100)
        source = Pieces(data[i : i + piece] for i in range(0, len(data), piece))
        chunks = [
            bytes(chunk)
            async for chunk in rechunk(source, 64, boundaries=[10, 200], buffers=buffers)
        ]
        assert b"".join(chunks) == data
        assert [len(c) for c in chunks[:3]] == [10, 200, 64]


async def test_a_piece_is_copied_into_its_buffer_without_a_temporary_copy() -> None:
    """Each byte is copied once, straight into the buffer: filling a buffer from a 1 MiB piece
    allocates nothing near the piece's size (a bytearray's own slice assignment would first
    copy the piece into a temporary bytearray)."""
    piece = bytes(range(256)) * 4096  # 1 MiB
    buffers = ChunkBuffers(4 * len(piece), most=1)
    chunks = rechunk(Pieces([piece] * 4), 4 * len(piece), buffers=buffers)
    await buffers.prime()  # the buffer itself is made before tracing
    tracemalloc.start()
    try:
        chunk = await anext(chunks)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert bytes(chunk) == piece * 4
    assert peak < len(piece) // 4


async def test_a_reader_waits_for_a_buffer_to_come_back_instead_of_failing() -> None:
    """With every buffer out (the budget holds no more), the next chunk waits until Corestore
    took one and it is put back; the budget never holds more than its limit."""
    budget = ByteBudget(3 * 64, reserve=0)
    holding = budget.holding()
    buffers = ChunkBuffers(64, most=10, draws=holding)
    chunks = rechunk(Pieces([bytes([n]) * 64 for n in range(5)]), 64, buffers=buffers)
    out = [await anext(chunks) for _ in range(3)]
    assert (buffers.made, budget.held) == (3, 3 * 64)
    fourth = asyncio.create_task(anext(chunks))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not fourth.done()  # waiting, not failed
    buffers.put_back(out.pop(0))
    assert bytes(await fourth) == bytes([3]) * 64
    assert budget.held == 3 * 64
    holding.close()
    assert budget.held == 0


async def test_the_first_buffer_is_drawn_in_turn_before_the_stream_is_read() -> None:
    """`prime()` waits in the budget's queue while another transfer holds it all."""
    budget = ByteBudget(128, reserve=0)
    other = budget.holding()
    await other.take(128)
    buffers = ChunkBuffers(64, most=2, draws=budget.holding())
    primed = asyncio.create_task(buffers.prime())
    for _ in range(20):
        await asyncio.sleep(0)
    assert not primed.done()
    other.give(64)
    await primed
    assert (buffers.made, budget.held) == (1, 128)


async def test_a_whole_prime_draws_every_buffer_in_one_turn() -> None:
    """`prime(whole=True)` waits until the budget has all `most` buffers at once, then holds
    them: a transfer moves at its full depth or holds nothing."""
    budget = ByteBudget(256, reserve=0)
    other = budget.holding()
    await other.take(256)
    buffers = ChunkBuffers(64, most=3, draws=budget.holding())
    primed = asyncio.create_task(buffers.prime(whole=True))
    other.give(128)
    for _ in range(20):
        await asyncio.sleep(0)
    assert (primed.done(), budget.held) == (False, 128)
    other.give(64)
    await primed
    assert (buffers.made, budget.held) == (3, 256)


async def test_a_whole_prime_draws_no_more_than_the_budget_can_give_one_draw() -> None:
    """Beyond what the budget has outside its reserve, a whole prime takes what fits."""
    budget = ByteBudget(256, reserve=64)
    buffers = ChunkBuffers(64, most=10, draws=budget.holding())
    await buffers.prime(whole=True)
    assert (buffers.made, budget.held) == (3, 192)
