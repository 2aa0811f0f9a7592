"""ledger.py: which chunk PUT Corestore counts, replays or refuses (pure)."""

from __future__ import annotations

import pytest

from devstack.corestore.ledger import Chunk, ChunkVerdict, judge_chunk, verified_bytes

A = Chunk(0, 4, "a" * 64)
B = Chunk(4, 4, "b" * 64)


def test_a_chunk_at_the_verified_end_is_appended() -> None:
    """The chunk that starts where the verified bytes end is written and counted."""
    assert judge_chunk([A], 10, False, B) is ChunkVerdict.APPEND


def test_the_first_chunk_starts_at_zero() -> None:
    """An empty object accepts a chunk at offset 0 and refuses one further on."""
    assert judge_chunk([], 10, False, A) is ChunkVerdict.APPEND
    assert judge_chunk([], 10, False, B) is ChunkVerdict.GAP


def test_resending_a_counted_chunk_is_a_replay() -> None:
    """The same offset, length and digest again changes nothing: the PUT is idempotent."""
    assert judge_chunk([A, B], 10, False, A) is ChunkVerdict.REPLAY


def test_a_replay_is_answered_even_after_commit() -> None:
    """A lost answer to the last chunk can be resent after the object was committed."""
    assert judge_chunk([A, B], 8, True, B) is ChunkVerdict.REPLAY


def test_new_bytes_for_a_committed_object_are_refused() -> None:
    """A committed object takes no new chunk."""
    assert judge_chunk([A], 4, True, B) is ChunkVerdict.COMMITTED


@pytest.mark.parametrize(
    "chunk",
    [Chunk(0, 4, "c" * 64), Chunk(2, 4, "a" * 64), Chunk(0, 2, "a" * 64)],
    ids=["same-range-other-bytes", "shifted", "shorter"],
)
def test_overlapping_counted_bytes_differently_is_refused(chunk: Chunk) -> None:
    """Anything overlapping the verified prefix that is not exactly a counted chunk."""
    assert judge_chunk([A, B], 10, False, chunk) is ChunkVerdict.OVERLAP


def test_a_chunk_past_the_manifest_size_is_refused() -> None:
    """A chunk may not end past the object's size."""
    assert judge_chunk([A], 6, False, B) is ChunkVerdict.BEYOND_END


def test_verified_bytes_is_the_end_of_the_last_counted_chunk() -> None:
    """Where an interrupted stage resumes."""
    assert (verified_bytes([]), verified_bytes([A]), verified_bytes([A, B])) == (0, 4, 8)
