"""Helpers shared by the credential tests: the stand-in's Cloudly side over two in-memory peers.

Test modules import from here (conftest.py cannot be imported in importlib mode).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.contracts.cluster import ClusterView, NodeView
from agent.credentials.contest import RecipientWatch
from agent.credentials.enrollment import Enrollment
from agent.credentials.keys import KeyStore
from agent.credentials.provider import SealedCredentials
from agent.protocol.handlers import Routes
from agent.session.peer import Peer
from devstack.credentials import CredentialAuthority
from tests.clock import ManualClock
from tests.session._helpers import peers

__all__ = ["CLUSTER", "Cloudly", "cloudly_side", "view_of"]

CLUSTER = "cluster-1"


def view_of(cluster: str, *nodes: str) -> ClusterView:
    """A cluster view listing `nodes`, each with a Corestore endpoint."""
    return ClusterView(
        cluster, {node: NodeView(node, f"http://10.0.0.{n}:3000") for n, node in enumerate(nodes)}
    )


@dataclass
class Cloudly:
    """The authority, the agent's side of the connection, and what the authority recorded."""

    authority: CredentialAuthority
    peer: Peer
    keys: KeyStore
    enrollment: Enrollment
    clock: ManualClock
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    view: ClusterView | None = None

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.events]

    def count(self, kind: str, **detail: Any) -> int:
        return sum(
            1
            for seen, what in self.events
            if seen == kind and all(what.get(k) == v for k, v in detail.items())
        )

    def provider(self, *, watch: RecipientWatch | None = None) -> SealedCredentials:
        """A credential provider asking this Cloudly, for the current `view`."""
        return SealedCredentials(
            key=self.keys.key,
            enrollment=self.enrollment,
            caller=lambda: self.peer,
            cluster_view=lambda: self.view,
            call_timeout=5.0,
            watch=watch,
        )


@asynccontextmanager
async def cloudly_side(
    state: Path,
    bearers: Mapping[str, str],
    *,
    cluster: str = CLUSTER,
    edit: Callable[[Routes], Routes] | None = None,
    **options: Any,
) -> AsyncIterator[Cloudly]:
    """The stand-in's credential authority for `cluster` behind a real peer; the agent's key
    store in `state` (closed on exit)."""
    clock = ManualClock(start=1_700_000_000.0)
    authority = CredentialAuthority(cluster, bearers, clock=clock, **options)
    keys = KeyStore.open(state)
    events: list[tuple[str, dict[str, Any]]] = []
    routes = authority.routes(lambda kind, **detail: events.append((kind, detail)))
    try:
        async with peers(Routes(), edit(routes) if edit else routes) as (agent, _, _, _):
            yield Cloudly(
                authority,
                agent,
                keys,
                Enrollment(keys, call_timeout=5.0, clock=clock),
                clock,
                events,
                view_of(cluster, *bearers),
            )
    finally:
        keys.close()
