"""The closure directions against the reference Corestore, with a Cloudly the test plays.

The job's own cancellation always wins: a closure that fails while the job is being cancelled
ends cancelled, whatever its call to Cloudly does while it winds down. The import is keyed: a
commit whose answer was lost is confirmed by the import's state, never sent twice, and a run a
stopped agent left is reconciled by its keys (applied, or not: its open import dropped).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from agent.clock import SYSTEM_CLOCK
from agent.contracts.base import StreamMarker
from agent.contracts.relay import DatabaseClosureDescriptor
from agent.corestore import CorestoreClient, CorestoreTimeouts
from agent.corestore.routes import RouteName
from agent.domain.jobs import JobKey, StoredJob
from agent.domain.outcomes import ClosureFacts, JobReport, RestoreEffects, RunPlan, Succeeded
from agent.errors import IntegrityError
from agent.relay.closures import receive_closure, send_closure
from agent.relay.service import reconcile_restore
from agent.retry import Backoff, RetryPolicy
from agent.secret import Secret
from devstack.corestore import CorestoreHandle, start

BEARER = "closure-tests-bearer-5d1e"
SERVICE_ID, BACKUP_ID, NODE = "svc-1", "bk-1", "node-1"
DATABASE = hashlib.shake_256(b"closure tests").digest(100_000)


@pytest.fixture
async def corestore(tmp_path: Path) -> AsyncIterator[CorestoreHandle]:
    async with await start(data_dir=tmp_path / "corestore", bearer=BEARER) as handle:
        handle.services.write_database(SERVICE_ID, [DATABASE])
        yield handle


@pytest.fixture
async def client(corestore: CorestoreHandle) -> AsyncIterator[CorestoreClient]:
    async with CorestoreClient(
        corestore.url,
        Secret(BEARER),
        timeouts=CorestoreTimeouts(connect=5.0, control=5.0, transfer=5.0),
        retry=RetryPolicy(attempts=1, backoff=Backoff(base=0.1, cap=1.0, factor=2.0)),
    ) as opened:
        await opened.service_backup(SERVICE_ID, BACKUP_ID, service={"id": SERVICE_ID})
        yield opened


class _BrokenSink:
    """A sink whose first write fails: the transfer ends early."""

    async def write(self, data: bytes) -> None:
        raise IntegrityError("the test refused the bytes")

    async def close(self) -> None:
        raise AssertionError("never reached")

    async def abort(self) -> None:
        return None


class _SlowToCancel:
    """A Cloudly whose call, once cancelled, takes a while to wind down (as a call whose
    session is busy flushing does)."""

    def __init__(self) -> None:
        self.winding_down = asyncio.Event()
        self.wound_down = asyncio.Event()

    async def call(
        self,
        method: str,
        request: Mapping[str, Any],
        *,
        timeout: float | None,  # noqa: ASYNC109  # the fake's signature is the session's
    ) -> dict[str, Any]:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.winding_down.set()
            await self.wound_down.wait()
            raise
        raise AssertionError("never answered")

    def open_send_stream(self) -> tuple[StreamMarker, Any]:
        marker = StreamMarker(is_virtual_stream=True, stream_id="uni_test")
        return marker, _BrokenSink()

    def receive_stream(self, marker: StreamMarker) -> Any:
        raise AssertionError("a backup reads no stream")


async def test_a_backup_closure_cancelled_while_its_call_winds_down_ends_cancelled(
    client: CorestoreClient,
) -> None:
    """The transfer fails and its call to Cloudly is being cancelled when the job itself is
    cancelled (the agent stops): the closure ends cancelled, not with the transfer's error
    (which swallowed the job's cancellation)."""
    cloudly = _SlowToCancel()
    closure = asyncio.create_task(
        send_closure(
            client=client,
            cloudly=cloudly,
            service_id=SERVICE_ID,
            backup_id=BACKUP_ID,
            node_id=NODE,
            chunk_size=64 * 1024,
            answer_timeout=60,
            clock=SYSTEM_CLOCK,
            progress=lambda done, total: None,
        )
    )
    await cloudly.winding_down.wait()
    closure.cancel()
    cloudly.wound_down.set()
    await asyncio.wait({closure})
    assert closure.cancelled()


# --- the import under its key: a commit whose answer was lost, a run reconciled ----------------


class _Source:
    """The closure's bytes as Cloudly's stream (a `ByteSource`)."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self.closed = False

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._pieces()

    async def _pieces(self) -> AsyncIterator[bytes]:
        for offset in range(0, len(self._data), 30_000):
            yield self._data[offset : offset + 30_000]

    async def aclose(self) -> None:
        self.closed = True


class _ServingCloudly:
    """A Cloudly that serves the backup's closure as it holds it (the descriptor Corestore
    issued, and the bytes)."""

    def __init__(self, descriptor: dict[str, Any], data: bytes) -> None:
        self._descriptor, self._data = descriptor, data

    async def call(
        self,
        method: str,
        request: Mapping[str, Any],
        *,
        timeout: float | None,  # noqa: ASYNC109  # the fake's signature is the session's
    ) -> dict[str, Any]:
        marker = StreamMarker(is_virtual_stream=True, stream_id="uni_closure")
        return {"descriptor": self._descriptor, "closure": marker.to_wire()}

    def open_send_stream(self) -> tuple[StreamMarker, Any]:
        raise AssertionError("a restore sends no stream")

    def receive_stream(self, marker: StreamMarker) -> _Source:
        return _Source(self._data)


async def _receive(client: CorestoreClient, import_id: str) -> DatabaseClosureDescriptor:
    descriptor = await client.closure_descriptor(SERVICE_ID, BACKUP_ID)
    return await receive_closure(
        client=client,
        cloudly=_ServingCloudly(descriptor.to_wire(), DATABASE),
        service_id=SERVICE_ID,
        backup_id=BACKUP_ID,
        node_id=NODE,
        import_id=import_id,
        chunk_size=64 * 1024,
        answer_timeout=60,
        progress=lambda done, total: None,
    )


async def test_a_commit_whose_answer_was_lost_is_confirmed_by_the_imports_state(
    corestore: CorestoreHandle, client: CorestoreClient
) -> None:
    """Corestore commits and the connection drops before its answer: the commit is never sent
    twice; the import's state (`committed`, these bytes) says it happened, and the closure
    counts as imported, once."""
    corestore.services.write_database(SERVICE_ID, [b"before"])
    corestore.faults.reset_next(RouteName.CLOSURE_IMPORT_COMMIT, after=True)
    descriptor = await _receive(client, "closure-k1")
    assert descriptor.sha256 == hashlib.sha256(DATABASE).hexdigest()
    assert corestore.faults.hits[RouteName.CLOSURE_IMPORT_COMMIT] == 1
    assert corestore.services.applied_imports(SERVICE_ID) == 1
    assert corestore.services.database_path(SERVICE_ID).read_bytes() == DATABASE


def _left_running(effects: RestoreEffects) -> StoredJob:
    """A restore run a stopped agent left running, with its plan."""
    planned = Succeeded({"restored": [{"planned": True}]}, JobReport(resource_types=("database",)))
    key = JobKey("cluster-1", NODE, "restore", BACKUP_ID, SERVICE_ID, 1)
    return StoredJob(key, 1, "running", "a" * 64, None, 1, 0, 0, plan=RunPlan(effects, planned))


async def test_a_run_whose_import_was_committed_is_reconciled_as_applied(
    corestore: CorestoreHandle, client: CorestoreClient
) -> None:
    """Every effect applied under the run's keys: its planned outcome, with the closure as
    Corestore committed it."""
    await _receive(client, "closure-k1")
    outcome = await reconcile_restore(client, _left_running(RestoreEffects("closure-k1")))
    assert outcome is not None
    assert outcome.response == {"restored": [{"planned": True}]}
    assert outcome.report.closure == ClosureFacts(
        len(DATABASE), hashlib.sha256(DATABASE).hexdigest()
    )


async def test_a_run_whose_import_was_left_open_is_not_applied_and_its_import_is_dropped(
    corestore: CorestoreHandle, client: CorestoreClient
) -> None:
    """Killed mid-import: not applied, and the half-written import is gone (a resume imports
    the closure whole)."""
    descriptor = await client.closure_descriptor(SERVICE_ID, BACKUP_ID)
    await client.open_closure_import(
        "closure-k1", service_id=SERVICE_ID, backup_id=BACKUP_ID, descriptor=descriptor
    )
    outcome = await reconcile_restore(client, _left_running(RestoreEffects("closure-k1")))
    assert outcome is None
    assert corestore.services.open_imports() == []


async def test_a_run_whose_archive_restore_was_not_applied_is_not_applied(
    corestore: CorestoreHandle, client: CorestoreClient
) -> None:
    """The database committed, the archive restore not: not every effect applied."""
    await _receive(client, "closure-k1")
    run = _left_running(RestoreEffects("closure-k1", archive_restore="restore-k1"))
    assert await reconcile_restore(client, run) is None


async def test_an_import_committed_while_it_was_asked_is_not_aborted_but_applied(
    corestore: CorestoreHandle, client: CorestoreClient
) -> None:
    """Corestore answered the state before a commit in progress ended (404 here), and refuses
    the abort once committed: the run counts as applied, its key is kept."""
    await _receive(client, "closure-k1")
    corestore.faults.fail_next(RouteName.CLOSURE_IMPORT_STATUS, status=404, code="import-not-found")
    outcome = await reconcile_restore(client, _left_running(RestoreEffects("closure-k1")))
    assert outcome is not None
    assert corestore.services.committed_imports() == ["closure-k1"]
