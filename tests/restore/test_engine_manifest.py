"""A request's work does not grow with the manifest: what a stage reads and writes.

The store is the real one; the test records which of its reads of the plan a request makes
(each still answers as before), and what the stage's mutation writes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from agent.contracts.isolatedrestore import METHOD_STAGE
from agent.corestore.routes import RouteName
from agent.errors import ObjectNotInManifest

# Every read that answers with the plan or the whole staging record of a restore: each costs
# as much as the manifest is long.
WHOLE_READS = ("plan", "resource_mappings", "written_objects")


def _record(store: Any, monkeypatch: pytest.MonkeyPatch, names: tuple[str, ...]) -> list[str]:
    calls: list[str] = []

    def recording(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        async def call(*args: Any, **kwargs: Any) -> Any:
            calls.append(name)
            return await original(*args, **kwargs)

        return call

    for name in names:
        monkeypatch.setattr(store, name, recording(name, getattr(store, name)), raising=False)
    return calls


async def test_a_stage_reads_neither_the_plan_nor_every_written_object(
    world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In the manifest and already written are keyed questions: no whole read."""
    prepared = await world.prepare()
    calls = _record(world.store, monkeypatch, WHOLE_READS)
    await world.stage("snap-db/dump.bson", prepared["revision"])
    assert calls == []


async def test_a_stage_mutation_does_not_write_the_unchanged_state_again(
    world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stage moves revision and status; the state it passes the store is None."""
    prepared = await world.prepare()
    given: list[Any] = []
    mutate = world.store.mutate

    async def recording(*args: Any, **kwargs: Any) -> Any:
        given.append(kwargs.get("state"))
        return await mutate(*args, **kwargs)

    monkeypatch.setattr(world.store, "mutate", recording)
    staged = await world.stage("snap-db/dump.bson", prepared["revision"])
    assert given == [None]
    assert (staged["revision"], staged["status"]) == (prepared["revision"] + 1, "staging")


async def test_a_path_the_manifest_does_not_list_is_refused_before_any_byte_moves(
    world: Any, source_factory: Any
) -> None:
    """An object under a path no manifest entry has is object-not-in-manifest."""
    prepared = await world.prepare()
    body = world.stage_body("snap-db/dump.bson", prepared["revision"])
    body["object"] = {**body["object"], "path": "snap-db/unknown.bson"}
    source = source_factory(b"x" * body["object"]["size"])
    with pytest.raises(ObjectNotInManifest):
        await world.call(METHOD_STAGE, body, source)
    assert source.opened is False
    assert world.corestore.faults.hits[RouteName.PUT_CHUNK] == 0
