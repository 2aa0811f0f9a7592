"""The chunk rules of a staging object: which chunk PUT Corestore counts, replays or refuses.

Pure. The reference Corestore's (the staging archive and the closure imports); the agent only
meets their verdicts, so the rules live with the stand-in. An object is written as a contiguous
prefix of verified chunks: a chunk is counted only if it starts exactly where the verified bytes
end (`APPEND`). Re-sending a chunk that was already counted, byte for byte (same offset, length
and sha256), is an idempotent replay; any other overlap, a gap, a chunk running past the
manifest size, or a new chunk for a committed object is refused. So `verified_bytes` is always
the offset an interrupted stage resumes from. docs/corestore-api.md states them as the contract.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Chunk", "ChunkVerdict", "judge_chunk", "verified_bytes"]


@dataclass(frozen=True, slots=True)
class Chunk:
    """One chunk: where it starts, how long it is, its sha256."""

    offset: int
    length: int
    sha256: str

    @property
    def end(self) -> int:
        """The offset just past this chunk."""
        return self.offset + self.length


class ChunkVerdict(enum.Enum):
    """What Corestore does with a chunk whose digest it verified."""

    APPEND = "append"  # extends the verified prefix: write it, count it
    REPLAY = "replay"  # exactly a counted chunk: answer as before, write nothing
    GAP = "offset-gap"  # starts past the verified prefix
    OVERLAP = "offset-overlap"  # overlaps counted bytes without being a counted chunk
    BEYOND_END = "chunk-beyond-object"  # ends past the manifest size
    COMMITTED = "object-committed"  # the object is committed: only replays are answered


def verified_bytes(counted: Sequence[Chunk]) -> int:
    """The length of the verified prefix (counted chunks are contiguous from offset 0)."""
    return counted[-1].end if counted else 0


def judge_chunk(counted: Sequence[Chunk], size: int, committed: bool, chunk: Chunk) -> ChunkVerdict:
    """The verdict on `chunk` for an object of `size` bytes whose counted chunks are `counted`."""
    if chunk in counted:
        return ChunkVerdict.REPLAY
    if committed:
        return ChunkVerdict.COMMITTED
    if chunk.end > size:
        return ChunkVerdict.BEYOND_END
    end = verified_bytes(counted)
    if chunk.offset == end:
        return ChunkVerdict.APPEND
    return ChunkVerdict.GAP if chunk.offset > end else ChunkVerdict.OVERLAP
