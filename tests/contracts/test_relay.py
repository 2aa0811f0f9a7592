"""Specification of `agent.contracts.relay`: node-routed backup/restore/prune, database closures."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st
from pydantic import ValidationError

from agent.contracts.base import WireModel, first_problem
from agent.contracts.relay import (
    METHOD_BACKUP_CLUSTER_SERVICE,
    METHOD_BACKUP_SERVICE_DATABASE_CLOSURE,
    METHOD_PRUNE_CLUSTER_NODE_ARCHIVE,
    METHOD_RESTORE_CLUSTER_SERVICE,
    METHOD_RESTORE_SERVICE_DATABASE_CLOSURE,
    REQUEST_MODELS,
    BackupClusterServiceRequest,
    BackupClusterServiceResponse,
    BackupServiceDatabaseClosureRequest,
    BackupServiceDatabaseClosureResponse,
    DatabaseClosureDescriptor,
    PruneClusterNodeArchiveRequest,
    PruneClusterNodeArchiveResponse,
    RestoreClusterServiceRequest,
    RestoreClusterServiceResponse,
    RestoreServiceDatabaseClosureRequest,
    RestoreServiceDatabaseClosureResponse,
    Service,
)
from tests.contracts.strategies import from_wire, mutated

FAST = settings(max_examples=100, deadline=None)
SHA = "f" * 64
MARKER = {"_isVirtualStream": True, "streamId": "stream-7"}
SERVICE: dict[str, Any] = {
    "id": "service-1",
    "data": {"name": "shop", "image": None, "resources": [{"type": "database", "id": "b1"}]},
    "userId": "u1",
}
SNAPSHOTS = [{"type": "database", "snapshotId": "s1"}, {"type": "objectstorage", "bucket": "b"}]
DESCRIPTOR: dict[str, Any] = {
    "size": 1024,
    "sha256": SHA,
    "receipt": {"v": 1, "sig": "abc"},
    "format": "closure-v1",
}

VALID: list[tuple[type[WireModel], dict[str, Any]]] = [
    (
        BackupClusterServiceRequest,
        {
            "nodeId": "node-a",
            "backupId": "backup-1",
            "service": SERVICE,
            "tags": {"reason": "nightly"},
            "replication": {"enabled": True},
        },
    ),
    (BackupClusterServiceRequest, {"nodeId": "node-a", "backupId": "backup-1", "service": SERVICE}),
    (
        BackupClusterServiceResponse,
        {"snapshots": SNAPSHOTS, "replication": {"totalSize": 9, "completedAt": 1}},
    ),
    (
        RestoreClusterServiceRequest,
        {
            "nodeId": "node-a",
            "backupId": "backup-1",
            "service": SERVICE,
            "snapshots": SNAPSHOTS,
            "clear": False,
            "resourceTypes": ["database"],
            "replication": {"enabled": False},
        },
    ),
    (RestoreClusterServiceResponse, {"restored": SNAPSHOTS}),
    (
        PruneClusterNodeArchiveRequest,
        {"nodeId": "node-a", "retention": {"keepLast": 3}, "dryRun": True},
    ),
    (PruneClusterNodeArchiveRequest, {"nodeId": "node-a", "retention": {}}),
    (
        PruneClusterNodeArchiveResponse,
        {"found": True, "result": {"freedBytes": 5, "dryRun": False}},
    ),
    (PruneClusterNodeArchiveResponse, {"found": False}),
    (
        BackupServiceDatabaseClosureRequest,
        {
            "backupId": "backup-1",
            "serviceId": "service-1",
            "nodeId": "node-a",
            "descriptor": DESCRIPTOR,
            "closure": MARKER,
        },
    ),
    (BackupServiceDatabaseClosureResponse, {"accepted": True}),
    (
        RestoreServiceDatabaseClosureRequest,
        {"backupId": "backup-1", "serviceId": "service-1", "nodeId": "node-a"},
    ),
    (RestoreServiceDatabaseClosureResponse, {"descriptor": DESCRIPTOR, "closure": MARKER}),
]
VALID_IDS = [f"{model.__name__}-{index}" for index, (model, _) in enumerate(VALID)]


class TestBodies:
    @pytest.mark.parametrize(("model", "wire"), VALID, ids=VALID_IDS)
    def test_seed_shapes_round_trip(self, model: type[WireModel], wire: dict[str, Any]) -> None:
        """Each body the seeds define parses and dumps back to the same dict."""
        parsed = from_wire(model, wire)
        assert parsed.to_wire() == wire

    @pytest.mark.parametrize(("model", "wire"), VALID, ids=VALID_IDS)
    def test_bodies_are_exact(self, model: type[WireModel], wire: dict[str, Any]) -> None:
        """An unknown top-level field is refused on every body."""
        with pytest.raises(ValidationError):
            from_wire(model, {**wire, "identity": {"jwt": "j"}})

    @pytest.mark.parametrize(("model", "wire"), VALID, ids=VALID_IDS)
    def test_broken_bodies_raise_only_validation_error(
        self, model: type[WireModel], wire: dict[str, Any]
    ) -> None:
        """Mutated bodies either parse or raise ValidationError, nothing else."""

        @FAST
        @given(broken=mutated(st.just(wire)))
        def check(broken: Any) -> None:
            with contextlib.suppress(ValidationError):
                from_wire(model, broken)

        check()

    def test_node_id_is_required_and_not_empty(self) -> None:
        """A node-routed request without a usable `nodeId` is refused."""
        wire = {"nodeId": "", "retention": {}}
        with pytest.raises(ValidationError):
            from_wire(PruneClusterNodeArchiveRequest, wire)
        with pytest.raises(ValidationError):
            from_wire(PruneClusterNodeArchiveRequest, {"retention": {}})

    @pytest.mark.parametrize("bad", ["../../x", "a/b", "..", "x\u0000", "x" * 257])
    @pytest.mark.parametrize(
        ("index", "field"),
        [
            (0, "backupId"),
            (0, "service.id"),
            (3, "backupId"),
            (9, "backupId"),
            (9, "serviceId"),
            (11, "backupId"),
            (11, "serviceId"),
        ],
    )
    def test_backup_and_service_ids_follow_the_path_segment_rule(
        self, index: int, field: str, bad: str
    ) -> None:
        """They name archives and closures on the node: refused outside the rule, by name."""
        model, wire = VALID[index]
        head, _, rest = field.partition(".")
        broken = {**wire, head: {**wire[head], rest: bad} if rest else bad}
        with pytest.raises(ValidationError) as caught:
            from_wire(model, broken)
        assert first_problem(caught.value)[0] == field

    def test_node_id_keeps_its_own_rule(self) -> None:
        """`nodeId` is matched against the cluster document, not a path: any non-empty text."""
        wire = {"nodeId": "node a/b", "retention": {}}
        assert from_wire(PruneClusterNodeArchiveRequest, wire).node_id == "node a/b"

    @pytest.mark.parametrize("tags", [{"a": 1}, ["a"], {"a": None}])
    def test_tags_map_strings_to_strings(self, tags: Any) -> None:
        """`tags` is `Record<string, string>`."""
        with pytest.raises(ValidationError):
            from_wire(
                BackupClusterServiceRequest,
                {"nodeId": "n", "backupId": "b", "service": SERVICE, "tags": tags},
            )

    def test_resource_types_are_backup_resource_types(self) -> None:
        """`resourceTypes` names only volume, database or objectstorage."""
        with pytest.raises(ValidationError):
            from_wire(
                RestoreClusterServiceRequest,
                {
                    "nodeId": "n",
                    "backupId": "b",
                    "service": SERVICE,
                    "snapshots": [],
                    "resourceTypes": ["secrets"],
                },
            )

    def test_methods_are_the_seeds(self) -> None:
        """Method names as seed 001 spells them; the agent serves the three Cloudly calls."""
        assert (
            METHOD_BACKUP_CLUSTER_SERVICE,
            METHOD_RESTORE_CLUSTER_SERVICE,
            METHOD_PRUNE_CLUSTER_NODE_ARCHIVE,
            METHOD_BACKUP_SERVICE_DATABASE_CLOSURE,
            METHOD_RESTORE_SERVICE_DATABASE_CLOSURE,
        ) == (
            "backupClusterService",
            "restoreClusterService",
            "pruneClusterNodeArchive",
            "backupServiceDatabaseClosure",
            "restoreServiceDatabaseClosure",
        )
        assert {
            "backupClusterService": BackupClusterServiceRequest,
            "restoreClusterService": RestoreClusterServiceRequest,
            "pruneClusterNodeArchive": PruneClusterNodeArchiveRequest,
        } == REQUEST_MODELS


class TestService:
    def test_service_is_kept_verbatim(self) -> None:
        """`data` and unknown fields, nulls included, pass through unchanged."""
        wire = {**SERVICE, "extra": None}
        service = from_wire(Service, wire)
        assert service.id == "service-1"
        assert service.to_wire() == wire

    def test_service_needs_id_and_data(self) -> None:
        """A service without `id` or `data` is refused."""
        with pytest.raises(ValidationError):
            from_wire(Service, {"data": {}})
        with pytest.raises(ValidationError):
            from_wire(Service, {"id": "s"})


class TestClosureDescriptor:
    def test_descriptor_keeps_corestore_fields(self) -> None:
        """Size, digest and receipt are typed; anything else passes through."""
        descriptor = from_wire(DatabaseClosureDescriptor, DESCRIPTOR)
        assert descriptor.size == 1024
        assert descriptor.to_wire() == DESCRIPTOR

    @pytest.mark.parametrize("receipt", ["opaque-receipt", {"a": [1, None]}, [1, 2], 7])
    def test_receipt_is_any_json_value(self, receipt: Any) -> None:
        """The receipt is opaque: any JSON value is carried unchanged."""
        wire = {**DESCRIPTOR, "receipt": receipt}
        assert from_wire(DatabaseClosureDescriptor, wire).to_wire() == wire

    @pytest.mark.parametrize(
        ("key", "value"),
        [("receipt", None), ("size", -1), ("size", True), ("sha256", SHA.upper())],
    )
    def test_required_fields_are_checked(self, key: str, value: Any) -> None:
        """A null receipt, a negative or bool size, or a bad digest is refused."""
        with pytest.raises(ValidationError):
            from_wire(DatabaseClosureDescriptor, {**DESCRIPTOR, key: value})

    def test_receipt_is_required(self) -> None:
        """A descriptor without a receipt is refused."""
        with pytest.raises(ValidationError):
            from_wire(DatabaseClosureDescriptor, {"size": 1, "sha256": SHA})
