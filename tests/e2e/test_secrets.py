"""No grant, token, bearer or JWT reaches the agent's logs, its error texts or its SQLite files."""

from __future__ import annotations

import asyncio
import io
from typing import Any

import pytest

from agent.contracts.isolatedrestore import METHOD_GET_STATUS
from agent.corestore.routes import RouteName
from agent.errors import CallFailed, SessionClosed
from agent.store import DB_NAME
from devstack.driver import GRANT_MARK, RestorePlan

KiB = 1024
VOLUME = "snap-vol/volume.img"


async def _refused(call: Any) -> CallFailed:
    with pytest.raises(CallFailed) as refused:
        await call
    return refused.value


async def test_no_secret_reaches_the_logs_the_errors_or_the_database(
    stack: Any, plan: RestorePlan, captured_logs: io.StringIO
) -> None:
    """A restore with refusals, Corestore faults, a dropped session and retries, logged at
    debug level: none of the secrets appears in the log output, an error text or SQLite."""
    driver = stack.driver(plan, retries=5)
    errors: list[CallFailed] = []
    async with stack.agent():
        await driver.prepare()
        malformed = f"{GRANT_MARK}-not-a-compact-jws"
        driver.issued_grants.append(malformed)
        body = {
            "restoreGrant": malformed,
            "clusterId": plan.cluster_id,
            "targetNodeName": plan.node,
            "restoreId": plan.restore_id,
        }
        errors.append(await _refused(stack.cloudly.call_agent(METHOD_GET_STATUS, body)))
        driver.retries = 0
        errors.append(await _refused(driver.stage(VOLUME, corrupt_at=100 * KiB)))
        stack.faults.fail_next(RouteName.PUT_CHUNK, status=503, times=2)
        errors.append(await _refused(driver.stage(VOLUME)))
        dropping = asyncio.Event()
        stack.on_hit(RouteName.PUT_CHUNK, stack.hits[RouteName.PUT_CHUNK] + 4, dropping.set)
        stage = asyncio.create_task(driver.stage(VOLUME))
        await dropping.wait()
        await stack.cloudly.drop_connections()
        with pytest.raises(SessionClosed):
            await stage
        driver.retries = 5
        await driver.stage_all()
        await driver.execute()
        await driver.wait_until({"ready", "failed"})
        await stack.clean_up(driver)
        assert (stack.state_dir / f"{DB_NAME}-wal").exists(), "expected a WAL to search"
        running_db = stack.database_bytes()
    logs = captured_logs.getvalue()
    assert [error.error_data["code"] for error in errors] == [
        "grant-invalid",
        "integrity-mismatch",
        "corestore-unavailable",
    ]
    assert "object_staged" in logs
    assert stack.cloudly.count("identity-issued") == 2, "the agent authenticated twice"
    assert stack.leaked(logs, driver) == []
    assert stack.leaked(" ".join(f"{e} {e.error_data}" for e in errors), driver) == []
    assert stack.leaked(running_db + stack.database_bytes(), driver) == []
