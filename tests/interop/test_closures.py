"""Database closures against the real typedrequest 3.3.0 (the Node stand-in Cloudly).

Relay -> Cloudly: the agent exports a closure from the reference Corestore and streams it on
`backupServiceDatabaseClosure`; the library's responder side receives it intact (Node reports
the sha256). Cloudly -> relay: a 3.3.0 responder cannot serve the stream in its
`restoreServiceDatabaseClosure` answer (no `read`); the agent fails fast and by name
(`stream-not-served`) with nothing imported.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from agent.clock import SYSTEM_CLOCK
from agent.corestore.client import CorestoreClient
from agent.corestore.service_models import ServiceBackupBody
from agent.errors import StreamNotServed
from agent.relay.closures import receive_closure, send_closure
from agent.secret import Secret
from devstack.corestore import CorestoreHandle, start
from tests.interop.conftest import AgentUnderTest

if TYPE_CHECKING:
    from tests.interop.conftest import NodeCloudly

pytestmark = pytest.mark.interop

BEARER = "interop-corestore-bearer"
SERVICE_ID, BACKUP_ID, NODE_ID = "svc-app", "bk-1", "node-1"
MiB = 2**20


@pytest.fixture
async def corestore(tmp_path: Path) -> AsyncIterator[CorestoreHandle]:
    handle = await start(data_dir=tmp_path / "corestore", bearer=BEARER)
    try:
        yield handle
    finally:
        await handle.stop()


def _backed_up(corestore: CorestoreHandle, database: bytes) -> None:
    services = corestore.services
    services.write_database(SERVICE_ID, [database])
    body = ServiceBackupBody.from_wire({"service": {"id": SERVICE_ID, "data": {}}})
    services.backup(SERVICE_ID, BACKUP_ID, body)


def _ignore(done: int, total: int) -> None:
    del done, total


@pytest.mark.parametrize("size", [0, 1, 3 * MiB + 1], ids=["0B", "1B", "3MiB+1"])
async def test_a_closure_sent_to_typedrequest_arrives_intact(
    cloudly: NodeCloudly, agent: AgentUnderTest, corestore: CorestoreHandle, size: int
) -> None:
    """The library's responder drains exactly the exported bytes (same length and sha256)."""
    database = hashlib.shake_256(b"interop closure").digest(size)
    _backed_up(corestore, database)
    async with agent.running(), CorestoreClient(corestore.url, Secret(BEARER)) as client:
        descriptor = await send_closure(
            client=client,
            cloudly=agent.session,
            service_id=SERVICE_ID,
            backup_id=BACKUP_ID,
            node_id=NODE_ID,
            chunk_size=MiB,
            answer_timeout=60.0,
            clock=SYSTEM_CLOCK,
            progress=_ignore,
        )
        events = await cloudly.wait_for("streams", 1)
    [stream] = events["streams"]
    assert stream["method"] == "backupServiceDatabaseClosure"
    assert (stream["status"], stream["bytes"]) == ("complete", size)
    assert stream["sha256"] == hashlib.sha256(database).hexdigest() == descriptor.sha256
    assert stream["meta"]["descriptor"]["sha256"] == descriptor.sha256


async def test_a_typedrequest_3_3_0_closure_stream_fails_fast_by_name_and_imports_nothing(
    cloudly: NodeCloudly, agent: AgentUnderTest, corestore: CorestoreHandle
) -> None:
    """3.3.0 echoes our `read`: `stream-not-served` well before the keep-alive timeout; the
    import is dropped and the database is as it was."""
    services = corestore.services
    services.write_database(SERVICE_ID, [b"before"])
    timeout = agent.config.streams.idle_timeout_s
    async with agent.running(), CorestoreClient(corestore.url, Secret(BEARER)) as client:
        started = SYSTEM_CLOCK.monotonic()
        with pytest.raises(StreamNotServed) as refused:
            await receive_closure(
                client=client,
                cloudly=agent.session,
                service_id=SERVICE_ID,
                backup_id=BACKUP_ID,
                node_id=NODE_ID,
                import_id="closure-interop",
                chunk_size=MiB,
                answer_timeout=60.0,
                progress=_ignore,
            )
        elapsed = SYSTEM_CLOCK.monotonic() - started
    error: Any = refused.value
    assert (error.code, error.retryable) == ("stream-not-served", False)
    assert "typedrequest 3.3.0" in str(error)
    assert elapsed < timeout / 2, f"took {elapsed:.1f} s, the keep-alive timeout is {timeout} s"
    assert services.database_path(SERVICE_ID).read_bytes() == b"before"
    assert services.open_imports() == []
