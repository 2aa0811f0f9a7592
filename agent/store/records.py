"""The staging-progress records the revision store returns (plain frozen dataclasses).

The node state's own values (`RestoreKey`, `PreparedPlan`, `StoredState`) and the relay job's
(`JobKey`, `StoredJob`) are the domain's (`agent.domain`): the engines build them, the store
persists them. Only the codec (`codec.py`) turns them into JSON and back.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ChunkRecord", "ManifestEntry", "ObjectRecord", "StatusSummary"]


@dataclass(frozen=True, slots=True)
class ChunkRecord:
    """One chunk of a staged object that Corestore accepted at `offset`."""

    object_path: str
    offset: int
    length: int
    sha256: str


@dataclass(frozen=True, slots=True)
class ObjectRecord:
    """A staged object proven complete (its size and sha256 matched the manifest entry)."""

    object_path: str
    size: int
    sha256: str
    written_at: int
    """Epoch milliseconds."""


@dataclass(frozen=True, slots=True)
class ManifestEntry:
    """One object of a restore's manifest, found by its path, and whether it is written."""

    size: int
    sha256: str
    written: bool
    """Marked written (`mark_object_written`): its bytes are proven and committed."""


@dataclass(frozen=True, slots=True)
class StatusSummary:
    """How many rows each status holds and when the least recently changed of them changed
    (epoch ms): node states by status, relay jobs by (kind, status). Statuses without rows
    are left out. And how large the database is."""

    restores: dict[str, tuple[int, int]]
    jobs: dict[tuple[str, str], tuple[int, int]]
    database_bytes: int = 0
    """The database file and its WAL on disk, in bytes."""
