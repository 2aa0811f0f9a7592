"""The relay duties under repeats, bad routing, bad bytes and stalls, through the real session.

Repeats: a backup's identical request joins the running job or answers the recorded result,
another body for the same key is `job-conflict`; every restore request runs, an identical one
joins a running restore and another is `restore-in-progress` until it ended. Stalls: a closure
stream Cloudly keeps alive without moving bytes fails the job, retryable, and the repeat runs
afresh. Bytes: a short, long or altered export is refused before
Cloudly holds anything; a truncated, over-long or altered stream from Cloudly is refused with
nothing committed. Partial restores are refused before a byte moves; `clear` reaches only the
types restored; a dry-run prune changes nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from agent.corestore.routes import RouteName
from agent.corestore.service_models import ServiceBackupBody
from agent.domain.outcomes import JobFailed
from agent.errors import CallFailed, SessionClosed
from agent.store import RevisionStore
from devstack.cloudly import ABSENT, Tamper, cluster_document

CLUSTER, NODE = "cluster-e2e", "node-e2e"
SERVICE_ID = "svc-app"
SERVICE = {"id": SERVICE_ID, "data": {"name": "app"}}
DATABASE = hashlib.shake_256(b"relay faults").digest(200_000)  # 4 chunks of 64 KiB (the last short)


def _request(backup_id: str = "bk-1", **extra: Any) -> dict[str, Any]:
    return {"nodeId": NODE, "backupId": backup_id, "service": SERVICE, **extra}


async def _backup(stack: Any, backup_id: str = "bk-1", **extra: Any) -> dict[str, Any]:
    return await stack.cloudly.call_agent("backupClusterService", _request(backup_id, **extra))


async def _restore(stack: Any, snapshots: list[Any], backup_id: str = "bk-1", **extra: Any) -> Any:
    body = _request(backup_id, snapshots=snapshots, **extra)
    return await stack.cloudly.call_agent("restoreClusterService", body)


async def _jobs(stack: Any, kind: str, backup_id: str = "bk-1") -> list[Any]:
    """The job rows of `kind` for `backup_id` (read once the agent stopped), a restore's in the
    order of their runs."""
    async with await RevisionStore.open(stack.state_dir) as store:
        jobs = [
            job
            for job in await store.list_jobs()
            if (job.key.kind, job.key.backup_id) == (kind, backup_id)
        ]
    return sorted(jobs, key=lambda job: job.key.run)


async def _job(stack: Any, kind: str, backup_id: str = "bk-1") -> Any:
    """The job row of `kind` for `backup_id`: a backup's, or a restore's latest run."""
    return (await _jobs(stack, kind, backup_id))[-1]


async def _refused(call: Any) -> dict[str, Any]:
    with pytest.raises(CallFailed) as refused:
        await call
    return refused.value.error_data


@pytest.fixture
def services(stack: Any) -> Any:
    """The reference Corestore's service data, the service's database written."""
    services = stack.corestore.services
    services.write_database(SERVICE_ID, [DATABASE])
    return services


async def test_a_repeated_backup_after_it_finished_answers_the_recorded_result(
    stack: Any, services: Any
) -> None:
    """The second identical request gets the same answer; Corestore backed up once and Cloudly
    received the closure once."""
    async with stack.agent():
        first = await _backup(stack)
        second = await _backup(stack)
    assert first == second
    assert stack.hits[RouteName.SERVICE_BACKUP] == 1
    assert stack.cloudly.count("closure-stored") == 1


async def test_an_identical_backup_while_it_runs_joins_it(
    stack: Any, services: Any, captured_logs: Any
) -> None:
    """A retry that arrives while the backup runs waits for the same job: one backup at
    Corestore, one closure at Cloudly, the same answer twice."""
    stack.faults.delay_next(RouteName.SERVICE_BACKUP, 0.5)
    async with stack.agent():
        first = asyncio.ensure_future(_backup(stack))
        await stack.wait_hits(RouteName.SERVICE_BACKUP, 1)
        second = await _backup(stack)
        assert await first == second
    assert stack.hits[RouteName.SERVICE_BACKUP] == 1
    assert stack.cloudly.count("closure-stored") == 1
    assert '"event": "relay_job_joined"' in captured_logs.getvalue()


async def test_the_same_key_with_another_body_is_a_named_conflict(
    stack: Any, services: Any
) -> None:
    """Same node, backupId and service with other tags: `job-conflict`, not retryable."""
    async with stack.agent():
        await _backup(stack)
        data = await _refused(_backup(stack, tags={"reason": "other"}))
    assert (data["code"], data["retryable"]) == ("job-conflict", False)
    assert stack.hits[RouteName.SERVICE_BACKUP] == 1


async def test_an_unknown_node_and_a_node_without_corestore_are_refused(stack: Any) -> None:
    """The codes of the isolated restore: `unknown-node`, `node-without-corestore` (retryable);
    Corestore hears nothing."""
    stack.cloudly.cluster = cluster_document(
        CLUSTER, {NODE: stack.corestore.url, "node-bare": ABSENT}
    )
    async with stack.agent():
        unknown = await _refused(
            stack.cloudly.call_agent("backupClusterService", {**_request(), "nodeId": "nope"})
        )
        bare = await _refused(
            stack.cloudly.call_agent(
                "pruneClusterNodeArchive", {"nodeId": "node-bare", "retention": {"keepLast": 1}}
            )
        )
    assert (unknown["code"], unknown["retryable"]) == ("unknown-node", False)
    assert (bare["code"], bare["retryable"]) == ("node-without-corestore", True)
    assert sum(stack.hits.values()) == 0


async def test_a_node_without_an_archive_is_found_false(stack: Any) -> None:
    """No archive on the node is a fact: `{found: false}`, no error."""
    async with stack.agent():
        answer = await stack.cloudly.call_agent(
            "pruneClusterNodeArchive", {"nodeId": NODE, "retention": {"keepLast": 1}}
        )
    assert answer == {"found": False}


def _files(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


async def test_a_dry_run_prune_changes_nothing_and_the_real_one_removes_what_it_named(
    stack: Any, services: Any
) -> None:
    """dryRun answers what it would free; every archive file is as before. The same prune
    without dryRun frees exactly that."""
    archive = stack.corestore.data_dir / "archive"
    prune = {"nodeId": NODE, "retention": {"keepLast": 1}}
    async with stack.agent():
        for backup_id in ("bk-1", "bk-2", "bk-3"):
            await _backup(stack, backup_id)
        before = _files(archive)
        dry = await stack.cloudly.call_agent("pruneClusterNodeArchive", {**prune, "dryRun": True})
        assert _files(archive) == before
        real = await stack.cloudly.call_agent("pruneClusterNodeArchive", prune)
    assert dry["found"] is True
    assert dry["result"]["dryRun"] is True
    assert real["result"]["freedBytes"] == dry["result"]["freedBytes"] > 0
    assert real["result"]["removed"] == dry["result"]["removed"]
    assert sorted({path.split("/")[1] for path in _files(archive)}) == ["bk-3"]


def _backup_then_alter(stack: Any, alteration: str) -> None:
    """Make backup bk-1 at Corestore with the body the agent sends, then alter its archived
    closure (the descriptor stays as recorded)."""
    services = stack.corestore.services
    services.backup(SERVICE_ID, "bk-1", ServiceBackupBody.from_wire({"service": SERVICE}))
    path = services.archived_closure(SERVICE_ID, "bk-1")
    data = path.read_bytes()
    altered = {
        "truncate": data[:-1],
        "extend": data + b"\x00",
        "corrupt": data[:100] + bytes([data[100] ^ 1]) + data[101:],
    }[alteration]
    path.write_bytes(altered)


@pytest.mark.parametrize("alteration", ["truncate", "extend", "corrupt"])
async def test_a_short_long_or_altered_export_fails_the_backup_and_cloudly_holds_nothing(
    stack: Any, services: Any, alteration: str
) -> None:
    """The archived closure no longer matches its descriptor: the backup fails
    `integrity-mismatch`, the stream never completes, Cloudly keeps nothing, and the job is
    recorded failed, not backed up."""
    _backup_then_alter(stack, alteration)
    async with stack.agent():
        data = await _refused(_backup(stack))
    assert (data["code"], data["retryable"]) == ("integrity-mismatch", True)
    assert stack.cloudly.closures == {}
    assert list((stack.tmp / "cloudly-closures").glob("*")) == []


@pytest.mark.parametrize("tamper", ["truncate", "extend", "corrupt"])
async def test_a_truncated_long_or_altered_closure_stream_commits_nothing(
    stack: Any, services: Any, tamper: Tamper
) -> None:
    """Cloudly serves other bytes than its descriptor: the restore fails `integrity-mismatch`,
    the import is aborted, the database is exactly as it was."""
    async with stack.agent():
        backup = await _backup(stack)
        services.write_database(SERVICE_ID, [b"the database as it is now"])
        stack.cloudly.tamper_next_closure(tamper)
        data = await _refused(_restore(stack, backup["snapshots"]))
    assert data["code"] == "integrity-mismatch"
    assert services.database_path(SERVICE_ID).read_bytes() == b"the database as it is now"
    assert services.open_imports() == []
    assert stack.hits[RouteName.CLOSURE_IMPORT_COMMIT] == 0


async def test_a_partial_restore_naming_an_uncaptured_type_is_refused_before_a_byte_moves(
    stack: Any, services: Any
) -> None:
    """An incomplete backup (its database binding uncaptured): a restore naming `database` is
    `partial-restore-refused`; Cloudly is not asked for a closure, Corestore restores nothing."""
    services.write_file(SERVICE_ID, "objectstorage", "a.txt", b"bucket a")
    uncaptured = {"type": "database", "bindingId": "db", "reason": "binding-not-snapshotted"}
    services.set_uncapturable(SERVICE_ID, [uncaptured])
    async with stack.agent():
        backup = await _backup(stack)
        data = await _refused(
            _restore(stack, backup["snapshots"], resourceTypes=["database", "objectstorage"])
        )
        unnamed = await _refused(_restore(stack, backup["snapshots"]))  # no resourceTypes
    assert (data["code"], data["retryable"]) == ("partial-restore-refused", False)
    assert unnamed["code"] == "partial-restore-refused"
    assert stack.cloudly.count("closure-served") == 0
    assert stack.hits[RouteName.SERVICE_RESTORE] == 0


async def test_a_partial_restore_restores_the_captured_types_and_says_so(
    stack: Any, services: Any, captured_logs: Any
) -> None:
    """The types the rule permits are restored; the agent reports them and `partial`."""
    services.write_file(SERVICE_ID, "objectstorage", "a.txt", b"bucket a")
    uncaptured = {"type": "volume", "mountPath": "/data", "reason": "volume-capture-unavailable"}
    services.set_uncapturable(SERVICE_ID, [uncaptured])
    async with stack.agent():
        backup = await _backup(stack)
        services.write_database(SERVICE_ID, [b"changed"])
        answer = await _restore(
            stack, backup["snapshots"], resourceTypes=["objectstorage", "database"]
        )
    assert [s["type"] for s in answer["restored"]] == ["database", "objectstorage"]
    assert services.database_path(SERVICE_ID).read_bytes() == DATABASE
    planned = [
        json.loads(line)
        for line in captured_logs.getvalue().splitlines()
        if '"relay_restore_planned"' in line
    ]
    assert [(p["resourceTypes"], p["partial"]) for p in planned] == [
        (["database", "objectstorage"], True)
    ]


async def test_clear_reaches_only_the_types_restored(stack: Any, services: Any) -> None:
    """resourceTypes [objectstorage] with clear: the bucket is exactly the snapshot again; the
    volume and the database, not asked for, are untouched."""
    services.write_file(SERVICE_ID, "objectstorage", "a.txt", b"bucket a")
    services.write_file(SERVICE_ID, "volume", "v.txt", b"volume v")
    async with stack.agent():
        backup = await _backup(stack)
        services.write_file(SERVICE_ID, "objectstorage", "new.txt", b"added later")
        services.write_file(SERVICE_ID, "volume", "new.txt", b"added later")
        services.write_database(SERVICE_ID, [b"changed"])
        answer = await _restore(
            stack, backup["snapshots"], resourceTypes=["objectstorage"], clear=True
        )
    assert [s["type"] for s in answer["restored"]] == ["objectstorage"]
    service_dir = services.service_dir(SERVICE_ID)
    assert sorted(p.name for p in (service_dir / "objectstorage").iterdir()) == ["a.txt"]
    assert sorted(p.name for p in (service_dir / "volume").iterdir()) == ["new.txt", "v.txt"]
    assert services.database_path(SERVICE_ID).read_bytes() == b"changed"
    assert stack.cloudly.count("closure-served") == 0


# A Cloudly that keeps a closure stream alive but moves no byte: the stall deadline is scaled
# down to 1.5 s (the default is 300 s); the test's own bound is far above it.
STALLING = {"stall_timeout_s": 1.5}
BIG = hashlib.shake_256(b"stalled closure").digest(2 * 1024 * 1024)  # 32 chunks, > the window


async def test_a_backup_whose_closure_cloudly_stops_reading_fails_and_the_repeat_runs_afresh(
    stack: Any, services: Any
) -> None:
    """Cloudly reads two chunks of the closure and then nothing (the window fills, keep-alives
    go on): the backup fails `transfer-interrupted`, retryable, once the stall deadline passed;
    the repeated request starts the job afresh and Cloudly then holds the closure intact."""
    services.write_database(SERVICE_ID, [BIG])
    stack.cloudly.stall_next_closure(2 * 64 * 1024)
    async with asyncio.timeout(30), stack.agent(streams=STALLING):
        data = await _refused(_backup(stack))
        answer = await _backup(stack)
    job = await _job(stack, "backup")
    assert (data["code"], data["retryable"]) == ("transfer-interrupted", True)
    assert stack.cloudly.count("closure-stalled") == 1
    assert stack.cloudly.count("closure-stored") == 1
    assert stack.cloudly.closure_bytes("bk-1", SERVICE_ID) == BIG
    assert [s["type"] for s in answer["snapshots"]] == ["database"]
    assert (job.status, job.attempts) == ("succeeded", 2)


async def test_a_restore_whose_closure_cloudly_stops_sending_aborts_the_import_and_runs_again(
    stack: Any, services: Any
) -> None:
    """Cloudly serves 1 MiB of the closure and then only keep-alives: the restore fails
    `transfer-interrupted`, retryable; the Corestore import is aborted and the database is as it
    was; the next request restores the closure whole."""
    services.write_database(SERVICE_ID, [BIG])
    async with asyncio.timeout(30), stack.agent(streams=STALLING):
        backup = await _backup(stack)
        services.write_database(SERVICE_ID, [b"the database as it is now"])
        stack.cloudly.stall_next_closure(1024 * 1024)
        data = await _refused(_restore(stack, backup["snapshots"]))
        during = services.database_path(SERVICE_ID).read_bytes()
        imports = services.open_imports()
        answer = await _restore(stack, backup["snapshots"])
    assert (data["code"], data["retryable"]) == ("transfer-interrupted", True)
    assert stack.cloudly.count("closure-stalled") == 1
    assert (during, imports) == (b"the database as it is now", [])
    assert answer == {"restored": backup["snapshots"]}
    assert services.database_path(SERVICE_ID).read_bytes() == BIG
    assert services.open_imports() == []


async def test_a_slow_export_is_bounded_by_its_progress_not_by_the_transfer_timeout(
    stack: Any, services: Any
) -> None:
    """Each export read takes 0.1 s (five of them), the bulk-request bound is 0.3 s: the backup
    succeeds. The closure call used to carry `transfer_timeout_s` as its deadline and failed
    `internal` ("got no reply within 0.3 s"): a bound on the whole closure, so a big enough one
    could never be backed up. One request is bounded by it; the closure by its progress."""
    stack.faults.delay_next(RouteName.CLOSURE_READ, 0.1, times=6)
    async with asyncio.timeout(30), stack.agent(transfer_timeout_s=0.3):
        answer = await _backup(stack)
    assert [s["type"] for s in answer["snapshots"]] == ["database"]
    assert stack.cloudly.closure_bytes("bk-1", SERVICE_ID) == DATABASE
    assert stack.faults.hits[RouteName.CLOSURE_READ] == 5  # four chunks and the probe at size


# --- every restore request runs (docs/relay.md, "Jobs and repeats") ---------------------------


async def test_the_same_restore_twice_restores_twice(
    stack: Any, services: Any, captured_logs: Any
) -> None:
    """A backup restored, the data changed, the identical restore sent again: it runs again
    (a second closure import, the bucket restored again) instead of answering the first
    run's `restored`."""
    services.write_file(SERVICE_ID, "objectstorage", "a.txt", b"bucket a")
    async with stack.agent():
        backup = await _backup(stack)
        first = await _restore(stack, backup["snapshots"])
        services.write_database(SERVICE_ID, [b"changed after the first restore"])
        services.write_file(SERVICE_ID, "objectstorage", "a.txt", b"changed too")
        second = await _restore(stack, backup["snapshots"])
    assert first == second == {"restored": backup["snapshots"]}
    assert services.database_path(SERVICE_ID).read_bytes() == DATABASE
    assert (services.service_dir(SERVICE_ID) / "objectstorage" / "a.txt").read_bytes() == (
        b"bucket a"
    )
    assert stack.cloudly.count("closure-served") == 2
    assert stack.hits[RouteName.SERVICE_RESTORE] == 2
    assert '"relay_job_replayed"' not in captured_logs.getvalue()
    runs = [(job.key.run, job.status) for job in await _jobs(stack, "restore")]
    assert runs == [(1, "succeeded"), (2, "succeeded")]


async def test_the_same_backup_restored_with_other_types_restores_what_each_names(
    stack: Any, services: Any
) -> None:
    """One backup, restored first for `database` only, then for `objectstorage` with `clear`:
    no `job-conflict`; each run touches exactly the types it names."""
    services.write_file(SERVICE_ID, "objectstorage", "a.txt", b"bucket a")
    async with stack.agent():
        backup = await _backup(stack)
        services.write_database(SERVICE_ID, [b"changed"])
        services.write_file(SERVICE_ID, "objectstorage", "new.txt", b"added later")
        database = await _restore(stack, backup["snapshots"], resourceTypes=["database"])
        database_then = services.database_path(SERVICE_ID).read_bytes()
        bucket_then = sorted(
            p.name for p in (services.service_dir(SERVICE_ID) / "objectstorage").iterdir()
        )
        services.write_database(SERVICE_ID, [b"changed again"])
        bucket = await _restore(
            stack, backup["snapshots"], resourceTypes=["objectstorage"], clear=True
        )
    assert [s["type"] for s in database["restored"]] == ["database"]
    assert (database_then, bucket_then) == (DATABASE, ["a.txt", "new.txt"])
    assert [s["type"] for s in bucket["restored"]] == ["objectstorage"]
    assert sorted(
        p.name for p in (services.service_dir(SERVICE_ID) / "objectstorage").iterdir()
    ) == ["a.txt"]
    assert services.database_path(SERVICE_ID).read_bytes() == b"changed again"


async def test_while_a_restore_runs_another_is_busy_and_the_identical_one_joins(
    stack: Any, services: Any, captured_logs: Any
) -> None:
    """While a restore of the service runs (Corestore slow to open its closure import), one
    with other `resourceTypes` is refused `restore-in-progress` (retryable) and changes
    nothing; the identical request joins the run: one import, the same answer twice."""
    services.write_file(SERVICE_ID, "objectstorage", "a.txt", b"bucket a")
    async with stack.agent():
        backup = await _backup(stack)
        stack.faults.delay_next(RouteName.CLOSURE_IMPORT, 1.0)
        first = asyncio.ensure_future(_restore(stack, backup["snapshots"]))
        await stack.wait_hits(RouteName.CLOSURE_IMPORT, 1)
        busy = await _refused(_restore(stack, backup["snapshots"], resourceTypes=["database"]))
        joined = await _restore(stack, backup["snapshots"])
        assert await first == joined
    assert (busy["code"], busy["retryable"]) == ("restore-in-progress", True)
    assert busy["run"] == 1
    assert stack.hits[RouteName.CLOSURE_IMPORT] == 1
    assert stack.cloudly.count("closure-served") == 1
    assert '"event": "relay_job_joined"' in captured_logs.getvalue()
    assert [job.key.run for job in await _jobs(stack, "restore")] == [1]


async def test_a_reconnect_between_a_closures_call_and_its_stream_fails_the_run_retryable(
    stack: Any, services: Any
) -> None:
    """Cloudly answered the closure call on one connection; while Corestore opens the import
    the session drops and the agent reconnects. The stream belongs to the first connection: the
    run fails `transfer-interrupted` (retryable) at once. It never asks the new connection for
    a stream it does not know (the run then hung until the stall deadline, or ended
    `stream-not-served`, not retryable). Cloudly's repeat, sent on the new connection, gets
    that outcome (it joins the run, or the run's answer was never delivered)."""
    async with stack.agent():
        backup = await _backup(stack)
        hold = stack.faults.hold_next(RouteName.CLOSURE_IMPORT)
        first = asyncio.ensure_future(_restore(stack, backup["snapshots"]))
        await hold.arrived.wait()
        await stack.cloudly.drop_connections()
        with pytest.raises(SessionClosed):
            await first
        await stack.cloudly.wait_for("cluster-config-read", 2)
        repeat = asyncio.ensure_future(_refused(_restore(stack, backup["snapshots"])))
        hold.release()
        async with asyncio.timeout(20):  # a guard: the run hung on the unknown stream
            data = await repeat
    job = await _job(stack, "restore")
    assert (data["code"], data["retryable"]) == ("transfer-interrupted", True)
    assert (job.key.run, job.status, job.result) == (
        1,
        "failed",
        JobFailed("transfer-interrupted", job.result.message, retryable=True),
    )
    assert stack.cloudly.count("closure-served") == 1
