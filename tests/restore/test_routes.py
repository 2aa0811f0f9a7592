"""The five routes through two real `Peer`s (in-memory transport): what Cloudly sees."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from agent.contracts.isolatedrestore import (
    METHOD_CLEANUP,
    METHOD_EXECUTE,
    METHOD_GET_STATUS,
    METHOD_PREPARE,
    METHOD_STAGE,
)
from agent.errors import CallFailed, InvalidRequest, SessionClosed
from agent.protocol.connection import ConnectionSettings, StreamSettings
from agent.protocol.handlers import Routes
from agent.restore.routes import isolated_restore_routes
from agent.session.peer import Peer
from tests.memory import transport_pair

FAST = ConnectionSettings(
    streams=StreamSettings(park_timeout=0.05, idle_timeout=2.0, probe_interval=0.005)
)


@asynccontextmanager
async def cloudly_and_agent(world: Any) -> AsyncIterator[Peer]:
    """A Cloudly-side peer connected to an agent-side peer serving the engine's routes."""
    routes = isolated_restore_routes(world.engine)
    ta, tb = transport_pair()
    cloudly, agent = Peer(ta, Routes(), settings=FAST), Peer(tb, routes, settings=FAST)
    runs = [asyncio.create_task(cloudly.run()), asyncio.create_task(agent.run())]
    try:
        yield cloudly
    finally:
        ta.close()
        for run in runs:
            with pytest.raises(SessionClosed):
                await run


async def _stage(cloudly: Peer, world: Any, path: str, revision: int) -> dict[str, Any]:
    """Stage `path` the way Cloudly does: a stream it sends, its marker in the request."""
    marker, sink = cloudly.open_send_stream()
    body = {**world.stage_body(path, revision), "archive": marker.to_wire()}
    call = asyncio.create_task(cloudly.call(METHOD_STAGE, body, timeout=10))
    data = world.objects[path]
    for start in range(0, len(data), 1000):
        await sink.write(data[start : start + 1000])
    await sink.close()
    state: dict[str, Any] = (await call)["state"]
    return state


async def test_a_whole_restore_through_the_session(world: Any) -> None:
    """prepare, stage x3 over VirtualStreams, execute, status until ready, cleanup, cleaned."""
    async with cloudly_and_agent(world) as cloudly:
        preparing = (await cloudly.call(METHOD_PREPARE, world.prepare_body(), timeout=10))["state"]
        assert (preparing["status"], preparing["revision"]) == ("preparing", 1)
        prepared = await world.settled("prepared", "failed")
        revision = prepared["revision"]
        for path in world.objects:
            revision = (await _stage(cloudly, world, path, revision))["revision"]
        for path, data in world.objects.items():
            staged = world.staged_file(path).read_bytes()
            assert hashlib.sha256(staged).digest() == hashlib.sha256(data).digest()
        executing = await cloudly.call(METHOD_EXECUTE, world.execute_body(revision), timeout=10)
        assert executing["state"]["status"] == "restoring"
        await world.until("ready", "failed")
        ready = await cloudly.call(METHOD_GET_STATUS, world.status_body(), timeout=10)
        assert ready["found"] is True
        assert ready["state"]["status"] == "ready"
        cleanup = world.cleanup_body(ready["state"]["revision"])
        assert (await cloudly.call(METHOD_CLEANUP, cleanup, timeout=10))["state"]["status"] == (
            "cleaning"
        )
        await world.until("cleaned", "cleanup-failed")
        final = await cloudly.call(METHOD_GET_STATUS, world.status_body(), timeout=10)
        assert final["state"]["status"] == "cleaned"


async def test_status_is_answered_while_a_stage_of_the_same_restore_streams(
    world: Any,
) -> None:
    """The stage waits for bytes; a status call on the same session is answered meanwhile."""
    async with cloudly_and_agent(world) as cloudly:
        await cloudly.call(METHOD_PREPARE, world.prepare_body(), timeout=10)
        prepared = await world.settled("prepared", "failed")
        path = "snap-db/dump.bson"
        marker, sink = cloudly.open_send_stream()
        body = {**world.stage_body(path, prepared["revision"]), "archive": marker.to_wire()}
        stage = asyncio.create_task(cloudly.call(METHOD_STAGE, body, timeout=10))
        data = world.objects[path]
        await sink.write(data[:1000])
        status = await cloudly.call(METHOD_GET_STATUS, world.status_body(), timeout=10)
        assert (status["state"]["status"], stage.done()) == ("prepared", False)
        await sink.write(data[1000:])
        await sink.close()
        assert (await stage)["state"]["status"] == "staging"


async def test_a_revision_conflict_reaches_cloudly_with_its_facts(world: Any) -> None:
    """error.data carries code, retryable, currentRevision and status."""
    async with cloudly_and_agent(world) as cloudly:
        await cloudly.call(METHOD_PREPARE, world.prepare_body(), timeout=10)
        await world.settled("prepared", "failed")
        with pytest.raises(CallFailed) as caught:
            await cloudly.call(METHOD_EXECUTE, world.execute_body(1), timeout=10)
    assert caught.value.error_data == {
        "code": "revision-conflict",
        "retryable": False,
        "currentRevision": 2,
        "status": "prepared",
    }


async def test_a_request_with_an_unknown_field_is_invalid_request_naming_it(
    world: Any,
) -> None:
    """Requests are exact: an extra field is refused, named, and nothing is written."""
    async with cloudly_and_agent(world) as cloudly:
        body = {**world.prepare_body(), "confirmEverything": True}
        with pytest.raises(CallFailed) as caught:
            await cloudly.call(METHOD_PREPARE, body, timeout=10)
    assert caught.value.error_data["code"] == "invalid-request"
    assert caught.value.error_data["field"] == "confirmEverything"
    assert await world.store.get(world.KEY) is None


async def test_snake_case_field_names_are_refused(world: Any) -> None:
    """Only the wire's camelCase names validate: a snake_case name is refused, named."""
    body = world.status_body()
    body["restore_id"] = body.pop("restoreId")
    with pytest.raises(InvalidRequest) as caught:
        await world.call(METHOD_GET_STATUS, body)
    assert caught.value.data["field"] == "restoreId"


async def test_a_grant_of_the_wrong_type_is_invalid_request_without_its_value(
    world: Any,
) -> None:
    """restoreGrant must be a string; the refusal names the field, never the value."""
    async with cloudly_and_agent(world) as cloudly:
        body = {**world.status_body(), "restoreGrant": {"leak": world.GRANT_MARK}}
        with pytest.raises(CallFailed) as caught:
            await cloudly.call(METHOD_GET_STATUS, body, timeout=10)
    assert caught.value.error_data["code"] == "invalid-request"
    assert caught.value.error_data["field"].startswith("restoreGrant")
    assert world.GRANT_MARK not in caught.value.text
