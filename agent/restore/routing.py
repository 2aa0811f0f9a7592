"""Routing an isolated-restore request to one node, and what Corestore's routes can carry (pure).

`locate()` is the first check of every request: the session's cluster, a node of it, a usable
Corestore endpoint on that node. `check_preparable()` refuses, before any state is written, a
prepare request Corestore could not prepare (a restore without a resource mapping), so such a
request never leaves a `preparing` row behind. Ids need no check here: the request contract's
`PathSegmentId` rule is the same rule the Corestore routes apply.
"""

from __future__ import annotations

from agent.contracts.cluster import ClusterView
from agent.contracts.isolatedrestore import IsolatedRestoreRequest, PrepareIsolatedRestoreRequest
from agent.domain.restores import RestoreKey
from agent.errors import InvalidRequest, MisroutedCluster, NodeWithoutCorestore

__all__ = ["check_preparable", "locate"]


def locate(view: ClusterView | None, request: IsolatedRestoreRequest) -> tuple[RestoreKey, str]:
    """The request's routing key and its node's Corestore endpoint, or the routing refusal.

    Raises `NodeWithoutCorestore` (also, retryable, while no cluster document is loaded),
    `MisroutedCluster`, `UnknownNode`.
    """
    if view is None:
        raise NodeWithoutCorestore(
            "the cluster document is not loaded yet; retry once the session has read it"
        )
    if request.cluster_id != view.cluster_id:
        raise MisroutedCluster(
            f"clusterId {request.cluster_id} is not the cluster this session serves"
        )
    endpoint = view.corestore_endpoint(request.target_node_name)
    return RestoreKey(request.cluster_id, request.target_node_name, request.restore_id), endpoint


def check_preparable(request: PrepareIsolatedRestoreRequest) -> None:
    """`InvalidRequest` naming the field Corestore could not prepare from, else nothing."""
    if not request.resource_mappings:
        raise InvalidRequest(
            "resourceMappings: an isolated restore needs at least one resource mapping",
            field="resourceMappings",
        )
