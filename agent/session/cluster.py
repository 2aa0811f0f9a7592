"""What the session knows of its cluster: `ClusterKnowledge`.

It holds the `ClusterView` read last (kept across reconnects) and publishes each new one: to
`AgentStatus`, to the one watcher the composition root gives (the sealed credentials drop the
bearers of nodes that left), and in the log (`cluster_view_published`; a warning
`cluster_node_without_corestore` with the validator's reasons for each node it cannot route to,
never a guessed endpoint; `cluster_id_changed` when the cluster is another). It logs each
tolerated deviation of Cloudly's answers from the seed's exact shape once per method and field
path (`cloudly_answer_deviates`, never the value), and answers `pushClusterConfig` (`route`): a
push naming another cluster is refused `misrouted-cluster` and changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

from agent.contracts.cluster import (
    METHOD_PUSH_CLUSTER_CONFIG,
    ClusterConfigPush,
    ClusterView,
    PushClusterConfigRequest,
    PushClusterConfigResponse,
    contract_deviation,
    read_cluster_view,
)
from agent.errors import MisroutedCluster
from agent.protocol.handlers import RequestContext, Route
from agent.session.handshake import Deviation
from agent.watch.status import AgentStatus

__all__ = ["ClusterKnowledge"]

log = structlog.get_logger("agent.session")


class ClusterKnowledge:
    """The session's cluster view, what it has said about Cloudly's answers, its push route."""

    def __init__(
        self, status: AgentStatus, watcher: Callable[[ClusterView], None] | None = None
    ) -> None:
        self._status = status
        self._watcher = watcher
        self._view: ClusterView | None = None
        self._deviations: set[tuple[str, str]] = set()  # (method, field path) logged once
        self.route = Route(METHOD_PUSH_CLUSTER_CONFIG, ClusterConfigPush, self._on_push)

    @property
    def view(self) -> ClusterView | None:
        """The cluster view read last, None before the first read."""
        return self._view

    def note(self, deviation: Deviation | None) -> None:
        """Log a tolerated deviation from the contract once per method and field path."""
        if deviation is None or (deviation.method, deviation.field) in self._deviations:
            return
        self._deviations.add((deviation.method, deviation.field))
        log.warning(
            "cloudly_answer_deviates",
            method=deviation.method,
            field=deviation.field,
            reason=deviation.reason,
            consequence="tolerated: the agent does not use this field",
        )

    def publish(self, view: ClusterView, *, source: str) -> None:
        """Make `view` the current one (read by `source`, a method name)."""
        previous = self._view
        if previous is not None and previous.cluster_id != view.cluster_id:
            log.warning("cluster_id_changed", previous=previous.cluster_id, current=view.cluster_id)
        self._view = view
        if self._watcher is not None:
            self._watcher(view)
        summary = self._status.publish_cluster(view)
        log.info(
            "cluster_view_published",
            source=source,
            cluster_id=view.cluster_id,
            nodes=len(summary.nodes),
            nodes_with_corestore=list(summary.nodes_with_corestore),
        )
        for node in summary.nodes:
            if not node.has_corestore:
                log.warning(
                    "cluster_node_without_corestore",
                    cluster_id=view.cluster_id,
                    node_id=node.node_id,
                    problems=list(node.corestore_problems),
                )

    async def _on_push(
        self, request: ClusterConfigPush, ctx: RequestContext
    ) -> PushClusterConfigResponse:
        del ctx
        found = contract_deviation(PushClusterConfigRequest, request.to_wire())
        view = read_cluster_view(request.config_data)
        current = self._view
        if current is not None and current.cluster_id != view.cluster_id:
            log.warning(
                "push_cluster_config_refused",
                reason="misrouted-cluster",
                pushed=view.cluster_id,
                session=current.cluster_id,
            )
            raise MisroutedCluster(
                f"pushed cluster {view.cluster_id} is not the session's cluster "
                f"{current.cluster_id}"
            )
        self.note(None if found is None else Deviation(METHOD_PUSH_CLUSTER_CONFIG, *found))
        self.publish(view, source=METHOD_PUSH_CLUSTER_CONFIG)
        return PushClusterConfigResponse()
