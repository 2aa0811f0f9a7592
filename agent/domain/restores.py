"""An isolated restore's durable facts as values: its key, its plan and its stored state (pure).

- `RestoreKey`: the exact cluster/node/restore routing key one node state lives under.
- `PreparedPlan`: what the prepare request fixed for the rest of the restore and the engine keeps
  next to the state (never sent): the resource mappings (execute, cleanup) and the archive
  manifest (stage). Cloudly does not resend them. `plan_of()` takes it from the request.
- `StoredState`: one node state as the store holds it (the frozen contract model and the digest
  of the request that last moved it). Its plan is not part of it: it never changes after
  prepare, and the store keeps it apart (`RevisionStore.plan`, `resource_mappings`, and keyed
  lookups of its manifest), so a request reads only what it needs.

The engine builds these, the store persists and returns them; only the store's codec turns them
into JSON and back.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.contracts.backup import BackupArchiveManifest
from agent.contracts.base import WireModel
from agent.contracts.isolatedrestore import (
    IsolatedRestoreNodeState,
    NodeStatus,
    PrepareIsolatedRestoreRequest,
    ResourceMapping,
)
from agent.errors import InvalidState

__all__ = ["PreparedPlan", "RestoreKey", "StoredState", "plan_of"]


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
        """The key's fields by name (the store's SQL parameters `:cluster_id`, `:node_name`,
        `:restore_id`)."""
        return {
            "cluster_id": self.cluster_id,
            "node_name": self.node_name,
            "restore_id": self.restore_id,
        }


class PreparedPlan(WireModel):
    """The prepare request's resource mappings and archive manifest (stored as its wire JSON)."""

    resource_mappings: list[ResourceMapping]
    archive_manifest: BackupArchiveManifest


def plan_of(request: PrepareIsolatedRestoreRequest) -> PreparedPlan:
    """What the engine keeps of a prepare request beyond the state (never the grant)."""
    return PreparedPlan(
        resource_mappings=list(request.resource_mappings),
        archive_manifest=request.archive_manifest,
    )


@dataclass(frozen=True, slots=True)
class StoredState:
    """One node state as persisted.

    `state` is the node state with the fields the store owns taken from the row: `restoreId`,
    `clusterId`, `targetNodeName`, `revision`, `status`, `updatedAt` (so `revision` and `status`
    here always equal the state's).
    """

    key: RestoreKey
    revision: int
    status: NodeStatus
    state: IsolatedRestoreNodeState
    mutation_digest: str | None
    """`request_digest()` of the last request that mutated this row (kept by progress writes)."""
    updated_at: int
    """Epoch milliseconds of the last mutation."""
