"""The pure node-state transforms the engine writes (frozen models in, new models out)."""

from __future__ import annotations

import json
from typing import Any

from agent.contracts.isolatedrestore import (
    IsolatedRestoreNodeState,
    PrepareIsolatedRestoreRequest,
    ResourceCleanupProgress,
    StagingCleanupProgress,
)
from agent.corestore.models import VerificationAnswer
from agent.domain.restores import plan_of
from agent.restore import state as s

GRANT = "eyJhbGciOiJSUzI1NiJ9.cGF5bG9hZA.c2ln"
SHA = "ab" * 32
MAPPINGS = [
    {
        "id": mapping_id,
        "type": "database",
        "source": {"snapshotId": "s", "resourceName": "r", "databaseName": "d"},
        "target": {"resourceName": "r2", "databaseName": "d"},
    }
    for mapping_id in ("m1", "m2")
]
REQUEST = PrepareIsolatedRestoreRequest.from_wire(
    {
        "restoreGrant": GRANT,
        "clusterId": "c-1",
        "targetNodeName": "n-1",
        "restoreId": "r-1",
        "expectedRevision": 0,
        "sourceBackupId": "b-1",
        "sourceServiceId": "svc-1",
        "scratchNamespaceId": "ns-1",
        "stagingArchiveId": "sa-1",
        "resourceMappings": MAPPINGS,
        "archiveManifest": {"objects": [{"path": "s/a", "size": 1, "sha256": SHA}], "v": 2},
    }
)
PLAN = plan_of(REQUEST)


def _state() -> IsolatedRestoreNodeState:
    return s.initial_state(REQUEST, 100)


def _answer(body: dict[str, Any]) -> VerificationAnswer:
    """Corestore's verification answer, parsed as the client parses it (from JSON)."""
    return VerificationAnswer.model_validate_json(json.dumps(body))


def _valid(state: IsolatedRestoreNodeState) -> IsolatedRestoreNodeState:
    """`state` read back through the contract (model_copy does not validate: this does)."""
    return IsolatedRestoreNodeState.from_wire(state.to_wire())


def test_a_prepare_request_starts_a_state_with_nothing_done() -> None:
    """Its ids are copied; nothing is completed, verification is pending, no cleanup yet."""
    state = _valid(_state())
    assert state.to_wire() == {
        "restoreId": "r-1",
        "clusterId": "c-1",
        "targetNodeName": "n-1",
        "sourceBackupId": "b-1",
        "sourceServiceId": "svc-1",
        "scratchNamespaceId": "ns-1",
        "stagingArchiveId": "sa-1",
        "revision": 0,
        "status": "preparing",
        "completedResourceMappingIds": [],
        "verification": {"status": "pending", "results": []},
        "updatedAt": 100,
    }


def test_the_plan_keeps_the_mappings_and_the_manifest_as_sent() -> None:
    """The manifest's extra fields too (the grant binds them); never the grant."""
    assert PLAN.to_wire() == {
        "resourceMappings": MAPPINGS,
        "archiveManifest": {"objects": [{"path": "s/a", "size": 1, "sha256": SHA}], "v": 2},
    }
    assert GRANT not in PLAN.model_dump_json()


def test_prepared_and_error_are_recorded() -> None:
    """preparedAt, lastErrorCode and lastErrorMessage are set as given."""
    state = s.with_error(s.with_prepared(_state(), 7), "corestore-refused", "409 no")
    assert (state.prepared_at, state.last_error_code, state.last_error_message) == (
        7,
        "corestore-refused",
        "409 no",
    )
    _valid(state)


def test_a_mapping_is_completed_once() -> None:
    """Recording the same completed mapping twice lists it once."""
    state = s.with_completed_mapping(s.with_completed_mapping(_state(), "m1"), "m1")
    assert state.completed_resource_mapping_ids == ["m1"]


def test_verification_runs_from_its_first_start_and_ends_with_ready() -> None:
    """A second start keeps the first startedAt and the results; ready sets passed and readyAt."""
    answer = _answer(
        {
            "mappingId": "m1",
            "resourceType": "database",
            "status": "passed",
            "checks": [{"code": "content-sha256", "status": "passed", "message": ""}],
        }
    )
    result = s.verification_result(REQUEST.resource_mappings[0], answer, 5)
    state = s.with_verification_result(s.with_verification_started(_state(), 3), result)
    state = s.with_verification_started(state, 9)
    assert (state.verification.status, state.verification.started_at) == ("running", 3)
    assert state.verification.results == [result]
    ready = _valid(s.with_ready(state, 11))
    assert (ready.verification.status, ready.verification.completed_at, ready.ready_at) == (
        "passed",
        11,
        11,
    )
    assert ready.verification.results[0].to_wire() == {
        "resourceMappingId": "m1",
        "resourceType": "database",
        "status": "passed",
        "checks": [{"code": "content-sha256", "status": "passed"}],
        "checkedAt": 5,
    }


def test_a_new_result_replaces_the_earlier_one_of_its_mapping() -> None:
    """One result per mapping: the latest check wins."""
    failed = _answer(
        {"mappingId": "m1", "resourceType": "database", "status": "failed", "checks": []}
    )
    passed = failed.model_copy(update={"status": "passed"})
    mapping = REQUEST.resource_mappings[0]
    state = s.with_verification_result(_state(), s.verification_result(mapping, failed, 1))
    state = s.with_verification_result(state, s.verification_result(mapping, passed, 2))
    assert [(r.status, r.checked_at) for r in state.verification.results] == [("passed", 2)]


def test_a_cleanup_plan_lists_every_mapping_and_the_archive_pending() -> None:
    """One entry per mapping (its type, attempts 0) and the staging archive."""
    cleanup = _valid(s.with_cleanup_plan(_state(), PLAN.resource_mappings)).cleanup
    assert cleanup is not None
    assert cleanup.to_wire() == {
        "resources": [
            {
                "resourceMappingId": "m1",
                "resourceType": "database",
                "status": "pending",
                "attempts": 0,
            },
            {
                "resourceMappingId": "m2",
                "resourceType": "database",
                "status": "pending",
                "attempts": 0,
            },
        ],
        "stagingArchive": {"stagingArchiveId": "sa-1", "status": "pending", "attempts": 0},
    }
    assert s.cleanup_pending(s.with_cleanup_plan(_state(), PLAN.resource_mappings)) == [
        "m1",
        "m2",
        s.STAGING_ENTRY,
    ]


def test_a_new_plan_keeps_what_an_earlier_cleanup_achieved() -> None:
    """Succeeded entries stay succeeded; failed ones keep attempts and error until retried."""
    state = s.with_cleanup_plan(_state(), PLAN.resource_mappings)
    state = s.with_cleanup_entry(state, "m1", status="succeeded", now=5, attempt=True)
    state = s.with_cleanup_entry(
        state, "m2", status="failed", now=6, attempt=True, error=("x", "y")
    )
    again = s.with_cleanup_plan(state, PLAN.resource_mappings)
    assert again.cleanup == state.cleanup
    assert s.cleanup_pending(again) == ["m2", s.STAGING_ENTRY]
    assert not s.cleanup_complete(again)


def test_success_drops_the_error_of_an_earlier_try() -> None:
    """An entry that succeeds after a failure carries no errorCode any more."""
    state = s.with_cleanup_plan(_state(), PLAN.resource_mappings)
    state = s.with_cleanup_entry(
        state, s.STAGING_ENTRY, status="failed", now=1, attempt=True, error=("c", "m")
    )
    failed = s.cleanup_entry(state, s.STAGING_ENTRY)
    assert (failed.error_code, failed.error_message) == ("c", "m")
    state = s.with_cleanup_entry(state, s.STAGING_ENTRY, status="succeeded", now=2, attempt=True)
    entry = s.cleanup_entry(_valid(state), s.STAGING_ENTRY)
    assert isinstance(entry, StagingCleanupProgress)
    assert entry.to_wire() == {
        "stagingArchiveId": "sa-1",
        "status": "succeeded",
        "attempts": 2,
        "updatedAt": 2,
    }


def test_cleanup_is_complete_only_when_every_entry_succeeded() -> None:
    """No plan, or one entry left, is not complete; all succeeded is."""
    assert not s.cleanup_complete(_state())
    state = s.with_cleanup_plan(_state(), PLAN.resource_mappings)
    for entry_id in ("m1", "m2"):
        state = s.with_cleanup_entry(state, entry_id, status="succeeded", now=1)
    assert not s.cleanup_complete(state)
    state = s.with_cleanup_entry(state, s.STAGING_ENTRY, status="succeeded", now=1)
    assert s.cleanup_complete(state)
    entry = s.cleanup_entry(state, "m2")
    assert isinstance(entry, ResourceCleanupProgress)
    assert entry.status == "succeeded"


def test_transforms_never_change_the_state_they_are_given() -> None:
    """Every transform returns a new model; the input (and what it nests) stays as it was."""
    state = s.with_cleanup_plan(_state(), PLAN.resource_mappings)
    before = state.to_wire()
    results = [
        s.with_completed_mapping(state, "m1"),
        s.with_verification_started(state, 3),
        s.with_cleanup_entry(state, "m1", status="running", now=4, attempt=True),
        s.with_cleanup_entry(state, s.STAGING_ENTRY, status="failed", now=4, error=("a", "b")),
        s.with_error(state, "code", "message"),
        s.with_ready(state, 5),
    ]
    assert state.to_wire() == before
    assert all(result is not state and result != state for result in results)
