"""The store's facade (agent/store/store.py): each call is the owning part's own method."""

from __future__ import annotations

import inspect
from pathlib import Path

from agent.domain.restores import RestoreKey, StoredState
from agent.store import RevisionStore
from agent.store.node_states import NodeStates
from agent.store.relay_jobs import RelayJobs
from agent.store.store import _answered_by
from tests.store.states import KEY


def _answered_names() -> list[str]:
    return [name for name, value in vars(RevisionStore).items() if isinstance(value, _answered_by)]


async def test_every_call_of_the_store_is_a_method_bound_to_the_part_that_owns_it(
    store: RevisionStore,
) -> None:
    parts = {id(part) for part in vars(store).values()}
    for name in _answered_names():
        method = getattr(store, name)
        assert inspect.ismethod(method), name
        assert id(method.__self__) in parts, name
        assert method.__name__ == name


def test_a_call_of_the_store_carries_the_parts_docstring() -> None:
    assert RevisionStore.mutate.__doc__ == NodeStates.mutate.__doc__
    assert RevisionStore.move_job.__doc__ == RelayJobs.move_job.__doc__


async def test_a_call_answers_what_the_part_answers(store: RevisionStore) -> None:
    assert await store.get(KEY) is None
    assert store.kept(KEY) is None


async def test_a_subclass_overrides_a_call_and_reaches_the_part_with_super(
    tmp_path: Path,
) -> None:
    seen: list[RestoreKey] = []

    class Watched(RevisionStore):
        async def get(self, key: RestoreKey) -> StoredState | None:
            seen.append(key)
            return await super().get(key)

    async with await Watched.open(tmp_path) as watched:
        assert await watched.get(KEY) is None
    assert seen == [KEY]
