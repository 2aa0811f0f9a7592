"""The typed values the revision store takes and returns (plain frozen dataclasses).

A stored node state is the frozen contract model (`IsolatedRestoreNodeState`) and the engine's
`PreparedPlan` next to it; only the codec (`codec.py`) turns them into JSON and back.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.contracts.isolatedrestore import IsolatedRestoreNodeState
from agent.errors import InvalidState
from agent.restore.machine import NodeStatus
from agent.restore.state import PreparedPlan

__all__ = ["ChunkRecord", "ObjectRecord", "RestoreKey", "StatusSummary", "StoredState"]


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

    `state` is the node state with the fields the store owns taken from the row: `restoreId`,
    `clusterId`, `targetNodeName`, `revision`, `status`, `updatedAt` (so `revision` and `status`
    here always equal the state's). `plan` is the engine's own `PreparedPlan` (never sent).
    """

    key: RestoreKey
    revision: int
    status: NodeStatus
    state: IsolatedRestoreNodeState
    plan: PreparedPlan
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


@dataclass(frozen=True, slots=True)
class StatusSummary:
    """How many rows each status holds and when the least recently changed of them changed
    (epoch ms): node states by status, relay jobs by (kind, status). Statuses without rows
    are left out."""

    restores: dict[str, tuple[int, int]]
    jobs: dict[tuple[str, str], tuple[int, int]]
