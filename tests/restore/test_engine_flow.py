"""The isolated-restore lifecycle against the reference Corestore and a real store."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from agent.contracts.isolatedrestore import (
    METHOD_CLEANUP,
    METHOD_EXECUTE,
    METHOD_GET_STATUS,
    METHOD_PREPARE,
    METHOD_STAGE,
)
from agent.corestore.routes import RouteName
from agent.errors import (
    IllegalTransition,
    InvalidRequest,
    ObjectNotInManifest,
    RestoreNotFound,
)


async def test_prepare_answers_preparing_at_the_next_revision(world: Any) -> None:
    """A missing state is revision 0: prepare answers `preparing` at revision 1 and the
    engine's task then writes `prepared` at revision 2 (a later write, not the answer)."""
    seen: list[tuple[int, str]] = []
    world.engine.observe(lambda stored: seen.append((stored.revision, stored.status)))
    answer = await world.call(METHOD_PREPARE, world.prepare_body(expected=0))
    state = answer["state"]
    assert (state["revision"], state["status"]) == (1, "preparing")
    assert "preparedAt" not in state
    prepared = await world.settled("prepared", "failed")
    assert seen == [(1, "preparing"), (2, "prepared")]
    assert (prepared["revision"], prepared["status"]) == (2, "prepared")
    assert prepared["preparedAt"] > 0
    assert prepared["scratchNamespaceId"] == "scratch-ns-1"
    assert world.corestore.faults.hits[RouteName.PREPARE_RESTORE] == 1


async def test_prepare_answers_before_corestore_does(world: Any) -> None:
    """With Corestore holding the prepare, the answer and the status say `preparing`; the
    engine's task settles it once Corestore answers."""
    world.corestore.faults.hold_prepares()
    state = await world.state_of(METHOD_PREPARE, world.prepare_body())
    assert (state["revision"], state["status"]) == (1, "preparing")
    assert world.engine.owner.working(world.KEY)
    assert (await world.status())["state"] == state
    world.corestore.faults.release_prepares()
    assert (await world.settled("prepared", "failed"))["status"] == "prepared"
    assert world.corestore.faults.hits[RouteName.PREPARE_RESTORE] == 1


async def test_full_lifecycle_ends_cleaned_with_nothing_left_on_corestore(world: Any) -> None:
    """prepare -> stage x3 -> execute -> status until ready -> cleanup -> cleaned."""
    revision = await world.ready_to_execute()
    for path, data in world.objects.items():
        staged = world.staged_file(path).read_bytes()
        assert hashlib.sha256(staged).hexdigest() == hashlib.sha256(data).hexdigest()

    executing = await world.execute(revision)
    assert executing["status"] == "restoring"
    await world.until("ready", "failed")
    status = await world.status()
    assert status["found"] is True
    ready = status["state"]
    assert ready["status"] == "ready", ready.get("lastErrorMessage")
    assert sorted(ready["completedResourceMappingIds"]) == ["map-db", "map-os"]
    assert ready["verification"]["status"] == "passed"
    assert {r["resourceMappingId"] for r in ready["verification"]["results"]} == {
        "map-db",
        "map-os",
    }
    assert ready["readyAt"] >= ready["verification"]["startedAt"]
    restored = world.corestore.data_dir / "scratch" / "scratch-ns-1" / "map-db" / "dump.bson"
    assert restored.read_bytes() == world.objects["snap-db/dump.bson"]

    cleaning = await world.cleanup(ready["revision"])
    assert cleaning["status"] == "cleaning"
    await world.until("cleaned", "cleanup-failed")
    cleaned = (await world.status())["state"]
    assert cleaned["status"] == "cleaned"
    assert [e["status"] for e in cleaned["cleanup"]["resources"]] == ["succeeded", "succeeded"]
    assert cleaned["cleanup"]["stagingArchive"]["status"] == "succeeded"
    assert world.data_files() == [], "Corestore keeps nothing of a cleaned restore"


async def test_every_mutation_advances_the_revision_by_exactly_one(world: Any) -> None:
    """The revisions the engine writes across a whole restore have no gap and no repeat."""
    revisions: list[int] = []
    world.engine.observe(lambda stored: revisions.append(stored.revision))
    revision = await world.ready_to_execute()
    await world.execute(revision)
    ready = await world.until("ready")
    await world.cleanup(ready.revision)
    await world.until("cleaned")
    assert revisions == list(range(1, len(revisions) + 1))


async def test_execute_returns_restoring_before_the_work_finishes(world: Any) -> None:
    """With Corestore's restores held, execute still answers at once with restoring."""
    revision = await world.ready_to_execute()
    world.corestore.faults.hold_restores()
    state = await world.execute(revision)
    assert state["status"] == "restoring"
    assert world.engine.owner.working(world.KEY)
    assert (await world.status())["state"]["status"] == "restoring"
    world.corestore.faults.release_restores()
    assert (await world.until("ready", "failed")).status == "ready"


async def test_status_of_an_unknown_restore_is_not_found(world: Any) -> None:
    """Status answers found: false and writes nothing."""
    assert await world.status() == {"found": False}
    assert await world.store.get(world.KEY) is None


async def test_a_status_in_memory_is_answered_now_as_the_handler_answers_it(world: Any) -> None:
    """The status route's `answer_now`: the handler's answer without waiting once the store
    holds the state in memory; None (read it the usual way) for a state it does not hold."""
    route = world.routes.get(METHOD_GET_STATUS)
    assert route.answer_now(route.parse(world.status_body())) is None
    await world.prepare()
    now = route.answer_now(route.parse(world.status_body()))
    assert now is not None
    assert now.to_wire() == await world.status()
    assert now.to_wire()["state"]["status"] == "prepared"


@pytest.mark.parametrize("method", [METHOD_STAGE, METHOD_EXECUTE, METHOD_CLEANUP])
async def test_requests_on_an_unknown_restore_are_restore_not_found(
    world: Any, method: str, source_factory: Any
) -> None:
    """stage, execute and cleanup need a prepared restore."""
    bodies = {
        METHOD_STAGE: lambda: world.stage_body("snap-db/dump.bson", 2),
        METHOD_EXECUTE: lambda: world.execute_body(2),
        METHOD_CLEANUP: lambda: world.cleanup_body(2),
    }
    source = source_factory(world.objects["snap-db/dump.bson"])
    with pytest.raises(RestoreNotFound):
        await world.call(method, bodies[method](), source)
    assert await world.store.get(world.KEY) is None
    assert source.opened is False


async def test_execute_before_every_object_is_staged_is_an_illegal_transition(
    world: Any,
) -> None:
    """Staging complete is the execute guard; the state does not move."""
    prepared = await world.prepare()
    staged = await world.stage("snap-db/dump.bson", prepared["revision"])
    with pytest.raises(IllegalTransition) as caught:
        await world.execute(staged["revision"])
    assert caught.value.data == {"currentRevision": staged["revision"], "status": "staging"}
    assert (await world.store.get(world.KEY)).revision == staged["revision"]


async def test_an_object_not_in_the_manifest_is_refused_before_any_byte_moves(
    world: Any, source_factory: Any
) -> None:
    """A size or digest differing from every manifest entry is object-not-in-manifest."""
    prepared = await world.prepare()
    body = world.stage_body("snap-db/dump.bson", prepared["revision"])
    body["object"] = {**body["object"], "size": body["object"]["size"] + 1}
    source = source_factory(b"x" * body["object"]["size"])
    with pytest.raises(ObjectNotInManifest):
        await world.call(METHOD_STAGE, body, source)
    assert source.opened is False
    assert world.corestore.faults.hits[RouteName.PUT_CHUNK] == 0
    assert (await world.store.get(world.KEY)).revision == prepared["revision"]


async def test_a_prepare_corestore_refuses_is_answered_preparing_and_ends_failed(
    world: Any,
) -> None:
    """Corestore's 4xx is no error reply: the answer is `preparing`, and the state then reads
    `failed` at revision 2 with lastErrorCode and Corestore's sanitised text."""
    world.corestore.faults.fail_next(RouteName.PREPARE_RESTORE, status=409)
    answer = await world.state_of(METHOD_PREPARE, world.prepare_body())
    assert (answer["revision"], answer["status"]) == (1, "preparing")
    state = await world.settled("prepared", "failed")
    assert (state["revision"], state["status"]) == (2, "failed")
    assert state["lastErrorCode"] == "corestore-refused"
    assert "409" in state["lastErrorMessage"]
    assert "preparedAt" not in state
    assert (await world.status())["state"] == state
    assert world.corestore.faults.hits[RouteName.PREPARE_RESTORE] == 1


async def test_a_prepare_corestore_never_answers_ends_failed_after_the_clients_retries(
    world: Any,
) -> None:
    """503 on every send: the client's two sends, no engine retry, then `failed` with
    corestore-unavailable; a cleanup can start from there."""
    world.corestore.faults.fail_next(RouteName.PREPARE_RESTORE, status=503, times=100)
    await world.state_of(METHOD_PREPARE, world.prepare_body())
    state = await world.settled("prepared", "failed")
    assert (state["status"], state["lastErrorCode"]) == ("failed", "corestore-unavailable")
    assert world.corestore.faults.hits[RouteName.PREPARE_RESTORE] == 2


async def test_a_prepare_without_resource_mappings_is_refused_before_any_state(
    world: Any,
) -> None:
    """Corestore cannot prepare a restore of nothing: invalid-request, no row written."""
    with pytest.raises(InvalidRequest) as caught:
        await world.call(METHOD_PREPARE, world.prepare_body(resourceMappings=[]))
    assert caught.value.data == {"field": "resourceMappings"}
    assert await world.store.get(world.KEY) is None
    assert world.corestore.faults.hits[RouteName.PREPARE_RESTORE] == 0
