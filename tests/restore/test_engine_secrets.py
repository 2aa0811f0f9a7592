"""Neither a grant nor the Corestore bearer reaches a log event, an error text or SQLite."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import structlog

from agent.contracts.isolatedrestore import METHOD_PREPARE, METHOD_STAGE
from agent.corestore.routes import RouteName
from agent.errors import AgentError


def _database_bytes(directory: Path) -> bytes:
    files = sorted(path for path in directory.iterdir() if path.name.startswith("state.sqlite3"))
    assert any(path.name.endswith("-wal") for path in files), "expected a WAL file to search"
    return b"".join(path.read_bytes() for path in files)


async def _eventful_restore(world: Any, source_factory: Any) -> list[AgentError]:
    """A restore that fails, retries, resumes and cleans up; returns the errors it raised."""
    errors: list[AgentError] = []
    faults = world.corestore.faults

    async def expect_error(coro: Any) -> None:
        with pytest.raises(AgentError) as caught:
            await coro
        errors.append(caught.value)

    await expect_error(world.call(METHOD_PREPARE, world.prepare_body(restoreGrant="a.b")))
    prepared = await world.prepare()
    revision = prepared["revision"]
    path = "snap-db/dump.bson"
    faults.truncate_next(RouteName.PUT_CHUNK, drop_bytes=3)
    wrong = bytearray(world.objects[path])
    wrong[5] ^= 1
    await expect_error(
        world.call(METHOD_STAGE, world.stage_body(path, revision), source_factory(bytes(wrong)))
    )
    faults.fail_next(RouteName.PUT_CHUNK, status=503, times=2)
    await expect_error(world.stage(path, revision))
    revision = await world.stage_all(revision)
    await expect_error(world.execute(1))
    faults.fail_next(RouteName.VERIFY_RESOURCE, status=503, times=100)
    await world.execute(revision)
    failed = await world.until("ready", "failed")
    faults.clear()
    faults.fail_next(RouteName.DELETE_RESOURCE, status=500, times=100)
    await world.cleanup(failed.revision)
    cleanup_failed = await world.until("cleaned", "cleanup-failed")
    faults.clear()
    await world.cleanup(cleanup_failed.revision)
    await world.until("cleaned")
    return errors


async def test_no_grant_or_bearer_in_logs_errors_or_the_database(
    world: Any, source_factory: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Every grant handed out and the bearer are searched for in everything the agent kept."""
    caplog.set_level(logging.DEBUG)
    with structlog.testing.capture_logs() as events:
        errors = await _eventful_restore(world, source_factory)
        final = (await world.status())["state"]
    assert final["status"] == "cleaned"
    assert len(events) > 20
    assert len(errors) == 4

    secrets = [*world.issued, world.GRANT_MARK, world.BEARER]
    assert len(world.issued) > 10
    logs = repr(events) + "\n".join(record.getMessage() for record in caplog.records)
    texts = "\n".join(f"{error} {error.data!r}" for error in errors)
    kept = _database_bytes(world.state_dir)
    for secret in secrets:
        assert secret not in logs
        assert secret not in texts
        assert secret.encode() not in kept
    # The searches can fail: what the agent does keep is in there.
    assert "staging_progress" in logs
    assert "snap-db/dump.bson" in texts
    assert b"scratch-ns-1" in kept
