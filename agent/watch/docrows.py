"""The status document's rows: a restore's, a relay job's, and the transfers they wait for or
move in (pure; `agent.watch.document` holds the rest and says how each part is read).

    RestoreRow      one node state: key, status, revision, age, Progress, its last error
    JobRow          one relay job: key, run, status, revision, attempts, age, what it ended with
    TransferDoc     a row's transfer while it moves or waits: kind, state, place, seconds
    TransfersDoc    `/v1/transfers`: the limits, NodeCounts per node, every TransferListing

A row is served with its `transfer` once matched with the node's transfers (null when nothing
moves or waits); a row made alone has no `transfer` key (`UNMATCHED`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final, Self

from agent.watch.docfields import Fields, Wire

__all__ = [
    "UNMATCHED",
    "JobRow",
    "NodeCounts",
    "ObjectsProgress",
    "Progress",
    "RestoreRow",
    "TransferDoc",
    "TransferListing",
    "TransfersDoc",
    "Unmatched",
]


class Unmatched(enum.Enum):
    """The `transfer` of a row not matched with the node's transfers: no key on the wire."""

    UNMATCHED = "unmatched"


UNMATCHED: Final = Unmatched.UNMATCHED


@dataclass(frozen=True, slots=True)
class TransferDoc:
    """One transfer of a row: `position` in its node's queue (1 next; None while it moves),
    `seconds` since it asked, or since it moves."""

    kind: str | None
    state: str | None
    position: int | None
    seconds: int | None

    def to_wire(self) -> Wire:
        return {
            "kind": self.kind,
            "state": self.state,
            "position": self.position,
            "seconds": self.seconds,
        }

    @classmethod
    def from_wire(cls, data: Fields) -> Self:
        return cls(
            kind=data.text("kind"),
            state=data.text("state"),
            position=data.whole("position"),
            seconds=data.whole("seconds"),
        )

    @property
    def queued(self) -> bool:
        """Whether it waits for one of its node's places."""
        return self.state == "queued"


def _transfer_to_wire(row: Wire, transfer: TransferDoc | Unmatched | None) -> Wire:
    if transfer is not UNMATCHED:
        row["transfer"] = None if transfer is None else transfer.to_wire()
    return row


def _transfer_from_wire(data: Fields) -> TransferDoc | Unmatched | None:
    if not data.has("transfer"):
        return UNMATCHED
    found = data.record("transfer")
    return None if found is None else TransferDoc.from_wire(found)


@dataclass(frozen=True, slots=True)
class ObjectsProgress:
    """Manifest objects written of all (while bytes are staged)."""

    done: int | None
    total: int | None

    def to_wire(self) -> Wire:
        return {"done": self.done, "total": self.total}

    @classmethod
    def from_wire(cls, data: Fields) -> Self:
        return cls(done=data.whole("done"), total=data.whole("total"))


@dataclass(frozen=True, slots=True)
class Progress:
    """`done` of `total` in `unit` (`bytes` or `resources`); `objects` only with bytes."""

    done: int | None
    total: int | None
    unit: str | None
    objects: ObjectsProgress | None = None

    def to_wire(self) -> Wire:
        wire: Wire = {"done": self.done, "total": self.total, "unit": self.unit}
        if self.objects is not None:
            wire["objects"] = self.objects.to_wire()
        return wire

    @classmethod
    def from_wire(cls, data: Fields) -> Self:
        objects = data.record("objects")
        return cls(
            done=data.whole("done"),
            total=data.whole("total"),
            unit=data.text("unit"),
            objects=None if objects is None else ObjectsProgress.from_wire(objects),
        )


@dataclass(frozen=True, slots=True)
class RestoreRow:
    """One node state as the operator sees it: no grant (none is stored), no plan detail."""

    cluster_id: str | None
    node_id: str | None
    """IClusterNode.id: the restore key's targetNodeName and the relay methods' nodeId."""
    restore_id: str | None
    status: str | None
    revision: int | None
    updated_at: int | None
    age_seconds: int | None
    progress: Progress | None
    last_error_code: str | None
    last_error_message: str | None
    transfer: TransferDoc | Unmatched | None = UNMATCHED

    def to_wire(self) -> Wire:
        return _transfer_to_wire(
            {
                "clusterId": self.cluster_id,
                "nodeId": self.node_id,
                "restoreId": self.restore_id,
                "status": self.status,
                "revision": self.revision,
                "updatedAt": self.updated_at,
                "ageSeconds": self.age_seconds,
                "progress": None if self.progress is None else self.progress.to_wire(),
                "lastErrorCode": self.last_error_code,
                "lastErrorMessage": self.last_error_message,
            },
            self.transfer,
        )

    @classmethod
    def from_wire(cls, data: Fields) -> Self:
        progress = data.record("progress")
        return cls(
            cluster_id=data.text("clusterId"),
            node_id=data.text("nodeId"),
            restore_id=data.text("restoreId"),
            status=data.text("status"),
            revision=data.whole("revision"),
            updated_at=data.whole("updatedAt"),
            age_seconds=data.whole("ageSeconds"),
            progress=None if progress is None else Progress.from_wire(progress),
            last_error_code=data.text("lastErrorCode"),
            last_error_message=data.text("lastErrorMessage"),
            transfer=_transfer_from_wire(data),
        )


@dataclass(frozen=True, slots=True)
class JobRow:
    """One relay job as the operator sees it: a finished restore's types and whether it was
    partial, a failed job's error; never the service document."""

    cluster_id: str | None
    node_id: str | None
    kind: str | None
    backup_id: str | None
    service_id: str | None
    run: int | None
    status: str | None
    revision: int | None
    attempts: int | None
    updated_at: int | None
    age_seconds: int | None
    resource_types: tuple[str, ...] | None
    partial: bool | None
    error_code: str | None
    error_message: str | None
    delivered: bool | None
    transfer: TransferDoc | Unmatched | None = UNMATCHED

    def to_wire(self) -> Wire:
        types = self.resource_types
        return _transfer_to_wire(
            {
                "clusterId": self.cluster_id,
                "nodeId": self.node_id,
                "kind": self.kind,
                "backupId": self.backup_id,
                "serviceId": self.service_id,
                "run": self.run,
                "status": self.status,
                "revision": self.revision,
                "attempts": self.attempts,
                "updatedAt": self.updated_at,
                "ageSeconds": self.age_seconds,
                "resourceTypes": None if types is None else list(types),
                "partial": self.partial,
                "errorCode": self.error_code,
                "errorMessage": self.error_message,
                "delivered": self.delivered,
            },
            self.transfer,
        )

    @classmethod
    def from_wire(cls, data: Fields) -> Self:
        return cls(
            cluster_id=data.text("clusterId"),
            node_id=data.text("nodeId"),
            kind=data.text("kind"),
            backup_id=data.text("backupId"),
            service_id=data.text("serviceId"),
            run=data.whole("run"),
            status=data.text("status"),
            revision=data.whole("revision"),
            attempts=data.whole("attempts"),
            updated_at=data.whole("updatedAt"),
            age_seconds=data.whole("ageSeconds"),
            resource_types=data.texts("resourceTypes"),
            partial=data.flag("partial"),
            error_code=data.text("errorCode"),
            error_message=data.text("errorMessage"),
            delivered=data.flag("delivered"),
            transfer=_transfer_from_wire(data),
        )


@dataclass(frozen=True, slots=True)
class NodeCounts:
    """A node's transfers that move and that wait (a count missing reads as 0)."""

    moving: int
    queued: int

    def to_wire(self) -> Wire:
        return {"moving": self.moving, "queued": self.queued}

    @classmethod
    def from_wire(cls, data: Fields) -> Self:
        return cls(moving=data.whole("moving") or 0, queued=data.whole("queued") or 0)


@dataclass(frozen=True, slots=True)
class TransferListing:
    """One transfer of `/v1/transfers`: its node, what it moves for (the subject's parts but
    the first, space-separated) and the transfer itself."""

    node_id: str | None
    subject: str | None
    transfer: TransferDoc

    def to_wire(self) -> Wire:
        return {"nodeId": self.node_id, "for": self.subject, **self.transfer.to_wire()}

    @classmethod
    def from_wire(cls, data: Fields) -> Self:
        return cls(
            node_id=data.text("nodeId"),
            subject=data.text("for"),
            transfer=TransferDoc.from_wire(data),
        )


@dataclass(frozen=True, slots=True)
class TransfersDoc:
    """`/v1/transfers`: the per-node limits, each node's counts, every transfer (per node: the
    moving ones, then its queue in order)."""

    max_transfers_per_node: int | None
    max_bytes_per_second_per_node: float | None
    nodes: dict[str, NodeCounts]
    transfers: tuple[TransferListing, ...]

    def to_wire(self) -> Wire:
        return {
            "maxTransfersPerNode": self.max_transfers_per_node,
            "maxBytesPerSecondPerNode": self.max_bytes_per_second_per_node,
            "nodes": {node: counts.to_wire() for node, counts in self.nodes.items()},
            "transfers": [listing.to_wire() for listing in self.transfers],
        }

    @classmethod
    def from_wire(cls, data: Fields) -> Self:
        nodes = data.record("nodes") or Fields(None)
        return cls(
            max_transfers_per_node=data.whole("maxTransfersPerNode"),
            max_bytes_per_second_per_node=data.number("maxBytesPerSecondPerNode"),
            nodes={
                node: NodeCounts.from_wire(counts)
                for node, value in nodes.entries()
                if (counts := Fields.of(value)) is not None
            },
            transfers=tuple(TransferListing.from_wire(t) for t in data.records("transfers")),
        )
