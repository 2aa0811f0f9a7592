"""The status document: one typed form, its wire form, and a lenient reader of it."""

from __future__ import annotations

from agent.watch.docfields import Fields
from agent.watch.docrows import (
    UNMATCHED,
    NodeCounts,
    ObjectsProgress,
    Progress,
    RestoreRow,
    TransferDoc,
    TransfersDoc,
)
from agent.watch.document import ClusterDoc, NodeDoc, SessionDoc, StatusDocument

SESSION = SessionDoc(
    state="connected",
    state_since=1_000,
    connected_since=1_000,
    reconnect_count=2,
    last_error=None,
    last_error_at=None,
    cluster=ClusterDoc("c1", 900, (NodeDoc("n1", "http://10.0.0.1:3000", ()),)),
    in_flight=1,
    identity_expires_at=5_000,
    last_pong_at=1_200,
    pong_latency_seconds=0.004,
    unreachable_since=None,
    last_connected_at=1_000,
    failed_attempts=0,
)


def _row(**changes: object) -> RestoreRow:
    fields = {
        "cluster_id": "c",
        "node_id": "n",
        "restore_id": "r-1",
        "status": "staging",
        "revision": 3,
        "updated_at": 1_000,
        "age_seconds": 5,
        "progress": Progress(10, 100, "bytes", ObjectsProgress(1, 2)),
        "last_error_code": None,
        "last_error_message": None,
    }
    return RestoreRow(**(fields | changes))  # type: ignore[arg-type]


def test_a_value_of_another_type_reads_as_none() -> None:
    fields = Fields({"revision": "3", "state": 5, "since": "yesterday"})
    assert (fields.whole("revision"), fields.text("state"), fields.number("since")) == (
        None,
        None,
        None,
    )


def test_a_json_true_is_not_a_number() -> None:
    fields = Fields({"attempts": True, "since": False})
    assert (fields.whole("attempts"), fields.number("since"), fields.flag("attempts")) == (
        None,
        None,
        True,
    )


def test_something_that_is_not_an_object_reads_as_an_empty_one() -> None:
    fields = Fields(["not", "an", "object"])
    assert fields.entries() == []
    assert fields.record("anything") is None


def test_a_list_keeps_only_its_objects_or_its_strings() -> None:
    fields = Fields({"rows": [{"a": 1}, 2, "x", None], "types": ["database", 3, None]})
    assert len(fields.records("rows")) == 1
    assert fields.texts("types") == ("database",)


def test_the_session_reads_back_as_it_was_served() -> None:
    assert SessionDoc.from_wire(Fields(SESSION.to_wire())) == SESSION


def test_a_field_of_a_newer_agent_is_ignored() -> None:
    wire = SESSION.to_wire() | {"somethingNew": {"deep": [1, 2]}}
    assert SessionDoc.from_wire(Fields(wire)) == SESSION


def test_a_field_an_older_agent_did_not_serve_reads_as_none() -> None:
    session = SessionDoc.from_wire(Fields({"state": "connected"}))
    assert session.state == "connected"
    assert (session.unreachable_since, session.failed_attempts, session.cluster) == (
        None,
        None,
        None,
    )


def test_a_row_not_matched_with_the_transfers_has_no_transfer_key() -> None:
    assert "transfer" not in _row().to_wire()


def test_a_matched_row_with_nothing_under_way_says_null() -> None:
    assert _row(transfer=None).to_wire()["transfer"] is None


def test_a_row_reads_back_with_or_without_its_transfer() -> None:
    queued = _row(transfer=TransferDoc("stage", "queued", 1, 4))
    for row in (_row(), _row(transfer=None), queued):
        assert RestoreRow.from_wire(Fields(row.to_wire())) == row
    assert RestoreRow.from_wire(Fields(_row().to_wire())).transfer is UNMATCHED


def test_progress_in_resources_has_no_objects_key() -> None:
    assert Progress(1, 2, "resources").to_wire() == {"done": 1, "total": 2, "unit": "resources"}


def test_a_node_count_missing_reads_as_zero_and_counts_that_are_no_object_are_left_out() -> None:
    transfers = TransfersDoc.from_wire(Fields({"nodes": {"n1": {"moving": 2}, "n2": 3}}))
    assert transfers.nodes == {"n1": NodeCounts(moving=2, queued=0)}
    assert transfers.max_transfers_per_node is None


def test_the_combined_answers_pass_a_newer_agents_fields_through() -> None:
    ready = {"ready": True, "session": {"state": "connected", "new": 1}, "extra": 2}
    combined = StatusDocument.combine(ready, {"restores": []}, {"jobs": []}, None)
    assert combined["session"] == {"state": "connected", "new": 1}
    assert "extra" not in combined


def test_a_store_that_could_not_be_read_is_named_beside_its_rows() -> None:
    combined = StatusDocument.combine({}, {"error": "closed"}, {"jobs": []}, None)
    document = StatusDocument.from_wire(Fields(combined))
    assert (document.restores, document.restores_error, document.jobs_error) == ((), "closed", None)


def test_a_status_document_of_the_wrong_shape_reads_as_empty() -> None:
    document = StatusDocument.from_wire(Fields({"session": "connected", "restores": {"a": 1}}))
    assert document.session == SessionDoc.from_wire(Fields({}))
    assert (document.restores, document.ready, document.agent) == ((), None, None)
