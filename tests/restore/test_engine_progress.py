"""The pure state transforms the engine writes (no I/O, no event loop)."""

from __future__ import annotations

import copy
from typing import Any

from agent.contracts.isolatedrestore import RESOURCE_MAPPING_ADAPTER
from agent.restore import progress as p

MAPPINGS = [
    RESOURCE_MAPPING_ADAPTER.validate_python(
        {
            "id": mapping_id,
            "type": "database",
            "source": {"snapshotId": "s", "resourceName": "r", "databaseName": "d"},
            "target": {"resourceName": "r2", "databaseName": "d"},
        },
        by_name=False,
    )
    for mapping_id in ("m1", "m2")
]


def _state() -> dict[str, Any]:
    return {
        "stagingArchiveId": "sa-1",
        "completedResourceMappingIds": [],
        "verification": {"status": "pending", "results": []},
    }


def test_a_cleanup_plan_lists_every_mapping_and_the_archive_pending() -> None:
    """One entry per mapping (its type, attempts 0) and the staging archive."""
    plan = p.with_cleanup_plan(_state(), MAPPINGS)["cleanup"]
    assert plan["resources"] == [
        {"resourceMappingId": "m1", "resourceType": "database", "status": "pending", "attempts": 0},
        {"resourceMappingId": "m2", "resourceType": "database", "status": "pending", "attempts": 0},
    ]
    assert plan["stagingArchive"] == {
        "stagingArchiveId": "sa-1",
        "status": "pending",
        "attempts": 0,
    }


def test_a_new_plan_keeps_what_an_earlier_cleanup_achieved() -> None:
    """Succeeded entries stay succeeded; failed ones keep attempts and error until retried."""
    state = p.with_cleanup_plan(_state(), MAPPINGS)
    state = p.with_cleanup_entry(state, "m1", status="succeeded", now=5, attempt=True)
    state = p.with_cleanup_entry(
        state, "m2", status="failed", now=6, attempt=True, error=("x", "y")
    )
    again = p.with_cleanup_plan(state, MAPPINGS)
    assert again["cleanup"] == state["cleanup"]
    assert p.cleanup_pending(again) == ["m2", p.STAGING_ENTRY]
    assert not p.cleanup_complete(again)


def test_success_drops_the_error_of_an_earlier_try() -> None:
    """An entry that succeeds after a failure carries no errorCode any more."""
    state = p.with_cleanup_plan(_state(), MAPPINGS)
    state = p.with_cleanup_entry(
        state, None, status="failed", now=1, attempt=True, error=("c", "m")
    )
    state = p.with_cleanup_entry(state, None, status="succeeded", now=2, attempt=True)
    assert p.cleanup_entry(state, None) == {
        "stagingArchiveId": "sa-1",
        "status": "succeeded",
        "attempts": 2,
        "updatedAt": 2,
    }


def test_transforms_never_change_the_state_they_are_given() -> None:
    """Every transform returns a new dict; the input stays as it was."""
    state = p.with_cleanup_plan(_state(), MAPPINGS)
    before = copy.deepcopy(state)
    p.with_completed_mapping(state, "m1")
    p.with_verification_started(state, 3)
    p.with_cleanup_entry(state, "m1", status="running", now=4, attempt=True)
    p.with_error(state, "code", "message")
    assert state == before


def test_a_mapping_is_completed_once() -> None:
    """Recording the same completed mapping twice lists it once."""
    state = p.with_completed_mapping(p.with_completed_mapping(_state(), "m1"), "m1")
    assert state["completedResourceMappingIds"] == ["m1"]
