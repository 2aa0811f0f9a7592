"""The restore plan: which snapshots a restore restores, in which order, and the partial-restore
rule of seed 002 applied to Corestore's record of the backup."""

from __future__ import annotations

from typing import Any

import pytest

from agent.contracts.cluster import read_cluster_view
from agent.contracts.relay import RestoreClusterServiceRequest
from agent.corestore.service_models import ServiceBackupRecord
from agent.domain.outcomes import JobReport
from agent.errors import InvalidRequest, NodeWithoutCorestore, PartialRestoreRefused
from agent.relay.plan import locate_node, plan_restore

SNAPSHOTS = {
    "database": {"type": "database", "snapshotId": "bk.database", "size": 3},
    "objectstorage": {"type": "objectstorage", "snapshotId": "bk.objectstorage", "size": 5},
    "volume": {"type": "volume", "snapshotId": "bk.volume", "size": 7},
}
MISSED_VOLUME = {"type": "volume", "mountPath": "/data", "reason": "volume-capture-unavailable"}
MISSED_DATABASE = {"type": "database", "bindingId": "b1", "reason": "binding-not-snapshotted"}
MISSED_BUCKET = {"type": "objectstorage", "bindingId": "b2", "reason": "binding-not-snapshotted"}


def _record(types: list[str], uncaptured: list[dict[str, Any]]) -> ServiceBackupRecord:
    return ServiceBackupRecord.from_wire(
        {
            "serviceId": "svc",
            "backupId": "bk",
            "createdAt": 1,
            "snapshots": [SNAPSHOTS[t] for t in types],
            "uncaptured": uncaptured,
        }
    )


def _request(types: list[str], resource_types: list[str] | None, **extra: Any) -> Any:
    body: dict[str, Any] = {
        "nodeId": "n1",
        "backupId": "bk",
        "service": {"id": "svc", "data": {}},
        "snapshots": [SNAPSHOTS[t] for t in types],
        **extra,
    }
    if resource_types is not None:
        body["resourceTypes"] = resource_types
    return RestoreClusterServiceRequest.from_wire(body)


ALL = ["database", "objectstorage", "volume"]

# (name, snapshot types held and asked for, uncaptured, resourceTypes, restored types | refused)
CASES: list[tuple[str, list[str], list[dict[str, Any]], list[str] | None, list[str] | None]] = [
    ("a complete backup restores every snapshot", ALL, [], None, ALL),
    ("a complete backup restores only the types asked", ALL, [], ["volume"], ["volume"]),
    (
        "an uncaptured volume permits database and object storage",
        ALL,
        [MISSED_VOLUME],
        ["database", "objectstorage"],
        ["database", "objectstorage"],
    ),
    (
        "a partial restore may name a subset of the permitted types",
        ALL,
        [MISSED_VOLUME],
        ["objectstorage"],
        ["objectstorage"],
    ),
    ("a partial restore never restores a volume snapshot", ALL, [MISSED_VOLUME], ["volume"], None),
    (
        "an uncaptured database binding excludes database",
        ALL,
        [MISSED_DATABASE],
        ["database"],
        None,
    ),
    (
        "an uncaptured database binding still permits object storage",
        ALL,
        [MISSED_DATABASE],
        ["objectstorage"],
        ["objectstorage"],
    ),
    (
        "nothing captured, nothing permitted",
        ALL,
        [MISSED_DATABASE, MISSED_BUCKET],
        ["database"],
        None,
    ),
    ("an incomplete backup needs resourceTypes", ALL, [MISSED_VOLUME], None, None),
    ("an incomplete backup needs a type named", ALL, [MISSED_VOLUME], [], None),
    (
        "a type the backup holds no snapshot of is not permitted",
        ["database"],
        [MISSED_VOLUME],
        ["objectstorage"],
        None,
    ),
]


@pytest.mark.parametrize(
    ("types", "uncaptured", "asked", "expected"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_the_partial_restore_rule_table(
    types: list[str],
    uncaptured: list[dict[str, Any]],
    asked: list[str] | None,
    expected: list[str] | None,
) -> None:
    """Each row restores exactly its types, or is refused `partial-restore-refused`."""
    request, record = _request(types, asked), _record(types, uncaptured)
    if expected is None:
        with pytest.raises(PartialRestoreRefused):
            plan_restore(request, record)
        return
    plan = plan_restore(request, record)
    assert [s.type for s in plan.snapshots] == expected
    assert plan.partial is bool(uncaptured)


def test_a_partial_restore_reports_its_types_and_that_it_was_partial() -> None:
    """The recorded report of a partial restore names its types and `partial: true`."""
    plan = plan_restore(_request(ALL, ["objectstorage", "database"]), _record(ALL, [MISSED_VOLUME]))
    assert plan.report() == JobReport(resource_types=("database", "objectstorage"), partial=True)


def test_a_full_restore_reports_no_partial_flag() -> None:
    """A restore of a complete backup reports its types only."""
    report = plan_restore(_request(ALL, None), _record(ALL, [])).report()
    assert report.to_json() == {"resourceTypes": ["database", "objectstorage", "volume"]}


def test_snapshots_restore_database_first_then_object_storage_then_volume() -> None:
    """The order is by type, whatever order the request lists them in."""
    request = _request(["volume", "objectstorage", "database"], None)
    plan = plan_restore(request, _record(ALL, []))
    assert [s.snapshot_id for s in plan.snapshots] == [
        "bk.database",
        "bk.objectstorage",
        "bk.volume",
    ]


def test_a_snapshot_the_record_does_not_hold_is_refused_naming_it() -> None:
    """A request snapshot equal to none of the record's is `invalid-request` at its index."""
    body = _request(ALL, None).to_wire()
    body["snapshots"][1]["size"] = 6
    with pytest.raises(InvalidRequest) as raised:
        plan_restore(RestoreClusterServiceRequest.from_wire(body), _record(ALL, []))
    assert raised.value.data == {"field": "snapshots[1]"}


def test_a_snapshot_named_twice_is_refused() -> None:
    """The same snapshot twice in one request is `invalid-request`."""
    with pytest.raises(InvalidRequest):
        plan_restore(_request(["database", "database"], None), _record(ALL, []))


def test_clear_is_carried_into_the_plan() -> None:
    """`clear` reaches the plan (and so only the snapshots it restores)."""
    assert plan_restore(_request(ALL, None, clear=True), _record(ALL, [])).clear is True


def test_no_cluster_document_yet_is_a_retryable_routing_refusal() -> None:
    """Without a cluster view the node cannot be located: `node-without-corestore`."""
    with pytest.raises(NodeWithoutCorestore) as raised:
        locate_node(None, "n1")
    assert raised.value.retryable is True


def test_a_node_is_located_in_the_sessions_cluster() -> None:
    """`locate_node` answers the view's cluster id and the node's endpoint."""
    node = {"id": "n1", "data": {"corestore": {"endpoint": "http://10.0.0.1:3000"}}}
    view = read_cluster_view({"id": "c1", "data": {"nodes": [node]}})
    assert locate_node(view, "n1") == ("c1", "http://10.0.0.1:3000")
