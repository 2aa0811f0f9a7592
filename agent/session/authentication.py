"""`Authentication`: the session's handshakes, driven over a connection.

The sans-I/O `Handshake` (`agent.session.handshake`) says which call is due and what each
answer means; this is the one place that makes those calls (on a `Caller`: the connection's
peer) and applies the outcomes: an identity's expiry goes into the status, a cluster document
read is published (`agent.session.cluster`), a tolerated deviation is noted, and a failure is
raised as the session error it is. `connect()` authenticates, tags the connection and reads the
cluster document; `probe()` does the same untagged; `keep_fresh()` renews the identity on the
live connection `identity_renew_margin_s` before it expires (`cloudly_identity_renewed`).
"""

from __future__ import annotations

from typing import Any, NoReturn

import structlog

from agent.clock import Clock
from agent.contracts.cluster import (
    METHOD_GET_CLUSTER_CONFIG,
    ClusterView,
    SetTagRequest,
    UsedIdentity,
)
from agent.errors import CallFailed
from agent.protocol.handlers import Caller
from agent.secret import Secret
from agent.session.cluster import ClusterKnowledge
from agent.session.handshake import (
    Authenticated,
    ClusterRead,
    Handshake,
    StepFailed,
    masked,
    renew_delay,
)
from agent.session.settings import SessionSettings
from agent.watch.status import AgentStatus

__all__ = ["Authentication"]

log = structlog.get_logger("agent.session")


class Authentication:
    """The session's authentication: its token, its tag, and where the answers go."""

    def __init__(
        self,
        token: Secret,
        settings: SessionSettings,
        *,
        cluster: ClusterKnowledge,
        status: AgentStatus,
        clock: Clock,
    ) -> None:
        self._token = token
        self._tag = SetTagRequest(name=settings.tag_name, payload=settings.tag_payload)
        self._call_timeout = settings.call_timeout
        self._renew_margin = settings.identity_renew_margin_s
        self._cluster = cluster
        self._status = status
        self._clock = clock

    def mask(self, text: str) -> str:
        """`text` (foreign: Cloudly's) with the machine token masked."""
        return masked(text, self._token)

    async def connect(self, caller: Caller) -> tuple[UsedIdentity, ClusterView]:
        """Authenticate, tag the connection, read the cluster document."""
        identity = await self._shake(caller, Handshake.connect(self._token, self._tag))
        return identity, self._read_view()

    async def probe(self, caller: Caller) -> ClusterView:
        """Authenticate and read the cluster document, untagged."""
        await self._shake(caller, Handshake.probe(self._token))
        return self._read_view()

    async def keep_fresh(self, caller: Caller, identity: UsedIdentity) -> NoReturn:
        """Renew `identity` before it expires, again and again."""
        while True:
            delay = renew_delay(identity.expires_at, self._clock.time(), self._renew_margin)
            await self._clock.sleep(delay)
            identity = await self._shake(caller, Handshake.renewal(self._token))
            log.info("cloudly_identity_renewed", expires_at_ms=identity.expires_at)

    async def _shake(self, caller: Caller, handshake: Handshake) -> UsedIdentity:
        """Make `handshake`'s calls and apply each outcome; raise the failure it ends with."""
        while (call := handshake.next_call()) is not None:
            try:
                answer: dict[str, Any] | CallFailed = await caller.call(
                    call.method, call.body, timeout=self._call_timeout
                )
            except CallFailed as refused:
                answer = refused
            outcome = handshake.receive(answer, now=self._clock.time())
            self._cluster.note(outcome.deviation)
            if isinstance(outcome, StepFailed):
                raise outcome.error
            if isinstance(outcome, Authenticated):
                self._status.set_identity_expiry(outcome.identity.expires_at)
            elif isinstance(outcome, ClusterRead):
                self._cluster.publish(outcome.view, source=METHOD_GET_CLUSTER_CONFIG)
        identity = handshake.identity
        assert identity is not None  # every plan authenticates first
        return identity

    def _read_view(self) -> ClusterView:
        view = self._cluster.view
        assert view is not None  # the handshake that returned read the cluster document
        return view
