"""A restore whose work ended `failed` for a reason that may pass resumes on Cloudly's exact
replay of the request that started the work; one that failed for good is answered as it is.

The clients give up after two sends here (`CLIENT_RETRY`, no outage tolerance), so a short 503
storm ends the work `corestore-unavailable`; the clock moves through every backoff at once.
"""

from __future__ import annotations

from typing import Any

from agent.contracts.isolatedrestore import METHOD_EXECUTE, METHOD_PREPARE
from agent.corestore.routes import RouteName
from agent.domain.restores import StoredState


async def test_an_exact_execute_replay_resumes_a_restore_failed_for_an_unavailable_corestore(
    world: Any,
) -> None:
    """The resource-status polls meet a Corestore that stays away past the client's patience:
    `failed`, `corestore-unavailable`. Cloudly's exact replay of the execute (a fresh grant)
    moves it back to `restoring` without the old error, and the work finishes `ready`; the
    mapping already restored is not restored again."""
    revision = await world.ready_to_execute()
    faults = world.corestore.faults

    def away_after_the_first_mapping(stored: StoredState) -> None:
        # Once, as the first mapping is recorded: the next mapping's polls meet the outage.
        if stored.status == "restoring" and stored.state.completed_resource_mapping_ids == [
            "map-db"
        ]:
            faults.fail_next(RouteName.RESOURCE_STATUS, status=503, times=2)

    remove = world.engine.observe(away_after_the_first_mapping)
    body = world.execute_body(revision)
    await world.call(METHOD_EXECUTE, body)
    failed = await world.settled("ready", "failed")
    remove()
    assert (failed["status"], failed["lastErrorCode"]) == ("failed", "corestore-unavailable")
    assert failed["completedResourceMappingIds"] == ["map-db"]

    restores = faults.hits[RouteName.RESTORE_RESOURCE]
    answer = (await world.call(METHOD_EXECUTE, {**body, "restoreGrant": world.grant()}))["state"]
    assert answer["status"] == "restoring"
    assert answer["revision"] == failed["revision"] + 1
    assert "lastErrorCode" not in answer
    assert (await world.until("ready", "failed")).status == "ready"
    assert faults.hits[RouteName.RESTORE_RESOURCE] - restores == 1  # the one not restored yet


async def test_a_verification_that_met_an_unavailable_corestore_resumes_too(world: Any) -> None:
    """Corestore stays away while the work verifies: `failed` from `verifying`. The exact
    replay restores nothing again (both mappings are restored), verifies, and ends `ready`."""
    revision = await world.ready_to_execute()
    faults = world.corestore.faults
    faults.fail_next(RouteName.VERIFY_RESOURCE, status=500, times=2)
    body = world.execute_body(revision)
    await world.call(METHOD_EXECUTE, body)
    failed = await world.settled("ready", "failed")
    assert (failed["status"], failed["lastErrorCode"]) == ("failed", "corestore-unavailable")
    restores = faults.hits[RouteName.RESTORE_RESOURCE]
    await world.call(METHOD_EXECUTE, {**body, "restoreGrant": world.grant()})
    ready = await world.settled("ready", "failed")
    assert (ready["status"], ready["verification"]["status"]) == ("ready", "passed")
    assert faults.hits[RouteName.RESTORE_RESOURCE] == restores


async def test_an_exact_prepare_replay_resumes_a_prepare_failed_for_an_unavailable_corestore(
    world: Any,
) -> None:
    """Corestore is away while the restore is prepared: `failed`. The exact prepare replay goes
    back to `preparing` and ends `prepared`."""
    world.corestore.faults.fail_next(RouteName.PREPARE_RESTORE, status=503, times=2)
    failed = await world.prepare()
    assert (failed["status"], failed["lastErrorCode"]) == ("failed", "corestore-unavailable")
    replay = {**world.prepare_body(), "restoreGrant": world.grant()}
    assert (await world.call(METHOD_PREPARE, replay))["state"]["status"] == "preparing"
    assert (await world.settled("prepared", "failed"))["status"] == "prepared"


async def test_a_restore_that_failed_for_good_is_answered_as_it_is(world: Any) -> None:
    """Corestore's own verdict (the restore of a resource failed): the exact replay answers the
    `failed` state and runs nothing; only a cleanup goes on from there."""
    revision = await world.ready_to_execute()
    world.staged_file("snap-db/dump.bson").unlink()
    body = world.execute_body(revision)
    await world.call(METHOD_EXECUTE, body)
    failed = await world.settled("ready", "failed")
    assert failed["lastErrorCode"] == "restore-failed"
    restores = world.corestore.faults.hits[RouteName.RESTORE_RESOURCE]
    answer = (await world.call(METHOD_EXECUTE, {**body, "restoreGrant": world.grant()}))["state"]
    await world.work_ended()
    assert answer == failed
    assert world.corestore.faults.hits[RouteName.RESTORE_RESOURCE] == restores
    assert (await world.status())["state"] == failed
