"""The typed values the revision store takes and returns (plain frozen dataclasses)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent.errors import InvalidState
from agent.restore.machine import NodeStatus

__all__ = ["ChunkRecord", "ObjectRecord", "RestoreKey", "StoredState"]


@dataclass(frozen=True, slots=True)
class RestoreKey:
    """The exact cluster/node/restore routing key one node state lives under."""

    cluster_id: str
    node_name: str
    restore_id: str

    def __post_init__(self) -> None:
        for name in ("cluster_id", "node_name", "restore_id"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise InvalidState(f"RestoreKey.{name} must be a non-empty string")

    def as_params(self) -> dict[str, str]:
        """The key as named SQL parameters (`:cluster_id`, `:node_name`, `:restore_id`)."""
        return {
            "cluster_id": self.cluster_id,
            "node_name": self.node_name,
            "restore_id": self.restore_id,
        }


@dataclass(frozen=True, slots=True)
class StoredState:
    """One node state as persisted.

    `state` is the wire form (`IIsolatedRestoreNodeState`, camelCase) with the fields the store
    owns filled in from the row: `restoreId`, `clusterId`, `targetNodeName`, `revision`,
    `status`, `updatedAt`. `private` holds the engine's own fields (never sent). Both are fresh
    dicts on every read, so mutating them changes nothing stored.
    """

    key: RestoreKey
    revision: int
    status: NodeStatus
    state: dict[str, Any]
    private: dict[str, Any]
    mutation_digest: str | None
    """`request_digest()` of the last request that mutated this row (kept by progress writes)."""
    updated_at: int
    """Epoch milliseconds of the last mutation."""


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
