"""Exact replays (same body, fresh grant, old expectedRevision) and stale requests."""

from __future__ import annotations

from typing import Any

import pytest

from agent.contracts.isolatedrestore import (
    METHOD_CLEANUP,
    METHOD_EXECUTE,
    METHOD_PREPARE,
    METHOD_STAGE,
)
from agent.corestore.routes import RouteName
from agent.errors import RevisionConflict


async def test_a_replayed_prepare_answers_the_current_state_without_asking_corestore(
    world: Any,
) -> None:
    """The same prepare with a fresh grant after it settled gets the prepared state (a later
    revision than its first answer); Corestore saw one call."""
    body = world.prepare_body()
    first = (await world.call(METHOD_PREPARE, body))["state"]
    prepared = await world.settled("prepared")
    replay = {**body, "restoreGrant": world.grant()}
    assert replay["restoreGrant"] != body["restoreGrant"]
    assert (await world.call(METHOD_PREPARE, replay))["state"] == prepared
    assert (first["revision"], prepared["revision"]) == (1, 2)
    assert world.corestore.faults.hits[RouteName.PREPARE_RESTORE] == 1


async def test_a_prepare_replayed_while_its_task_runs_answers_preparing_and_starts_nothing(
    world: Any,
) -> None:
    """Corestore still works on the prepare: the replay answers the current `preparing` state,
    and the one running task settles it (one Corestore call in all)."""
    world.corestore.faults.hold_prepares()
    body = world.prepare_body()
    first = (await world.call(METHOD_PREPARE, body))["state"]
    await world.corestore.faults.prepare_held.wait()
    replayed = (await world.call(METHOD_PREPARE, {**body, "restoreGrant": world.grant()}))["state"]
    assert replayed == first
    assert replayed["status"] == "preparing"
    world.corestore.faults.release_prepares()
    assert (await world.settled("prepared", "failed"))["status"] == "prepared"
    await world.work_ended()
    assert world.corestore.faults.hits[RouteName.PREPARE_RESTORE] == 1


async def test_a_replayed_stage_moves_no_bytes_and_leaves_its_stream_unopened(
    world: Any, source_factory: Any
) -> None:
    """A stage replayed with a fresh grant and a fresh stream answers the same state."""
    prepared = await world.prepare()
    path = "snap-db/dump.bson"
    body = world.stage_body(path, prepared["revision"])
    first = (await world.call(METHOD_STAGE, body, source_factory(world.objects[path])))["state"]
    puts, commits = (world.corestore.faults.hits[r] for r in (RouteName.PUT_CHUNK, "commit-object"))
    replay_source = source_factory(world.objects[path])
    replay = {
        **body,
        "restoreGrant": world.grant(),
        "archive": {**body["archive"], "streamId": "s-9"},
    }
    assert (await world.call(METHOD_STAGE, replay, replay_source))["state"] == first
    assert replay_source.opened is False
    assert world.corestore.faults.hits[RouteName.PUT_CHUNK] == puts
    assert world.corestore.faults.hits[RouteName.COMMIT_OBJECT] == commits


async def test_a_replayed_execute_after_ready_answers_ready_and_restores_nothing(
    world: Any,
) -> None:
    """Finished work is never redone: the replay gets the ready state."""
    revision = await world.ready_to_execute()
    body = world.execute_body(revision)
    await world.call(METHOD_EXECUTE, body)
    ready = await world.until("ready")
    restores = world.corestore.faults.hits[RouteName.RESTORE_RESOURCE]
    answer = await world.call(METHOD_EXECUTE, {**body, "restoreGrant": world.grant()})
    assert answer["state"] == (await world.status())["state"]
    assert answer["state"]["revision"] == ready.revision
    assert world.engine.owner.working(world.KEY) is False
    assert world.corestore.faults.hits[RouteName.RESTORE_RESOURCE] == restores


async def test_a_replayed_cleanup_after_cleaned_answers_cleaned_and_deletes_nothing(
    world: Any,
) -> None:
    """A retried cleanup whose answer was lost gets the cleaned state."""
    revision = await world.ready_to_execute()
    await world.execute(revision)
    ready = await world.until("ready")
    body = world.cleanup_body(ready.revision)
    await world.call(METHOD_CLEANUP, body)
    cleaned = await world.until("cleaned")
    deletes = world.corestore.faults.hits[RouteName.DELETE_RESOURCE]
    answer = await world.call(METHOD_CLEANUP, {**body, "restoreGrant": world.grant()})
    assert (answer["state"]["status"], answer["state"]["revision"]) == ("cleaned", cleaned.revision)
    assert world.corestore.faults.hits[RouteName.DELETE_RESOURCE] == deletes


async def test_a_stale_request_that_is_no_replay_is_a_revision_conflict(
    world: Any, source_factory: Any
) -> None:
    """A stage of another object at an old revision: conflict naming the current revision."""
    prepared = await world.prepare()
    staged = await world.stage("snap-db/dump.bson", prepared["revision"])
    path = "snap-os/media/logo.png"
    source = source_factory(world.objects[path])
    with pytest.raises(RevisionConflict) as caught:
        await world.call(METHOD_STAGE, world.stage_body(path, prepared["revision"]), source)
    assert caught.value.code == "revision-conflict"
    assert caught.value.data == {"currentRevision": staged["revision"], "status": "staging"}
    assert source.opened is False
    assert (await world.store.get(world.KEY)).revision == staged["revision"]


async def test_an_older_request_than_the_latest_is_no_replay(world: Any) -> None:
    """Only the request that produced the current state replays; an earlier one conflicts."""
    prepare = world.prepare_body()
    await world.call(METHOD_PREPARE, prepare)
    prepared = await world.settled("prepared")
    await world.stage("snap-db/dump.bson", prepared["revision"])
    with pytest.raises(RevisionConflict) as caught:
        await world.call(METHOD_PREPARE, {**prepare, "restoreGrant": world.grant()})
    assert caught.value.data == {"currentRevision": 3, "status": "staging"}


async def test_a_prepare_with_another_body_at_revision_zero_conflicts(world: Any) -> None:
    """Same key, different request: not a replay, so revision-conflict (current 2)."""
    await world.prepare()
    with pytest.raises(RevisionConflict) as caught:
        await world.call(METHOD_PREPARE, world.prepare_body(sourceBackupId="backup-2"))
    assert caught.value.data == {"currentRevision": 2, "status": "prepared"}


async def test_a_replayed_prepare_resumes_one_left_preparing(world: Any) -> None:
    """A prepare whose task was cut off (restart) stays preparing, with no task; its replay
    answers `preparing`, resumes the work with its fresh grant and ends `prepared`."""
    world.corestore.faults.hold_prepares()
    body = world.prepare_body()
    first = (await world.call(METHOD_PREPARE, body))["state"]
    await world.corestore.faults.prepare_held.wait()
    await world.restart()  # cancels the task; Corestore never answered it
    world.corestore.faults.release_prepares()
    left = (await world.status())["state"]
    assert left == first
    assert (left["status"], left["revision"]) == ("preparing", 1)
    assert world.engine.owner.working(world.KEY) is False

    replay = {**body, "restoreGrant": world.grant()}
    answer = (await world.call(METHOD_PREPARE, replay))["state"]
    assert answer == left
    assert world.engine.owner.working(world.KEY)
    state = await world.settled("prepared", "failed")
    assert (state["status"], state["revision"]) == ("prepared", 2)
    assert world.corestore.faults.hits[RouteName.PREPARE_RESTORE] == 2
