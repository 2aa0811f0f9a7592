"""What an operator sees: readiness reasons (pure) and restore rows, and their rendering."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from agent.contracts.isolatedrestore import (
    CleanupProgress,
    ResourceCleanupProgress,
    ResourceVerification,
    StagingCleanupProgress,
)
from agent.domain.jobs import JobKey, StoredJob
from agent.domain.outcomes import result_from_json
from agent.domain.restores import StoredState
from agent.transfers.limits import NodeLimits, TransferView
from agent.watch.overview import (
    RestoreFacts,
    job_rows,
    readiness,
    restore_row,
    transfers_body,
    with_transfers,
)
from agent.watch.status import ClusterSummary, NodeSummary, SessionState, StatusSnapshot
from agent.watch.statusview import render
from tests.store.states import KEY, node_state

NOW = 1_000_000.0
CLUSTER = ClusterSummary(
    "cluster-1", (NodeSummary("node-1", "http://10.0.0.1:3000", ()),), published_at=NOW - 60
)
CONNECTED = StatusSnapshot(
    state=SessionState.CONNECTED,
    state_since=NOW - 100,
    connected_since=NOW - 100,
    reconnect_count=0,
    last_error=None,
    last_error_at=None,
    cluster=CLUSTER,
    in_flight=0,
    identity_expires_at_ms=None,
    last_pong_at=NOW - 5,
    pong_latency=0.002,
)


def _ready(snapshot: StatusSnapshot, *, store_open: bool = True) -> dict[str, str]:
    return readiness(snapshot, store_open=store_open, now=NOW, stale_after=40.0)


def test_connected_with_a_recent_pong_an_open_store_and_a_usable_cluster_is_ready() -> None:
    """No reason at all: ready."""
    assert _ready(CONNECTED) == {}


def test_a_session_that_is_not_connected_names_its_state_and_last_error() -> None:
    """The `session` reason says the state and why the last attempt failed."""
    lost = replace(
        CONNECTED, state=SessionState.BACKING_OFF, connected_since=None, last_error="refused"
    )
    assert _ready(lost) == {"session": "the Cloudly session is backing-off (last error: refused)"}


def test_a_connection_silent_for_too_long_is_not_ready() -> None:
    """Connected, but neither a pong nor the authentication within `stale_after`: `keepalive`."""
    silent = replace(CONNECTED, connected_since=NOW - 300, last_pong_at=NOW - 41)
    assert _ready(silent) == {
        "keepalive": "Cloudly answered no keepalive ping for 41 s (allowed 40 s)"
    }


def test_a_fresh_connection_counts_until_its_first_pong() -> None:
    """Authentication proves the connection alive: no pong yet is fine for `stale_after`."""
    assert _ready(replace(CONNECTED, connected_since=NOW - 10, last_pong_at=None)) == {}


def test_a_closed_store_and_no_cluster_are_reasons_of_their_own() -> None:
    """`store` and `cluster` are reported next to each other, each under its key."""
    assert _ready(replace(CONNECTED, cluster=None), store_open=False) == {
        "store": "the revision store is not open",
        "cluster": "no cluster document has been read",
    }


def _stored(status: str, **changes: Any) -> StoredState:
    return StoredState(
        key=KEY,
        revision=4,
        status=status,  # type: ignore[arg-type]
        state=node_state(status=status, revision=4, **changes),
        mutation_digest=None,
        updated_at=int(NOW * 1000) - 90_500,
    )


ONE_MAPPING = RestoreFacts(mappings=1)


def test_a_row_names_the_key_status_revision_and_age() -> None:
    """Age is whole seconds since the last change; a finished state has no progress."""
    row = restore_row(_stored("ready"), ONE_MAPPING, now_ms=int(NOW * 1000))
    assert row == {
        "clusterId": "cluster-1",
        "nodeId": "node-1",
        "restoreId": "restore-1",
        "status": "ready",
        "revision": 4,
        "updatedAt": int(NOW * 1000) - 90_500,
        "ageSeconds": 90,
        "progress": None,
        "lastErrorCode": None,
        "lastErrorMessage": None,
    }


def test_staging_progress_is_bytes_of_the_manifest() -> None:
    """While staging: bytes Corestore accepted of the manifest's total, and objects written."""
    facts = RestoreFacts(
        mappings=1, objects=3, total_bytes=9000, chunk_bytes=4096, written_objects=1
    )
    row = restore_row(_stored("staging"), facts, now_ms=int(NOW * 1000))
    assert row["progress"] == {
        "done": 4096,
        "total": 9000,
        "unit": "bytes",
        "objects": {"done": 1, "total": 3},
    }


@pytest.mark.parametrize(
    ("status", "changes", "done"),
    [
        ("restoring", {"completed_resource_mapping_ids": ["map-1"]}, 1),
        (
            "verifying",
            {
                "verification": {
                    "status": "running",
                    "results": [
                        ResourceVerification(
                            resource_mapping_id="map-1",
                            resource_type="volume",
                            status="passed",
                            checks=[],
                        )
                    ],
                }
            },
            1,
        ),
    ],
)
def test_restore_and_verification_progress_count_resource_mappings(
    status: str, changes: dict[str, Any], done: int
) -> None:
    """Restoring counts completed mappings, verifying counts checked ones, of all mappings."""
    if "verification" in changes:
        base = node_state()
        changes = {"verification": base.verification.model_copy(update=changes["verification"])}
    row = restore_row(_stored(status, **changes), ONE_MAPPING, now_ms=int(NOW * 1000))
    assert row["progress"] == {"done": done, "total": 1, "unit": "resources"}


def test_cleanup_progress_counts_finished_resources() -> None:
    """Cleaning counts resources whose cleanup succeeded or failed."""
    cleanup = CleanupProgress(
        resources=[
            ResourceCleanupProgress(
                resource_mapping_id="map-1", resource_type="volume", status="succeeded", attempts=1
            ),
            ResourceCleanupProgress(
                resource_mapping_id="map-2", resource_type="volume", status="running", attempts=1
            ),
        ],
        staging_archive=StagingCleanupProgress(
            staging_archive_id="staging-1", status="pending", attempts=0
        ),
    )
    row = restore_row(_stored("cleaning", cleanup=cleanup), ONE_MAPPING, now_ms=int(NOW * 1000))
    assert row["progress"] == {"done": 1, "total": 2, "unit": "resources"}


def test_the_status_table_shows_readiness_reasons_and_one_line_per_restore() -> None:
    """Not ready: each reason on its own line; the table aligns key, status, revision,
    progress and age."""
    data = {
        "ready": False,
        "reasons": {"session": "the Cloudly session is backing-off (last error: refused)"},
        "session": {
            "state": "backing-off",
            "stateSince": int((NOW - 30) * 1000),
            "lastError": "refused",
        },
        "restores": [
            {
                "clusterId": "c",
                "nodeId": "n",
                "restoreId": "r-1",
                "status": "staging",
                "revision": 12,
                "ageSeconds": 5,
                "progress": {"done": 2_500_000, "total": 10_000_000, "unit": "bytes"},
            },
            {
                "clusterId": "c",
                "nodeId": "n",
                "restoreId": "r-0",
                "status": "cleaned",
                "revision": 9,
                "ageSeconds": 3 * 86400,
                "progress": None,
            },
        ],
    }
    assert render(data, now_ms=int(NOW * 1000)) == (
        "agent:    not ready\n"
        "          session: the Cloudly session is backing-off (last error: refused)\n"
        "session:  backing-off for 30 s, last error: refused\n"
        "restores: 2\n"
        "\n"
        "CLUSTER/NODE/RESTORE  STATUS   REVISION  PROGRESS               AGE\n"
        "c/n/r-1               staging        12  25% 2.5 MB of 10.0 MB  5 s\n"
        "c/n/r-0               cleaned         9  -                      3 d\n"
        "\n"
        "jobs:     0\n"
    )


def test_the_status_table_with_nothing_to_list_has_no_header() -> None:
    """Nothing to list: each count says 0 and no empty table follows."""
    data = {"ready": True, "reasons": {}, "session": {"state": "connected"}}
    assert render(data | {"restores": [], "jobs": []}, now_ms=int(NOW * 1000)) == (
        "agent:    ready\nsession:  connected\nrestores: 0\n\njobs:     0\n"
    )


def test_the_status_text_lists_every_relay_job() -> None:
    """Relay jobs get their own table: key, kind, service, status, revision, attempts, age,
    and what the job ended with (the types a restore restored, or the error code)."""
    restored = {
        "clusterId": "c",
        "nodeId": "n",
        "backupId": "bk-2",
        "kind": "restore",
        "serviceId": "svc-1",
        "status": "succeeded",
        "revision": 3,
        "attempts": 1,
        "ageSeconds": 4,
        "resourceTypes": ["database", "volume"],
        "partial": True,
    }
    failed = restored | {
        "backupId": "bk-1",
        "kind": "backup",
        "status": "failed",
        "revision": 12,
        "attempts": 3,
        "ageSeconds": 600,
        "resourceTypes": None,
        "partial": False,
        "errorCode": "corestore-unavailable",
    }
    data = {"ready": True, "reasons": {}, "session": {"state": "connected"}, "restores": []}
    text = render(data | {"jobs": [restored, failed]}, now_ms=int(NOW * 1000))
    assert text.endswith(
        "jobs:     2\n"
        "\n"
        "CLUSTER/NODE/BACKUP  KIND     SERVICE  STATUS     REVISION  ATTEMPTS  AGE     RESULT\n"
        "c/n/bk-2             restore  svc-1    succeeded         3         1  4 s     "
        "database, volume (partial)\n"
        "c/n/bk-1             backup   svc-1    failed           12         3  10 min  "
        "corestore-unavailable\n"
    )


def test_an_unreadable_job_list_is_said_so() -> None:
    """The store could not be read for the jobs: the count is "unknown" with the reason."""
    data = {"ready": True, "reasons": {}, "session": {"state": "connected"}, "restores": []}
    text = render(data | {"jobsError": "the revision store is not open"}, now_ms=0)
    assert text.endswith("jobs:     unknown (the revision store is not open)\n")


# --- relay job rows ------------------------------------------------------------------------------


def _job(status: str, result: dict[str, Any] | None, delivered_at: int | None = None) -> StoredJob:
    key = JobKey("cluster-1", "node-1", "restore", "bk-1", "svc-1", run=4)
    outcome = None if result is None else result_from_json(result)
    return StoredJob(
        key,
        3,
        status,
        "d" * 64,
        outcome,
        2,
        1_000_000,
        1_010_000,
        delivered_at=delivered_at,  # type: ignore[arg-type]
    )


def test_a_partial_restore_row_names_its_types_and_says_partial() -> None:
    """A finished restore's row carries its run number, the types it restored and
    `partial: true`."""
    recorded = {
        "response": {"restored": []},
        "report": {"resourceTypes": ["database"], "partial": True},
    }
    [row] = job_rows([_job("succeeded", recorded, delivered_at=1_020_000)], now_ms=1_070_000)
    assert row == {
        "clusterId": "cluster-1",
        "nodeId": "node-1",
        "kind": "restore",
        "backupId": "bk-1",
        "serviceId": "svc-1",
        "run": 4,
        "status": "succeeded",
        "revision": 3,
        "attempts": 2,
        "updatedAt": 1_010_000,
        "ageSeconds": 60,
        "resourceTypes": ["database"],
        "partial": True,
        "errorCode": None,
        "errorMessage": None,
        "delivered": True,
    }


def test_a_failed_job_row_names_its_error() -> None:
    """A failed job's row carries the recorded error code and message, no types."""
    recorded = {"error": {"code": "integrity-mismatch", "message": "short", "retryable": True}}
    [row] = job_rows([_job("failed", recorded)], now_ms=1_010_000)
    assert (row["status"], row["errorCode"], row["errorMessage"]) == (
        "failed",
        "integrity-mismatch",
        "short",
    )
    assert (row["resourceTypes"], row["partial"], row["delivered"]) == (None, False, False)


def _view(*asks: tuple[str, tuple[str, ...]], limit: int = 1) -> TransferView:
    """A transfer view after `asks` (node, subject) at times 0, 1, 2, ..., taken at 10."""
    limits = NodeLimits(limit)
    for second, (node, subject) in enumerate(asks):
        limits.ask(node, "stage", subject, float(second))
    return limits.view(10.0)


def test_a_row_carries_its_transfer_while_it_moves_or_waits_and_null_otherwise() -> None:
    """A restore row whose stage moves or waits says so (kind, state, place, seconds); a row
    with nothing under way says null."""
    view = _view(("n", ("restore", "c", "n", "r-1")), ("n", ("restore", "c", "n", "r-2")))
    rows = [{"clusterId": "c", "nodeId": "n", "restoreId": r} for r in ("r-1", "r-2", "r-3")]
    assert [row["transfer"] for row in with_transfers(rows, view)] == [
        {"kind": "stage", "state": "moving", "position": None, "seconds": 10},
        {"kind": "stage", "state": "queued", "position": 1, "seconds": 9},
        None,
    ]


def test_a_job_row_matches_its_transfer_by_the_whole_job_key() -> None:
    """A relay job's closure transfer is found by cluster, node, kind, backup, service, run."""
    view = _view(("n", ("job", "c", "n", "restore", "b", "s", "2")))
    rows = [
        {"clusterId": "c", "nodeId": "n", "kind": "restore", "backupId": "b", "serviceId": "s",
         "run": run}
        for run in (1, 2)
    ]  # fmt: skip
    assert [row["transfer"] is None for row in with_transfers(rows, view)] == [True, False]


def test_the_transfers_body_gives_the_limits_each_nodes_counts_and_every_transfer() -> None:
    """`/v1/transfers`: per node the moving ones first, then its queue in order."""
    view = _view(
        ("n1", ("restore", "c", "n1", "r-1")),
        ("n1", ("restore", "c", "n1", "r-2")),
        ("n2", ("job", "c", "n2", "backup", "b", "s", "0")),
    )
    body = transfers_body(view)
    assert body["maxTransfersPerNode"] == 1
    assert body["maxBytesPerSecondPerNode"] is None
    assert body["nodes"] == {"n1": {"moving": 1, "queued": 1}, "n2": {"moving": 1, "queued": 0}}
    assert [(t["nodeId"], t["for"], t["state"]) for t in body["transfers"]] == [
        ("n1", "c n1 r-1", "moving"),
        ("n1", "c n1 r-2", "queued"),
        ("n2", "c n2 backup b s 0", "moving"),
    ]


def test_the_status_text_says_which_rows_wait_for_their_node() -> None:
    """A queued row shows its place after its status; a transfers line sums up each node."""
    data = {
        "ready": True,
        "reasons": {},
        "session": {"state": "connected"},
        "transfers": {"maxTransfersPerNode": 2, "nodes": {"n": {"moving": 2, "queued": 1}}},
        "restores": [
            {
                "clusterId": "c",
                "nodeId": "n",
                "restoreId": "r-1",
                "status": "prepared",
                "revision": 2,
                "ageSeconds": 1,
                "progress": None,
                "transfer": {"kind": "stage", "state": "queued", "position": 1, "seconds": 1},
            }
        ],
        "jobs": [],
    }
    text = render(data, now_ms=int(NOW * 1000))
    assert "transfers: n 2 moving, 1 queued (at most 2 per node)\n" in text
    assert "c/n/r-1               prepared (queued 1)         2  -         1 s\n" in text
