"""Routing and grant refusals come first and change nothing: no row, no Corestore call."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from agent.contracts.isolatedrestore import (
    METHOD_CLEANUP,
    METHOD_EXECUTE,
    METHOD_GET_STATUS,
    METHOD_PREPARE,
    METHOD_STAGE,
)
from agent.errors import (
    AgentError,
    GrantInvalid,
    MisroutedCluster,
    NodeWithoutCorestore,
    UnknownNode,
)

METHODS = [METHOD_PREPARE, METHOD_STAGE, METHOD_GET_STATUS, METHOD_EXECUTE, METHOD_CLEANUP]


def _body(world: Any, method: str, **override: Any) -> dict[str, Any]:
    build: dict[str, Callable[[], dict[str, Any]]] = {
        METHOD_PREPARE: lambda: world.prepare_body(**override),
        METHOD_STAGE: lambda: world.stage_body("snap-db/dump.bson", 0, **override),
        METHOD_GET_STATUS: lambda: world.status_body(**override),
        METHOD_EXECUTE: lambda: world.execute_body(0, **override),
        METHOD_CLEANUP: lambda: world.cleanup_body(0, **override),
    }
    return build[method]()


async def _refused(world: Any, method: str, body: dict[str, Any], source_factory: Any) -> Any:
    source = source_factory(world.objects["snap-db/dump.bson"])
    with pytest.raises(AgentError) as caught:
        await world.call(method, body, source)
    assert source.opened is False
    assert await world.store.get(world.KEY) is None
    assert sum(world.corestore.faults.hits.values()) == 0
    return caught.value


@pytest.mark.parametrize("method", METHODS)
async def test_a_request_for_another_cluster_is_misrouted(
    world: Any, method: str, source_factory: Any
) -> None:
    """clusterId other than the session's cluster: misrouted-cluster."""
    body = _body(world, method, clusterId="cluster-9")
    error = await _refused(world, method, body, source_factory)
    assert isinstance(error, MisroutedCluster)
    assert (error.code, error.retryable) == ("misrouted-cluster", False)


@pytest.mark.parametrize("method", METHODS)
async def test_a_request_for_a_node_the_cluster_lacks_is_unknown_node(
    world: Any, method: str, source_factory: Any
) -> None:
    """targetNodeName no node of the cluster document: unknown-node."""
    error = await _refused(
        world, method, _body(world, method, targetNodeName="node-9"), source_factory
    )
    assert isinstance(error, UnknownNode)


@pytest.mark.parametrize("method", METHODS)
async def test_a_request_for_a_node_without_corestore_is_refused_retryable(
    world: Any, method: str, source_factory: Any
) -> None:
    """A node without a valid Corestore endpoint: node-without-corestore, retryable."""
    error = await _refused(
        world, method, _body(world, method, targetNodeName="node-2"), source_factory
    )
    assert isinstance(error, NodeWithoutCorestore)
    assert error.retryable is True
    assert "absent" in error.message


@pytest.mark.parametrize("method", METHODS)
async def test_a_request_before_the_cluster_document_is_loaded_is_retryable(
    world: Any, method: str, source_factory: Any
) -> None:
    """No cluster view yet: node-without-corestore (retryable) saying why."""
    world.cluster_loaded = False
    error = await _refused(world, method, _body(world, method), source_factory)
    assert isinstance(error, NodeWithoutCorestore)
    assert "not loaded" in error.message


@pytest.mark.parametrize("method", METHODS)
async def test_a_malformed_grant_is_grant_invalid_and_changes_nothing(
    world: Any, method: str, source_factory: Any
) -> None:
    """A grant that is no compact JWS is refused before any state or Corestore call."""
    body = _body(world, method, restoreGrant="not-a-jws")
    error = await _refused(world, method, body, source_factory)
    assert isinstance(error, GrantInvalid)
    assert "not-a-jws" not in str(error)


async def test_routing_is_checked_before_the_grant(world: Any, source_factory: Any) -> None:
    """A misrouted request with a malformed grant is refused as misrouted."""
    body = _body(world, METHOD_PREPARE, clusterId="cluster-9", restoreGrant="x")
    assert isinstance(await _refused(world, METHOD_PREPARE, body, source_factory), MisroutedCluster)
