"""The three relay routes Cloudly calls, bound to one `RelayService`.

Each names its exact request model (camelCase only; a body that fails it is `invalid-request`
naming the field, before the service sees it) and answers its response model. A backup and a
restore hand the service their request's context too: where the request arrived and whether
its answer reached Cloudly decide how a repeat is answered (docs/relay.md). A backup and a
restore are stream requests (`agent.protocol.admission`), a prune control. Refusals are the
service's `AgentError`s, turned into `error {text, data: {code, retryable, ...}}` by the session.
"""

from __future__ import annotations

from agent.contracts.relay import (
    METHOD_BACKUP_CLUSTER_SERVICE,
    METHOD_PRUNE_CLUSTER_NODE_ARCHIVE,
    METHOD_RESTORE_CLUSTER_SERVICE,
    BackupClusterServiceRequest,
    BackupClusterServiceResponse,
    PruneClusterNodeArchiveRequest,
    PruneClusterNodeArchiveResponse,
    RestoreClusterServiceRequest,
    RestoreClusterServiceResponse,
)
from agent.protocol.admission import stream_class
from agent.protocol.handlers import RequestContext, Route, Routes
from agent.relay.service import RelayService

__all__ = ["relay_routes"]


def relay_routes(relay: RelayService) -> Routes:
    """The routes of backupClusterService, restoreClusterService and pruneClusterNodeArchive."""

    async def backup(
        request: BackupClusterServiceRequest, ctx: RequestContext
    ) -> BackupClusterServiceResponse:
        return await relay.backup(request, requester=ctx)

    async def restore(
        request: RestoreClusterServiceRequest, ctx: RequestContext
    ) -> RestoreClusterServiceResponse:
        return await relay.restore(request, requester=ctx)

    async def prune(
        request: PruneClusterNodeArchiveRequest, ctx: RequestContext
    ) -> PruneClusterNodeArchiveResponse:
        return await relay.prune(request)

    return Routes(
        [
            # A backup or restore moves its database closure, or waits its node's turn to.
            Route(
                METHOD_BACKUP_CLUSTER_SERVICE,
                BackupClusterServiceRequest,
                backup,
                admission=stream_class("nodeId"),
            ),
            Route(
                METHOD_RESTORE_CLUSTER_SERVICE,
                RestoreClusterServiceRequest,
                restore,
                admission=stream_class("nodeId"),
            ),
            Route(METHOD_PRUNE_CLUSTER_NODE_ARCHIVE, PruneClusterNodeArchiveRequest, prune),
        ]
    )
