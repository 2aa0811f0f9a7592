"""What a relay request acts on, decided before anything moves (pure).

- `locate_node()`: the session's cluster and the node's validated Corestore endpoint, or the
  routing refusal the isolated restore uses (`unknown-node`, `node-without-corestore`; no
  `misrouted-cluster`: these requests carry no clusterId, the session proves the cluster).
- `plan_restore()`: which snapshots a `restoreClusterService` restores, in which order, and
  whether it is a partial restore (seed 002), from the request and Corestore's record of the
  backup on that node.

The partial-restore rule: the node's record is the backup's record as far as the relay can see
it. A record naming `uncaptured` resources is a `failed` backup whose failure is `incomplete`
(seed 002); `read_partial_restore_resource_types` then says which types may be restored. Such a
restore must name them (`resourceTypes` is required, non-empty) and may name nothing else; a
snapshot standing for an uncaptured resource's type, or a `volume`, is never restored. Anything
else is refused (`partial-restore-refused`) before a byte moves. Every other backup restores as
asked.

Order: database, then object storage, then volume (the seed's "database before object storage",
extended), and within one type the request's order. Each request snapshot must be exactly one
of the record's snapshots (`invalid-request` naming `snapshots[i]` otherwise): the agent hands
Corestore the record's `snapshotId`, never an id it did not issue.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from agent.contracts.backup import BackupResourceType, read_partial_restore_resource_types
from agent.contracts.cluster import ClusterView
from agent.contracts.relay import RestoreClusterServiceRequest
from agent.corestore.service_models import ServiceBackupRecord, ServiceSnapshot
from agent.domain.outcomes import JobReport
from agent.errors import InvalidRequest, NodeWithoutCorestore, PartialRestoreRefused

__all__ = ["RESTORE_ORDER", "RestorePlan", "locate_node", "plan_restore", "record_subject"]

RESTORE_ORDER: Final[tuple[BackupResourceType, ...]] = ("database", "objectstorage", "volume")


def locate_node(view: ClusterView | None, node_id: str) -> tuple[str, str]:
    """`(cluster_id, corestore_endpoint)` of `node_id`, or the routing refusal.

    Raises `NodeWithoutCorestore` (also, retryable, while no cluster document is loaded) and
    `UnknownNode`.
    """
    if view is None:
        raise NodeWithoutCorestore(
            "the cluster document is not loaded yet; retry once the session has read it"
        )
    return view.cluster_id, view.corestore_endpoint(node_id)


def record_subject(record: ServiceBackupRecord) -> dict[str, Any]:
    """The node's record as the seed's partial-restore rule reads a backup record."""
    subject: dict[str, Any] = {
        "status": "failed" if record.uncaptured else "completed",
        "snapshots": [{"type": snapshot.type} for snapshot in record.snapshots],
    }
    if record.uncaptured:
        subject["failure"] = {
            "kind": "incomplete",
            "uncaptured": [resource.to_wire() for resource in record.uncaptured],
        }
    return subject


@dataclass(frozen=True, slots=True)
class RestorePlan:
    """The snapshots one restore restores, in order, as Corestore's record names them."""

    snapshots: tuple[ServiceSnapshot, ...]
    clear: bool
    partial: bool
    """A partial restore of an incomplete backup (seed 002)."""
    limited_to: tuple[BackupResourceType, ...] | None
    """`resourceTypes` of the request, in restore order; None: every snapshot's type."""

    @property
    def resource_types(self) -> tuple[BackupResourceType, ...]:
        """The types this restore restores, in restore order."""
        present = {snapshot.type for snapshot in self.snapshots}
        return tuple(t for t in RESTORE_ORDER if t in present)

    def report(self) -> JobReport:
        """What the agent records and logs about the restore (seed 002's restore event)."""
        return JobReport(resource_types=tuple(self.resource_types), partial=self.partial)


def plan_restore(request: RestoreClusterServiceRequest, record: ServiceBackupRecord) -> RestorePlan:
    """The restore `request` asks for, checked against the node's `record` of the backup.

    Raises `InvalidRequest` (a snapshot the record does not hold, or named twice) and
    `PartialRestoreRefused` (the partial-restore rule, see the module docstring).
    """
    by_wire = [(snapshot.to_wire(), snapshot) for snapshot in record.snapshots]
    chosen: list[tuple[int, ServiceSnapshot]] = []
    seen: set[str] = set()
    for index, requested in enumerate(request.snapshots):
        wire = requested.to_wire()
        match = next((known for known_wire, known in by_wire if known_wire == wire), None)
        if match is None:
            raise InvalidRequest(
                f"snapshots[{index}]: the backup's record on the node holds no such snapshot",
                field=f"snapshots[{index}]",
            )
        if match.snapshot_id in seen:
            raise InvalidRequest(
                f"snapshots[{index}]: the snapshot is named twice", field=f"snapshots[{index}]"
            )
        seen.add(match.snapshot_id)
        chosen.append((index, match))
    asked = request.resource_types
    allowed = read_partial_restore_resource_types(record_subject(record))
    partial = bool(record.uncaptured)
    if partial:
        _check_partial(asked, allowed)
    if asked is not None:
        chosen = [(index, snapshot) for index, snapshot in chosen if snapshot.type in asked]
    chosen.sort(key=lambda item: (RESTORE_ORDER.index(item[1].type), item[0]))
    limited = None if asked is None else tuple(t for t in RESTORE_ORDER if t in asked)
    return RestorePlan(
        snapshots=tuple(snapshot for _, snapshot in chosen),
        clear=bool(request.clear),
        partial=partial,
        limited_to=limited,
    )


def _check_partial(asked: list[BackupResourceType] | None, allowed: Sequence[str]) -> None:
    """The partial-restore rule for an incomplete backup whose restorable types are `allowed`."""
    if not asked:
        raise PartialRestoreRefused(
            "the backup is incomplete: a partial restore must name resourceTypes, "
            f"of {_names(allowed)}"
        )
    for resource_type in asked:
        if resource_type not in allowed:
            raise PartialRestoreRefused(
                f"the backup is incomplete and did not capture what a {resource_type} restore "
                f"needs: a partial restore may name only {_names(allowed)}",
                resourceType=resource_type,
            )


def _names(types: Sequence[str]) -> str:
    return ", ".join(types) if types else "no type"
