"""Ids that would become path segments are refused at the edge, before any row or Corestore call."""

from __future__ import annotations

from typing import Any

import pytest

from agent.contracts.isolatedrestore import METHOD_PREPARE
from agent.domain.restores import RestoreKey
from agent.errors import InvalidRequest

BAD = ["../../x", "a/b", ".", "..", "x\u0000", "x" * 257]


def _mapping_with_id(world: Any, mapping_id: str) -> list[dict[str, Any]]:
    first, *rest = world.mappings()
    return [{**first, "id": mapping_id}, *rest]


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize(
    ("field", "named"),
    [
        ("restoreId", "restoreId"),
        ("scratchNamespaceId", "scratchNamespaceId"),
        ("stagingArchiveId", "stagingArchiveId"),
        ("resourceMappings", "resourceMappings.0.database.id"),
    ],
)
async def test_a_prepare_naming_an_unusable_id_is_invalid_request_and_stores_nothing(
    world: Any, field: str, named: str, bad: str
) -> None:
    """The session answers invalid-request naming the field; no state under any key, no
    Corestore call, no file at Corestore."""
    value: Any = _mapping_with_id(world, bad) if field == "resourceMappings" else bad
    with pytest.raises(InvalidRequest) as caught:
        await world.call(METHOD_PREPARE, world.prepare_body(**{field: value}))
    refusal = caught.value
    assert (refusal.code, refusal.retryable, refusal.data) == (
        "invalid-request",
        False,
        {"field": named},
    )
    assert await world.store.get(world.KEY) is None
    if field == "restoreId":
        assert await world.store.get(RestoreKey("cluster-1", "node-1", bad)) is None
    assert await world.store.list_unfinished() == []
    assert sum(world.corestore.faults.hits.values()) == 0
    assert world.data_files() == []
