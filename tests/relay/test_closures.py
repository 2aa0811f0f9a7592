"""The closure directions against the reference Corestore, with a Cloudly the test plays.

The job's own cancellation always wins: a closure that fails while the job is being cancelled
ends cancelled, whatever its call to Cloudly does while it winds down.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from agent.contracts.base import StreamMarker
from agent.corestore import CorestoreClient, CorestoreTimeouts
from agent.errors import IntegrityError
from agent.relay.closures import send_closure
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
        timeout: float,  # noqa: ASYNC109  # the fake's signature is the session's
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
            timeout=60,
            progress=lambda done, total: None,
        )
    )
    await cloudly.winding_down.wait()
    closure.cancel()
    cloudly.wound_down.set()
    await asyncio.wait({closure})
    assert closure.cancelled()
