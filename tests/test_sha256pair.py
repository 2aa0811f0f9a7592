"""Both digests of a chunk in one pass (`agent/_sha256pair.c`, through `chunking.Digests`):
exactly hashlib's answers, whatever the cuts."""

from __future__ import annotations

import hashlib
import importlib.util
import random
import shutil
import sysconfig
from pathlib import Path
from types import ModuleType

import pytest

from agent.transfers import chunking

pair: ModuleType | None
try:
    from agent import _sha256pair as pair
except ImportError:  # pragma: no cover - the build test says whether that may be
    pair = None

needs_sha_ni = pytest.mark.skipif(
    pair is None or not pair.available(), reason="not built, or this CPU has no SHA extensions"
)


def _pair() -> ModuleType:
    assert pair is not None  # the tests using it skip without it
    return pair


DATA = random.Random(7).randbytes(3 * 2**20 + 77)


def _cuts(seed: int) -> list[int]:
    """Piece ends over DATA: block-aligned ones (the pair's one pass), then any."""
    rng = random.Random(seed)
    aligned = sorted(64 * rng.randrange(0, 40_000) for _ in range(rng.randrange(0, 4)))
    anywhere = sorted(rng.randrange(aligned[-1] if aligned else 0, len(DATA)) for _ in range(3))
    return [*aligned, *anywhere, len(DATA)]


@needs_sha_ni
@pytest.mark.parametrize("seed", range(40))
def test_each_piece_and_the_whole_read_as_hashlib_reads_them(seed: int) -> None:
    """Every piece's own digest, and the running digest after every piece, equal hashlib's."""
    running, whole, start = _pair().Sha256Pair(), hashlib.sha256(), 0
    for end in _cuts(seed):
        piece = DATA[start:end]
        assert running.update_piece(piece) == hashlib.sha256(piece).digest()
        whole.update(piece)
        assert running.digest() == whole.digest()
        start = end


@needs_sha_ni
@pytest.mark.parametrize("length", [0, 1, 55, 56, 63, 64, 65, 119, 120, 128, 8191, 8192, 8193])
def test_the_padding_edges_read_as_hashlib_reads_them(length: int) -> None:
    """Lengths around the padding's 56-byte boundary and the GIL release threshold."""
    running = _pair().Sha256Pair()
    assert running.update_piece(DATA[:length]) == hashlib.sha256(DATA[:length]).digest()
    running.update(DATA[length : 2 * length])
    assert running.digest() == hashlib.sha256(DATA[: 2 * length]).digest()


@needs_sha_ni
def test_a_piece_after_an_unfinished_block_reads_as_hashlib_reads_it() -> None:
    """The whole holding part of a block (no shared pass possible): both answers still right."""
    running = _pair().Sha256Pair()
    running.update(DATA[:10])
    assert running.update_piece(DATA[10:200_010]) == hashlib.sha256(DATA[10:200_010]).digest()
    assert running.digest() == hashlib.sha256(DATA[:200_010]).digest()


@needs_sha_ni
def test_any_buffer_is_taken() -> None:
    """bytes, bytearray and memoryview slices (what staging hands over) give one answer."""
    expected = hashlib.sha256(DATA[64:4160]).digest()
    for piece in (DATA[64:4160], bytearray(DATA[64:4160]), memoryview(DATA)[64:4160]):
        assert _pair().Sha256Pair().update_piece(piece) == expected


@needs_sha_ni
async def test_digests_answer_the_same_with_and_without_the_pair() -> None:
    """`chunking.Digests`: the pair and hashlib twice give the same chunk and whole digests,
    small chunks on the loop and large ones in a thread alike."""
    answers = []
    for use_pair in (True, False):
        digests, start, chunks = chunking.Digests(pair=use_pair), 0, []
        for end in (100, 100 + chunking.THREAD_HASH_MIN, 2**20 + 64, len(DATA)):
            chunks.append(await digests.chunk(DATA[start:end]))
            start = end
        await digests.add(b"tail")
        answers.append((chunks, digests.hexdigest(), digests.size))
    assert answers[0] == answers[1]
    assert answers[0][1] == hashlib.sha256(DATA + b"tail").hexdigest()


def test_the_module_is_built_where_a_c_compiler_is() -> None:
    """CI has gcc and the Python headers: a broken build must not fall back to hashing twice
    unnoticed (every other test here would skip)."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler on this machine: hashlib twice is expected")
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").exists():
        pytest.skip("no Python headers on this machine: hashlib twice is expected")
    assert importlib.util.find_spec("agent._sha256pair") is not None


def test_the_backend_is_named_for_what_hashes() -> None:
    """The start-up line's `digests` says the pair exactly where it is built and the CPU runs
    it."""
    runs = pair is not None and pair.available()
    assert ("sha-ni-pair" if runs else "hashlib") == chunking.DIGESTS_BACKEND
