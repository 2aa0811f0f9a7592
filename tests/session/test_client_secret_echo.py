"""A Cloudly error that echoes a secret back does not carry it into the status or the log."""

from __future__ import annotations

import asyncio

import structlog

from agent.contracts.cluster import GetClusterConfigRequest
from agent.errors import AuthenticationFailed
from agent.protocol.handlers import RequestContext, Route, Routes
from agent.secret import Secret
from agent.session.client import CloudlySession, SessionSettings
from agent.watch.status import AgentStatus
from devstack.cloudly import AgentConnection, Document, StandInCloudly, cluster_document

TOKEN = "machine-token-5e2b7c4d19a08f3e"


class _EchoingCloudly(StandInCloudly):
    """A Cloudly whose `getClusterConfig` refusal quotes the JWT it was sent."""

    def _routes(self, connection: AgentConnection) -> Routes:
        async def get_cluster_config(
            request: GetClusterConfigRequest, ctx: RequestContext
        ) -> Document:
            self._record("cluster-config-refused", connection.number)
            jwt = request.identity.jwt.reveal()
            raise AuthenticationFailed(f"identity {jwt} is not accepted")

        standard = [r for r in super()._routes(connection) if r.method != "getClusterConfig"]
        return Routes(
            [*standard, Route("getClusterConfig", GetClusterConfigRequest, get_cluster_config)]
        )


async def test_a_jwt_echoed_in_a_cloudly_error_is_masked_in_status_and_log() -> None:
    """The session's last error (status and log event) never holds the JWT Cloudly echoed."""
    status = AgentStatus()
    async with _EchoingCloudly(token=TOKEN, cluster=cluster_document("cluster-1", {})) as cloudly:
        settings = SessionSettings(
            url=cloudly.url,
            tag_name="restore-agent",
            tag_payload={},
            max_frame_bytes=2**20,
            close_timeout=2.0,
        )
        session = CloudlySession(settings, Secret(TOKEN), status, rng=lambda: 0.0)
        with structlog.testing.capture_logs() as logs:
            run = asyncio.create_task(session.run())
            try:
                await cloudly.wait_for("cluster-config-refused", count=2)
                await status.wait_until(lambda s: s.last_error is not None)
                snapshot = status.snapshot()
            finally:
                async with asyncio.timeout(10):
                    await session.close(drain_timeout=1.0)
                    await run
        jwts = cloudly.issued_jwts
    assert jwts
    assert snapshot.last_error is not None
    assert "is not accepted" in snapshot.last_error
    lost = [entry for entry in logs if entry["event"] == "cloudly_session_lost"]
    assert lost
    text = snapshot.last_error + repr(lost) + repr(snapshot.to_dict())
    for jwt in jwts:
        assert jwt not in text
