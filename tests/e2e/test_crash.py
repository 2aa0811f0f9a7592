"""Crash safety: the agent as a subprocess, SIGKILLed mid-way and restarted on its state.

After the restart the store opens, the status is a valid state whose revision never went back,
and Cloudly's repeated request (a fresh grant) converges to `ready`. Every wait is on something
observable (Corestore's hit counter, the stand-in's events, the status), never a sleep. The
agents' output and the SQLite files (killed mid-write, so with their -wal) hold no secret.
"""

from __future__ import annotations

import signal
from typing import Any

import pytest

from agent.contracts.isolatedrestore import IsolatedRestoreNodeState
from agent.corestore.routes import RouteName
from agent.credentials.keys import KEY_FILE
from agent.domain.restores import RestoreKey
from agent.errors import SessionClosed
from agent.store import DB_NAME, RevisionStore
from devstack.driver import RestorePlan

pytestmark = pytest.mark.slow

MiB = 1024 * 1024
VOLUME = "snap-vol/volume.img"
CHUNKS = 128  # 8 MiB in 64 KiB chunks


@pytest.fixture
def big_size() -> int:
    """An 8 MiB volume image: 128 chunks, plenty to be killed in the middle of."""
    return 8 * MiB


def _valid(state: dict[str, Any] | None) -> IsolatedRestoreNodeState:
    assert state is not None, "the restarted agent lost the restore"
    return IsolatedRestoreNodeState.from_wire(state)


async def _killed(agent: Any, stack: Any) -> bytes:
    """Wait for the SIGKILLed agent; the database files it left (a WAL among them)."""
    assert await agent.wait() == -signal.SIGKILL
    assert (stack.state_dir / f"{DB_NAME}-wal").exists(), "expected the WAL of a killed agent"
    return bytes(stack.database_bytes())


async def _stored(stack: Any, plan: RestorePlan) -> Any:
    async with await RevisionStore.open(stack.state_dir) as store:
        return await store.get(RestoreKey(plan.cluster_id, plan.node, plan.restore_id))


async def test_an_agent_killed_while_staging_resumes_the_object_after_a_restart(
    stack: Any, plan: RestorePlan
) -> None:
    """SIGKILL at Corestore's 20th chunk of the image: the restart shows `staging` at the same
    revision, the repeated stage resumes, and the restore reaches ready and cleaned."""
    driver = stack.driver(plan, retries=5, reconnect_timeout=30.0)
    first = await stack.spawn()
    await driver.prepare()
    for spec in driver.plan.objects:
        if spec.path != VOLUME:
            await driver.stage(spec)
    before_kill = driver.revision
    start = stack.hits[RouteName.PUT_CHUNK]
    stack.on_hit(RouteName.PUT_CHUNK, start + 20, first.kill)
    driver.retries = 0
    with pytest.raises(SessionClosed):
        await driver.stage(VOLUME)
    killed_db = await _killed(first, stack)

    second = await stack.spawn()
    driver.retries = 5
    restarted = _valid(await driver.status())
    before_re_stage = stack.hits[RouteName.PUT_CHUNK]
    staged = await driver.stage(VOLUME)
    re_sent = stack.hits[RouteName.PUT_CHUNK] - before_re_stage
    on_disk = stack.staged_digest(driver.plan, VOLUME)
    await driver.execute()
    ready = await driver.wait_until({"ready", "failed"})
    cleaned = await stack.clean_up(driver)
    assert await second.terminate() == 0

    assert (restarted.status, restarted.revision) == ("staging", before_kill)
    assert (staged["status"], staged["revision"]) == ("staging", before_kill + 1)
    assert re_sent <= CHUNKS - 19, "the re-stage skipped the chunks Corestore had verified"
    assert on_disk == driver.plan.object(VOLUME).sha256
    assert ready["status"] == "ready"
    assert cleaned["status"] == "cleaned"
    assert stack.leftovers() == []
    stored = await _stored(stack, driver.plan)
    assert (stored.status, stored.revision) == ("cleaned", cleaned["revision"])
    output = first.output() + second.output()
    assert "cloudly_connected" in output, "the agents' logs were captured"
    assert stack.leaked(output, driver) == []
    assert stack.leaked(killed_db + stack.database_bytes(), driver) == []


async def test_an_agent_killed_mid_stage_comes_back_with_its_key_and_enrollment(
    stack: Any, plan: RestorePlan
) -> None:
    """The bearer came sealed to the agent's key; after SIGKILL the restarted agent opens the
    same key file and enrollment (one recipient at Cloudly), fetches the bearer sealed again
    and finishes the stage."""
    driver = stack.driver(plan, retries=5, reconnect_timeout=30.0)
    first = await stack.spawn()
    await driver.prepare()
    stack.on_hit(RouteName.PUT_CHUNK, stack.hits[RouteName.PUT_CHUNK] + 5, first.kill)
    driver.retries = 0
    with pytest.raises(SessionClosed):
        await driver.stage(VOLUME)
    await _killed(first, stack)
    key_before = (stack.state_dir / KEY_FILE).read_bytes()
    sealed_before = stack.cloudly.count("credential-sealed")

    second = await stack.spawn()
    driver.retries = 5
    staged = await driver.stage(VOLUME)
    assert await second.terminate() == 0

    assert staged["status"] == "staging"
    assert stack.staged_digest(driver.plan, VOLUME) == driver.plan.object(VOLUME).sha256
    assert (stack.state_dir / KEY_FILE).read_bytes() == key_before
    assert len(stack.authority.recipients) == 1, "the restarted agent did not re-enroll"
    assert sealed_before >= 1
    assert stack.cloudly.count("credential-sealed") > sealed_before


async def test_an_agent_killed_during_execute_finishes_when_cloudly_repeats_execute(
    stack: Any, plan: RestorePlan
) -> None:
    """SIGKILL while Corestore holds the first resource restore: the restart shows `restoring`,
    the repeated execute (old expectedRevision, fresh grant) resumes it to ready."""
    driver = stack.driver(plan, retries=5, reconnect_timeout=30.0)
    first = await stack.spawn()
    await driver.prepare()
    await driver.stage_all()
    stack.faults.hold_restores()
    execute_at = driver.revision
    restoring = _valid(await driver.execute())
    await stack.wait_hits(RouteName.RESOURCE_STATUS, 1)  # the agent waits on the held restore
    first.kill()
    killed_db = await _killed(first, stack)

    second = await stack.spawn()
    restarted = _valid(await driver.status())
    repeated = _valid(await driver.execute(expected_revision=execute_at))
    stack.faults.release_restores()
    ready = await driver.wait_until({"ready", "failed"})
    cleaned = await stack.clean_up(driver)
    assert await second.terminate() == 0

    assert restoring.status == "restoring"
    assert restarted.status == "restoring"
    assert restarted.revision >= restoring.revision
    assert repeated.status in ("restoring", "verifying")
    assert repeated.revision >= restarted.revision
    assert ready["status"] == "ready", ready.get("lastErrorCode")
    assert ready["verification"]["status"] == "passed"
    assert ready["revision"] > repeated.revision
    assert cleaned["status"] == "cleaned"
    assert stack.leftovers() == []
    output = first.output() + second.output()
    assert "cloudly_connected" in output, "the agents' logs were captured"
    assert stack.leaked(output, driver) == []
    assert stack.leaked(killed_db + stack.database_bytes(), driver) == []
