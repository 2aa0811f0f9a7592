"""The session's connect step and cluster-view watcher: where the recipient enrollment runs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from agent.contracts.cluster import ClusterView
from agent.credentials.enrollment import Enrollment
from agent.credentials.keys import KeyStore
from agent.errors import CallFailed, EnrollmentFailed
from agent.protocol.handlers import Caller, RequestContext, Routes
from agent.secret import Secret
from agent.session.client import CloudlySession, SessionSettings
from agent.watch.status import AgentStatus, SessionState
from devstack.cloudly import StandInCloudly, cluster_document
from devstack.credentials import CredentialAuthority
from tests.session._helpers import body_route, is_connected, running

TOKEN = "machine-token-2c6b1f9e40a7d385"
CLUSTER = "cluster-1"


@pytest.fixture
async def cloudly() -> AsyncIterator[StandInCloudly]:
    authority = CredentialAuthority(CLUSTER, {"node-1": "bearer-1-SENTINEL-aa01"})
    document = cluster_document(CLUSTER, {"node-1": "http://10.0.0.1:3000"})
    async with StandInCloudly(token=TOKEN, cluster=document, credentials=authority) as server:
        yield server


def _session(cloudly: StandInCloudly, status: AgentStatus, **wiring: Any) -> CloudlySession:
    settings = SessionSettings(
        url=cloudly.url, tag_name="restore-agent", tag_payload={}, max_frame_bytes=2**24
    )
    return CloudlySession(settings, Secret(TOKEN), status, rng=lambda: 0.0, **wiring)


async def test_the_connect_step_runs_after_the_cluster_is_read_and_before_serving(
    cloudly: StandInCloudly,
) -> None:
    """A step sees the connection and the fresh cluster view; the session is connected only
    after it returned."""
    status = AgentStatus()
    seen: list[tuple[str, SessionState]] = []

    async def step(caller: Caller, view: ClusterView) -> None:
        seen.append((view.cluster_id, status.state))
        reply = await caller.call("__typedsocket_setTag", {"name": "x"}, timeout=5.0)
        assert reply == {"success": True}

    session = _session(cloudly, status, connect_step=step)
    async with running(session):
        await status.wait_until(is_connected)
    assert seen == [(CLUSTER, SessionState.AUTHENTICATING)]
    kinds = [event.kind for event in cloudly.events if event.connection == 1]
    assert kinds[1:5] == ["identity-issued", "tag-set", "cluster-config-read", "tag-set"]


async def test_a_request_before_the_connect_step_finished_is_not_ready_and_never_handled(
    cloudly: StandInCloudly,
) -> None:
    """While a step still runs the session serves nothing: Cloudly's request is answered
    `not-ready` (retryable) without running its handler. Serving starts with `connected`, and
    `cloudly_connected` is logged before the first request is handled."""
    status = AgentStatus()
    in_step, finish_step = asyncio.Event(), asyncio.Event()
    handled: list[dict[str, Any]] = []

    async def step(caller: Caller, view: ClusterView) -> None:
        in_step.set()
        await finish_step.wait()

    async def echo(body: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        structlog.get_logger("test").info("echo_handled")
        handled.append(body)
        return body

    session = _session(
        cloudly, status, routes=Routes([body_route("echo", echo)]), connect_step=step
    )
    with structlog.testing.capture_logs() as logs:
        async with running(session):
            await in_step.wait()
            with pytest.raises(CallFailed) as refused:
                await cloudly.call_agent("echo", {"n": 1}, timeout=5)
            handled_while_in_step = list(handled)
            finish_step.set()
            await status.wait_until(is_connected)
            answer = await cloudly.call_agent("echo", {"n": 2}, timeout=5)
    assert refused.value.error_data == {"code": "not-ready", "retryable": True}
    assert (handled_while_in_step, answer) == ([], {"n": 2})
    events = [entry["event"] for entry in logs]
    assert events.index("request_refused") < events.index("cloudly_connected")
    assert events.index("cloudly_connected") < events.index("echo_handled")


async def test_the_enrollment_step_enrolls_on_connect_once(
    cloudly: StandInCloudly, tmp_path: Path
) -> None:
    """With the enrollment as a step, a fresh key is enrolled on the first connect; after a
    reconnect the recorded enrollment is reused (no second enrollment)."""
    keys = KeyStore.open(tmp_path)
    enrollment = Enrollment(keys)
    status = AgentStatus()
    session = _session(
        cloudly,
        status,
        connect_step=lambda caller, view: enrollment.ensure(caller, view.cluster_id),
    )
    try:
        async with running(session):
            await status.wait_until(is_connected)
            await cloudly.drop_connections()
            await cloudly.wait_for("cluster-config-read", 2)
            await status.wait_until(lambda s: is_connected(s) and s.reconnect_count == 1)
    finally:
        keys.close()
    assert cloudly.count("recipient-enrolled") == 1
    assert keys.enrollment is not None
    assert cloudly.credentials is not None
    assert cloudly.credentials.recipients == (keys.enrollment.recipient_id,)


async def test_a_failed_step_ends_the_attempt_and_the_session_retries(
    cloudly: StandInCloudly,
) -> None:
    """EnrollmentFailed in a step: never connected, the error logged and recorded, the session
    backs off and tries again (and connects once the step succeeds)."""
    status = AgentStatus()
    attempts: list[int] = []

    async def flaky(caller: Caller, view: ClusterView) -> None:
        attempts.append(len(attempts) + 1)
        if len(attempts) == 1:
            raise EnrollmentFailed("Cloudly refused beginSecretRecipientEnrollment: not now")

    session = _session(cloudly, status, connect_step=flaky)
    with structlog.testing.capture_logs() as events:
        async with running(session):
            await status.wait_until(is_connected)
    assert attempts == [1, 2]
    failed = [event for event in events if event["event"] == "cloudly_enrollment_failed"]
    assert [event["log_level"] for event in failed] == ["error"]
    assert failed[0]["error"] == "Cloudly refused beginSecretRecipientEnrollment: not now"
    snapshot = status.snapshot()
    assert snapshot.reconnect_count == 1
    assert snapshot.last_error == "Cloudly refused beginSecretRecipientEnrollment: not now"


async def test_the_watcher_sees_every_published_cluster_view(cloudly: StandInCloudly) -> None:
    """The connect read and each pushClusterConfig reach the watcher, in order."""
    status = AgentStatus()
    views: list[Any] = []
    session = _session(cloudly, status, view_watcher=lambda view: views.append(sorted(view.nodes)))
    async with running(session):
        await status.wait_until(is_connected)
        await cloudly.push_cluster_config(
            cluster_document(CLUSTER, {"node-2": "http://10.0.0.2:3000"})
        )
    assert views == [["node-1"], ["node-2"]]
