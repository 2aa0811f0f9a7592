"""Specification of `agent.contracts.isolatedrestore`: node state, mappings, the five methods."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st
from pydantic import BaseModel, ValidationError

from agent.contracts.base import first_problem
from agent.contracts.isolatedrestore import (
    METHOD_CLEANUP,
    METHOD_EXECUTE,
    METHOD_GET_STATUS,
    METHOD_PREPARE,
    METHOD_STAGE,
    NODE_STATUSES,
    REQUEST_MODELS,
    RESOURCE_MAPPING_ADAPTER,
    CleanupIsolatedRestoreRequest,
    DatabaseAllocationReference,
    DatabaseMapping,
    ExecuteIsolatedRestoreRequest,
    GetIsolatedRestoreStatusRequest,
    IsolatedRestoreNodeState,
    IsolatedRestoreRequest,
    IsolatedRestoreStateResponse,
    IsolatedRestoreStatusResponse,
    ObjectStorageMapping,
    PrepareIsolatedRestoreRequest,
    StageIsolatedRestoreArchiveRequest,
    VolumeMapping,
)
from agent.secret import MASK
from tests.contracts.strategies import (
    cleanup_requests,
    execute_requests,
    from_wire,
    mutated,
    node_states,
    prepare_requests,
    resource_mappings,
    stage_requests,
    status_requests,
)

FAST = settings(max_examples=100, deadline=None)
SHA = "0123456789abcdef" * 4
GRANT = "eyJhbGciOiJSUzI1NiJ9.grant-body.grant-signature"

STATE: dict[str, Any] = {
    "restoreId": "restore-1",
    "clusterId": "cluster-1",
    "targetNodeName": "node-a",
    "sourceBackupId": "backup-1",
    "sourceServiceId": "service-1",
    "scratchNamespaceId": "scratch-1",
    "stagingArchiveId": "staging-1",
    "revision": 1,
    "status": "prepared",
    "completedResourceMappingIds": [],
    "verification": {"status": "pending", "results": []},
    "updatedAt": 1_780_000_000_000,
}

ALLOCATION: dict[str, Any] = {
    "purpose": "scratch-rehearsal",
    "rehearsalId": "rehearsal-1",
    "allocationId": SHA,
    "generation": 1,
    "bindingSha256": SHA,
    "receiptSha256": SHA,
}

DATABASE_MAPPING: dict[str, Any] = {
    "id": "m-db",
    "type": "database",
    "source": {"snapshotId": "s1", "resourceName": "db", "databaseName": "app"},
    "target": {
        "resourceName": "db-scratch",
        "databaseName": "app",
        "databaseAllocation": ALLOCATION,
    },
}

ROUTING: dict[str, Any] = {
    "restoreGrant": GRANT,
    "clusterId": "cluster-1",
    "targetNodeName": "node-a",
    "restoreId": "restore-1",
}

PREPARE: dict[str, Any] = {
    **ROUTING,
    "expectedRevision": 0,
    "sourceBackupId": "backup-1",
    "sourceServiceId": "service-1",
    "scratchNamespaceId": "scratch-1",
    "stagingArchiveId": "staging-1",
    "resourceMappings": [DATABASE_MAPPING],
    "archiveManifest": {"objects": [{"path": "db/closure", "size": 3, "sha256": SHA}]},
}

STAGE: dict[str, Any] = {
    **ROUTING,
    "expectedRevision": 1,
    "object": {"path": "db/closure", "size": 3, "sha256": SHA},
    "archive": {"_isVirtualStream": True, "streamId": "stream-1"},
}


def _with(wire: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    """A deep copy of `wire` with the field at the dotted path (list indexes as digits) set."""
    head, _, rest = dotted.partition(".")
    if isinstance(wire, list):
        index = int(head)
        items = list(wire)
        items[index] = value if not rest else _with(items[index], rest, value)
        return items  # type: ignore[return-value]
    return {**wire, head: value if not rest else _with(wire[head], rest, value)}


def _wire_keys(model: type[BaseModel]) -> list[str]:
    return [field.alias or name for name, field in model.model_fields.items()]


def _has_null(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, dict):
        return any(_has_null(item) for item in value.values())
    if isinstance(value, list):
        return any(_has_null(item) for item in value)
    return False


class TestWireNames:
    def test_node_state_keys_are_the_seeds(self) -> None:
        """`IIsolatedRestoreNodeState` has exactly the seed's keys, in its order."""
        assert _wire_keys(IsolatedRestoreNodeState) == [
            "restoreId",
            "clusterId",
            "targetNodeName",
            "sourceBackupId",
            "sourceServiceId",
            "scratchNamespaceId",
            "stagingArchiveId",
            "revision",
            "status",
            "completedResourceMappingIds",
            "verification",
            "cleanup",
            "preparedAt",
            "readyAt",
            "updatedAt",
            "lastErrorCode",
            "lastErrorMessage",
        ]

    def test_prepare_request_keys_are_the_seeds(self) -> None:
        """`coreflowPrepareIsolatedRestore` has exactly the seed's request keys."""
        assert _wire_keys(PrepareIsolatedRestoreRequest) == list(PREPARE)

    def test_stage_request_keys_are_the_seeds(self) -> None:
        """`stageIsolatedRestoreArchive` has exactly the seed's request keys."""
        assert _wire_keys(StageIsolatedRestoreArchiveRequest) == list(STAGE)

    def test_allocation_reference_keys_are_the_seeds(self) -> None:
        """`ICorestoreDatabaseAllocationReference` has exactly the seed's keys."""
        assert _wire_keys(DatabaseAllocationReference) == list(ALLOCATION)

    def test_methods_are_the_seeds(self) -> None:
        """The five method names, and one request model per method."""
        assert (
            METHOD_PREPARE,
            METHOD_STAGE,
            METHOD_GET_STATUS,
            METHOD_EXECUTE,
            METHOD_CLEANUP,
        ) == (
            "coreflowPrepareIsolatedRestore",
            "stageIsolatedRestoreArchive",
            "coreflowGetIsolatedRestoreStatus",
            "coreflowExecuteIsolatedRestore",
            "coreflowCleanupIsolatedRestore",
        )
        assert {
            METHOD_PREPARE: PrepareIsolatedRestoreRequest,
            METHOD_STAGE: StageIsolatedRestoreArchiveRequest,
            METHOD_GET_STATUS: GetIsolatedRestoreStatusRequest,
            METHOD_EXECUTE: ExecuteIsolatedRestoreRequest,
            METHOD_CLEANUP: CleanupIsolatedRestoreRequest,
        } == REQUEST_MODELS

    def test_node_statuses_are_the_seeds(self) -> None:
        """`TIsolatedRestoreNodeStatus` in the seed's order."""
        assert NODE_STATUSES == (
            "preparing",
            "prepared",
            "staging",
            "restoring",
            "verifying",
            "ready",
            "failed",
            "cleaning",
            "cleaned",
            "cleanup-failed",
        )


class TestNodeState:
    def test_minimal_state_round_trips(self) -> None:
        """A state without optionals dumps back without them."""
        assert from_wire(IsolatedRestoreNodeState, STATE).to_wire() == STATE

    @pytest.mark.parametrize(
        ("key", "value"),
        [
            ("revision", -1),
            ("revision", True),
            ("revision", 2**53),
            ("status", "pending"),
            ("clusterId", ""),
            ("updatedAt", 1.5),
            ("updatedAt", None),
        ],
    )
    def test_invalid_fields_are_refused(self, key: str, value: Any) -> None:
        """Out-of-range, bool-as-int, bad status, empty id and a null required field are refused."""
        with pytest.raises(ValidationError):
            from_wire(IsolatedRestoreNodeState, {**STATE, key: value})

    def test_unknown_field_is_refused(self) -> None:
        """The node state is exact."""
        with pytest.raises(ValidationError):
            from_wire(IsolatedRestoreNodeState, {**STATE, "note": "x"})

    @FAST
    @given(wire=node_states)
    def test_round_trip_is_identity(self, wire: dict[str, Any]) -> None:
        """parse -> to_wire gives back the input, and parses to the same state."""
        state = from_wire(IsolatedRestoreNodeState, wire)
        assert state.to_wire() == wire
        assert from_wire(IsolatedRestoreNodeState, state.to_wire()) == state

    @FAST
    @given(wire=node_states)
    def test_to_wire_never_emits_null(self, wire: dict[str, Any]) -> None:
        """Absent optionals are omitted, never sent as null."""
        assert not _has_null(from_wire(IsolatedRestoreNodeState, wire).to_wire())

    @FAST
    @given(wire=mutated(node_states))
    def test_invalid_state_raises_only_validation_error(self, wire: Any) -> None:
        """Broken states either parse or raise ValidationError, nothing else."""
        with contextlib.suppress(ValidationError):
            from_wire(IsolatedRestoreNodeState, wire)


class TestResourceMappings:
    @pytest.mark.parametrize(
        ("wire", "model"),
        [
            (DATABASE_MAPPING, DatabaseMapping),
            (
                {
                    "id": "m-v",
                    "type": "volume",
                    "source": {"snapshotId": "s", "volumeName": "v", "mountPath": "/d"},
                    "target": {"volumeName": "v2", "mountPath": "/d"},
                },
                VolumeMapping,
            ),
            (
                {
                    "id": "m-o",
                    "type": "objectstorage",
                    "source": {"snapshotId": "s", "resourceName": "r", "bucketName": "b"},
                    "target": {"resourceName": "r2", "bucketName": "b"},
                },
                ObjectStorageMapping,
            ),
        ],
    )
    def test_type_selects_the_mapping(self, wire: dict[str, Any], model: type[BaseModel]) -> None:
        """`type` picks the mapping shape."""
        assert isinstance(RESOURCE_MAPPING_ADAPTER.validate_python(wire, by_name=False), model)

    def test_database_target_without_allocation_round_trips(self) -> None:
        """A database target without `databaseAllocation` dumps without it."""
        wire = {**DATABASE_MAPPING, "target": {"resourceName": "r", "databaseName": "d"}}
        mapping = RESOURCE_MAPPING_ADAPTER.validate_python(wire, by_name=False)
        assert mapping.to_wire() == wire

    def test_allocation_only_on_database_targets(self) -> None:
        """An object-storage target with `databaseAllocation` is refused."""
        wire = {
            "id": "m-o",
            "type": "objectstorage",
            "source": {"snapshotId": "s", "resourceName": "r", "bucketName": "b"},
            "target": {"resourceName": "r2", "bucketName": "b", "databaseAllocation": ALLOCATION},
        }
        with pytest.raises(ValidationError):
            RESOURCE_MAPPING_ADAPTER.validate_python(wire, by_name=False)

    def test_mapping_shape_must_match_its_type(self) -> None:
        """A volume-shaped mapping with `type: database` is refused."""
        wire = {
            "id": "m",
            "type": "database",
            "source": {"snapshotId": "s", "volumeName": "v", "mountPath": "/d"},
            "target": {"volumeName": "v2", "mountPath": "/d"},
        }
        with pytest.raises(ValidationError):
            RESOURCE_MAPPING_ADAPTER.validate_python(wire, by_name=False)

    @FAST
    @given(wire=resource_mappings)
    def test_round_trip_is_identity(self, wire: dict[str, Any]) -> None:
        """parse -> to_wire gives back every generated mapping."""
        mapping = RESOURCE_MAPPING_ADAPTER.validate_python(wire, by_name=False)
        assert mapping.to_wire() == wire
        assert RESOURCE_MAPPING_ADAPTER.validate_python(mapping.to_wire(), by_name=False) == mapping

    @FAST
    @given(wire=mutated(resource_mappings))
    def test_invalid_mapping_raises_only_validation_error(self, wire: Any) -> None:
        """Broken mappings either parse or raise ValidationError, nothing else."""
        with contextlib.suppress(ValidationError):
            RESOURCE_MAPPING_ADAPTER.validate_python(wire, by_name=False)


class TestDatabaseAllocationReference:
    def test_seed_shape_parses(self) -> None:
        """A reference as Corestore issues it parses and dumps unchanged."""
        assert from_wire(DatabaseAllocationReference, ALLOCATION).to_wire() == ALLOCATION

    @pytest.mark.parametrize(
        ("key", "value"),
        [
            ("purpose", "rehearsal"),
            ("rehearsalId", ""),
            ("rehearsalId", "-leading-dash"),
            ("rehearsalId", "has space"),
            ("rehearsalId", "a/b"),
            ("rehearsalId", "ü"),
            ("rehearsalId", "a" * 257),
            ("rehearsalId", "a\n"),
            ("allocationId", SHA.upper()),
            ("bindingSha256", SHA[:-1]),
            ("receiptSha256", SHA + "0"),
            ("generation", 0),
            ("generation", True),
            ("generation", 1.0),
            ("generation", 2**53),
        ],
    )
    def test_each_field_is_read_not_trusted(self, key: str, value: Any) -> None:
        """Purpose, scoped id, digests and generation are each checked."""
        with pytest.raises(ValidationError):
            from_wire(DatabaseAllocationReference, {**ALLOCATION, key: value})

    @pytest.mark.parametrize("rehearsal_id", ["r", "R-1", "cluster-1:rehearsal.2_a", "a" * 256])
    def test_scoped_ids_that_pass(self, rehearsal_id: str) -> None:
        """Letters, digits and `._:-` after a letter or digit, up to 256 characters, pass."""
        reference = from_wire(
            DatabaseAllocationReference, {**ALLOCATION, "rehearsalId": rehearsal_id}
        )
        assert reference.rehearsal_id == rehearsal_id

    def test_keys_are_exact(self) -> None:
        """A missing or an extra key is refused."""
        missing = {k: v for k, v in ALLOCATION.items() if k != "generation"}
        with pytest.raises(ValidationError):
            from_wire(DatabaseAllocationReference, missing)
        with pytest.raises(ValidationError):
            from_wire(DatabaseAllocationReference, {**ALLOCATION, "uri": "mongodb://x"})


_REQUESTS: list[tuple[type[IsolatedRestoreRequest], st.SearchStrategy[dict[str, Any]]]] = [
    (PrepareIsolatedRestoreRequest, prepare_requests),
    (StageIsolatedRestoreArchiveRequest, stage_requests),
    (GetIsolatedRestoreStatusRequest, status_requests),
    (ExecuteIsolatedRestoreRequest, execute_requests),
    (CleanupIsolatedRestoreRequest, cleanup_requests),
]
_REQUEST_IDS = [model.__name__ for model, _ in _REQUESTS]
_VALID_BODIES: dict[type[IsolatedRestoreRequest], dict[str, Any]] = {
    PrepareIsolatedRestoreRequest: PREPARE,
    StageIsolatedRestoreArchiveRequest: STAGE,
    GetIsolatedRestoreStatusRequest: ROUTING,
    ExecuteIsolatedRestoreRequest: {**ROUTING, "expectedRevision": 2},
    CleanupIsolatedRestoreRequest: {**ROUTING, "expectedRevision": 2},
}


class TestRequests:
    def test_prepare_parses_the_seed_shape(self) -> None:
        """A prepare body with a database allocation parses; its grant is a Secret."""
        request = from_wire(PrepareIsolatedRestoreRequest, PREPARE)
        assert request.restore_grant.reveal() == GRANT
        assert isinstance(request.resource_mappings[0], DatabaseMapping)

    def test_grant_dumps_masked(self) -> None:
        """`to_wire()` and `repr` show the mask, never the grant."""
        request = from_wire(StageIsolatedRestoreArchiveRequest, STAGE)
        assert request.to_wire()["restoreGrant"] == MASK
        assert GRANT not in repr(request)
        assert GRANT not in request.model_dump_json()

    def test_revealed_wire_is_the_original_body(self) -> None:
        """`revealed_wire()` gives back exactly what arrived."""
        assert from_wire(StageIsolatedRestoreArchiveRequest, STAGE).revealed_wire() == STAGE

    def test_duplicate_mapping_ids_are_refused(self) -> None:
        """Two mappings with one id make the prepare request invalid."""
        wire = {**PREPARE, "resourceMappings": [DATABASE_MAPPING, DATABASE_MAPPING]}
        with pytest.raises(ValidationError, match="more than once"):
            from_wire(PrepareIsolatedRestoreRequest, wire)

    def test_archive_must_be_a_stream_marker(self) -> None:
        """`archive` must be `{_isVirtualStream: true, streamId}`."""
        for archive in ({"_isVirtualStream": False, "streamId": "s"}, {"streamId": "s"}, "s"):
            with pytest.raises(ValidationError):
                from_wire(StageIsolatedRestoreArchiveRequest, {**STAGE, "archive": archive})

    @pytest.mark.parametrize("bad", ["../../x", "a/b", "..", "x\u0000", "x" * 257])
    @pytest.mark.parametrize(
        ("field", "named"),
        [
            ("restoreId", "restoreId"),
            ("scratchNamespaceId", "scratchNamespaceId"),
            ("stagingArchiveId", "stagingArchiveId"),
            # The mapping's `type` tag is part of the reported path (pydantic's union step).
            ("resourceMappings.0.id", "resourceMappings.0.database.id"),
            (
                "resourceMappings.0.source.snapshotId",
                "resourceMappings.0.database.source.snapshotId",
            ),
        ],
    )
    def test_prepare_ids_that_become_path_segments_follow_the_rule(
        self, field: str, named: str, bad: str
    ) -> None:
        """Each id Corestore puts in a path or a directory is refused outside the rule, and
        the refusal names that field."""
        from_wire(PrepareIsolatedRestoreRequest, _with(PREPARE, field, "rst-1.2:a"))
        with pytest.raises(ValidationError) as caught:
            from_wire(PrepareIsolatedRestoreRequest, _with(PREPARE, field, bad))
        assert first_problem(caught.value)[0] == named

    @pytest.mark.parametrize(("model", "_strategy"), _REQUESTS, ids=_REQUEST_IDS)
    def test_every_request_refuses_a_restore_id_outside_the_rule(
        self, model: type[IsolatedRestoreRequest], _strategy: Any
    ) -> None:
        """`restoreId` keys the store and Corestore's paths on every request."""
        assert from_wire(model, _VALID_BODIES[model]).restore_id == "restore-1"
        with pytest.raises(ValidationError) as caught:
            from_wire(model, {**_VALID_BODIES[model], "restoreId": "../../x"})
        assert first_problem(caught.value)[0] == "restoreId"

    def test_ids_matched_against_the_cluster_document_keep_their_own_rule(self) -> None:
        """`clusterId` and `targetNodeName` are not path segments: any non-empty text passes."""
        wire = {**PREPARE, "clusterId": "cluster one/ä", "targetNodeName": "node a.b/c"}
        request = from_wire(PrepareIsolatedRestoreRequest, wire)
        assert (request.cluster_id, request.target_node_name) == ("cluster one/ä", "node a.b/c")

    @pytest.mark.parametrize(("model", "_strategy"), _REQUESTS, ids=_REQUEST_IDS)
    def test_unknown_field_is_refused(
        self, model: type[IsolatedRestoreRequest], _strategy: Any
    ) -> None:
        """A request with a field the agent does not know is refused."""
        with pytest.raises(ValidationError):
            from_wire(model, {**ROUTING, "expectedRevision": 0, "confirmPartialRestore": True})

    @pytest.mark.parametrize(("model", "strategy"), _REQUESTS, ids=_REQUEST_IDS)
    def test_round_trip_is_identity(
        self, model: type[IsolatedRestoreRequest], strategy: st.SearchStrategy[dict[str, Any]]
    ) -> None:
        """parse -> revealed_wire gives back every generated body; to_wire masks only the grant."""

        @FAST
        @given(wire=strategy)
        def check(wire: dict[str, Any]) -> None:
            request = from_wire(model, wire)
            assert request.revealed_wire() == wire
            assert from_wire(model, request.revealed_wire()) == request
            assert request.to_wire() == {**wire, "restoreGrant": MASK}

        check()

    @pytest.mark.parametrize(("model", "strategy"), _REQUESTS, ids=_REQUEST_IDS)
    def test_invalid_body_raises_only_validation_error(
        self, model: type[IsolatedRestoreRequest], strategy: st.SearchStrategy[dict[str, Any]]
    ) -> None:
        """Broken bodies either parse or raise ValidationError, nothing else."""

        @FAST
        @given(wire=mutated(strategy))
        def check(wire: Any) -> None:
            with contextlib.suppress(ValidationError):
                from_wire(model, wire)

        check()


class TestResponses:
    def test_state_response_wraps_the_state(self) -> None:
        """`{state}` dumps the state unchanged."""
        response = IsolatedRestoreStateResponse(state=from_wire(IsolatedRestoreNodeState, STATE))
        assert response.to_wire() == {"state": STATE}

    def test_status_found(self) -> None:
        """`{found: true, state}`."""
        wire = {"found": True, "state": STATE}
        assert from_wire(IsolatedRestoreStatusResponse, wire).to_wire() == wire

    def test_status_not_found_omits_state(self) -> None:
        """`{found: false}` carries no state key at all."""
        assert IsolatedRestoreStatusResponse(found=False).to_wire() == {"found": False}

    @pytest.mark.parametrize("wire", [{"found": True}, {"found": False, "state": STATE}])
    def test_state_present_exactly_when_found(self, wire: dict[str, Any]) -> None:
        """`found` without a state, or a state without `found`, is refused."""
        with pytest.raises(ValidationError):
            from_wire(IsolatedRestoreStatusResponse, wire)
