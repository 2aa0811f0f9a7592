"""A job's recorded failure keeps every fact its answer carried."""

from __future__ import annotations

import pytest

from agent.domain.outcomes import JobFailed, result_from_json
from agent.errors import InvalidState, RestoreInProgress, StreamNotServed, wire_error_data


def test_a_recorded_failure_is_answered_again_with_its_wire_facts() -> None:
    """Stored and read back, the error carries the same `error.data` as the first answer."""
    error = RestoreInProgress(service_id="svc", node_id="node-1", backup_id="bk-1", run=3)
    again = result_from_json(JobFailed.of(error).to_json())
    assert isinstance(again, JobFailed)
    assert wire_error_data(again.error()) == wire_error_data(error)
    assert str(again.error()) == str(error)


def test_a_failure_without_facts_is_stored_without_data() -> None:
    """An error with no facts of its own is stored as before (code, message, retryable)."""
    stored = JobFailed.of(StreamNotServed("the responder cannot serve read")).to_json()
    assert stored == {
        "error": {
            "code": "stream-not-served",
            "message": "the responder cannot serve read",
            "retryable": False,
        }
    }


def test_a_record_whose_data_is_no_object_is_refused() -> None:
    """`data` must be a JSON object."""
    with pytest.raises(InvalidState):
        result_from_json({"error": {"code": "x", "message": "m", "retryable": True, "data": 3}})
