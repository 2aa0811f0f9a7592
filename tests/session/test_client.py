"""CloudlySession against the stand-in Cloudly: authenticate, tag, read and serve the cluster."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest
import structlog

from agent.contracts.base import StreamMarker
from agent.errors import CallFailed, SessionClosed
from agent.protocol.handlers import RequestContext, Routes
from agent.secret import Secret
from agent.session.client import CloudlySession, SessionSettings
from agent.watch.status import AgentStatus, SessionState
from devstack.cloudly import ABSENT, StandInCloudly, cluster_document
from tests.session._helpers import body_route, is_connected, running

TOKEN = "machine-token-7f3a9c2e51d04b6a"
NODES: Mapping[str, Any] = {
    "node-1": "http://10.20.0.15:3000",
    "node-2": ABSENT,
    "node-3": "http://10.20.0.17:3000/",
}


def _settings(cloudly: StandInCloudly, **overrides: Any) -> SessionSettings:
    values: dict[str, Any] = {
        "url": cloudly.url,
        "tag_name": "restore-agent",
        "tag_payload": {"role": "relay"},
        "max_frame_bytes": 16 * 2**20,
        "close_timeout": 2.0,
        "call_timeout": 10.0,
    }
    values.update(overrides)
    return SessionSettings(**values)


def _session(
    cloudly: StandInCloudly,
    status: AgentStatus,
    token: str = TOKEN,
    routes: Routes | None = None,
) -> CloudlySession:
    # rng 0: every backoff delay is 0, reconnects happen at once.
    return CloudlySession(_settings(cloudly), Secret(token), status, routes=routes, rng=lambda: 0.0)


@pytest.fixture
async def cloudly() -> AsyncIterator[StandInCloudly]:
    async with StandInCloudly(token=TOKEN, cluster=cluster_document("cluster-1", NODES)) as server:
        yield server


async def test_session_authenticates_tags_and_reads_the_cluster(cloudly: StandInCloudly) -> None:
    """One connection: identity by token, then the configured tag, then the cluster document."""
    status = AgentStatus()
    async with running(_session(cloudly, status), drain_timeout=2.0):
        await status.wait_until(is_connected)
    first = [event for event in cloudly.events if event.connection == 1]
    assert [event.kind for event in first][:4] == [
        "connected",
        "identity-issued",
        "tag-set",
        "cluster-config-read",
    ]
    assert first[2].detail == {"name": "restore-agent", "payload": {"role": "relay"}}


async def test_connected_status_holds_cluster_and_identity_expiry(cloudly: StandInCloudly) -> None:
    """Once connected the status names the cluster, its nodes and the identity's expiry."""
    status = AgentStatus()
    async with running(_session(cloudly, status), drain_timeout=2.0):
        snapshot = await status.wait_until(is_connected)
        issued = await cloudly.wait_for("identity-issued")
    assert snapshot.cluster is not None
    assert snapshot.cluster_id == "cluster-1"
    assert [node.node_id for node in snapshot.cluster.nodes] == ["node-1", "node-2", "node-3"]
    assert snapshot.identity_expires_at_ms == issued.detail["expires_at"]
    assert snapshot.connected_since is not None


async def test_nodes_without_valid_corestore_are_reported(cloudly: StandInCloudly) -> None:
    """Absent and non-canonical endpoints are in the status and logged with the reasons."""
    status = AgentStatus()
    with structlog.testing.capture_logs() as logs:
        async with running(_session(cloudly, status), drain_timeout=2.0):
            snapshot = await status.wait_until(is_connected)
    assert snapshot.cluster is not None
    assert snapshot.cluster.nodes_with_corestore == ("node-1",)
    problems = {node.node_id: node.corestore_problems for node in snapshot.cluster.nodes}
    assert problems["node-2"] == ("cluster node node-2 corestore is absent",)
    assert "canonical origin http://10.20.0.17:3000" in problems["node-3"][0]
    warned = {
        entry["node_id"]: entry["problems"]
        for entry in logs
        if entry["event"] == "cluster_node_without_corestore"
    }
    assert warned == {"node-2": list(problems["node-2"]), "node-3": list(problems["node-3"])}
    assert all(
        entry["log_level"] == "warning"
        for entry in logs
        if entry["event"].startswith("cluster_node")
    )


async def test_push_cluster_config_republishes_the_view(cloudly: StandInCloudly) -> None:
    """A pushed document is answered `{}` and replaces the published view."""
    status = AgentStatus()
    session = _session(cloudly, status)
    async with running(session, drain_timeout=2.0):
        await status.wait_until(is_connected)
        fixed = dict(NODES, **{"node-2": "http://10.20.0.16:3000"})
        reply = await cloudly.push_cluster_config(cluster_document("cluster-1", fixed))
        snapshot = status.snapshot()
    assert reply == {}
    assert snapshot.cluster is not None
    assert snapshot.cluster.nodes_with_corestore == ("node-1", "node-2")
    assert session.cluster_view is not None
    assert session.cluster_view.corestore_endpoint("node-2") == "http://10.20.0.16:3000"


async def test_push_for_another_cluster_is_refused(cloudly: StandInCloudly) -> None:
    """A push naming another cluster is refused `misrouted-cluster` and changes nothing."""
    status = AgentStatus()
    async with running(_session(cloudly, status), drain_timeout=2.0):
        before = (await status.wait_until(is_connected)).cluster
        with pytest.raises(CallFailed) as caught:
            await cloudly.push_cluster_config(cluster_document("cluster-2", {"n": "http://a:1"}))
        after = status.snapshot().cluster
    assert caught.value.error_data["code"] == "misrouted-cluster"
    assert after == before


async def test_malformed_push_is_refused_as_invalid_request(cloudly: StandInCloudly) -> None:
    """A push whose document lacks its nodes is refused `invalid-request` naming the field."""
    status = AgentStatus()
    async with running(_session(cloudly, status), drain_timeout=2.0):
        await status.wait_until(is_connected)
        with pytest.raises(CallFailed) as caught:
            await cloudly.call_agent(
                "pushClusterConfig", {"configData": {"id": "c"}, "services": []}
            )
    assert caught.value.error_data["code"] == "invalid-request"
    assert "configData.data" in caught.value.text


async def test_wrong_token_is_logged_loudly_once_and_retried(cloudly: StandInCloudly) -> None:
    """A refused token is a permanent fault: one error line (identical refusals after it only
    at debug), the status says it, and it is retried with backoff until the token is valid."""
    status = AgentStatus()
    rotated = "machine-token-rotated-0c1d2e3f"
    with structlog.testing.capture_logs() as logs:
        async with running(_session(cloudly, status, token=rotated), drain_timeout=2.0):
            await cloudly.wait_for("identity-refused", count=3)
            refused = status.snapshot()
            cloudly.set_token(rotated)
            await status.wait_until(is_connected)
    assert refused.last_error is not None
    assert refused.last_error.startswith("Cloudly refused the machine token")
    loud = [
        entry
        for entry in logs
        if entry["event"].startswith("cloudly_") and entry["log_level"] in ("warning", "error")
    ]
    assert [(entry["event"], entry["log_level"], entry["cause"]) for entry in loud] == [
        ("cloudly_authentication_failed", "error", "token-refused")
    ]
    repeats = [entry for entry in logs if entry["event"] == "cloudly_attempt_failed"]
    assert len(repeats) >= 2
    assert {entry["log_level"] for entry in repeats} == {"debug"}


async def test_refused_tag_is_not_ignored(cloudly: StandInCloudly) -> None:
    """Cloudly answering `success: false` to the tag fails the session attempt and is retried."""
    cloudly.accept_tags = False
    status = AgentStatus()
    async with running(_session(cloudly, status), drain_timeout=2.0):
        await cloudly.wait_for("tag-refused", count=2)
        snapshot = status.snapshot()
    assert snapshot.last_error == "Cloudly did not accept the connection tag restore-agent"
    assert cloudly.count("cluster-config-read") == 0


async def test_secrets_never_reach_the_logs(
    cloudly: StandInCloudly, caplog: pytest.LogCaptureFixture
) -> None:
    """Neither the machine token nor any issued JWT appears in any log line or the status."""
    caplog.set_level(logging.DEBUG)
    status = AgentStatus()
    with structlog.testing.capture_logs() as logs:
        async with running(_session(cloudly, status), drain_timeout=2.0):
            await status.wait_until(is_connected)
            await cloudly.push_cluster_config()
            await cloudly.drop_connections()
            await cloudly.wait_for("cluster-config-read", count=2)
            snapshot = status.snapshot()
    assert cloudly.count("identity-issued") >= 2
    text = repr(logs) + caplog.text + repr(snapshot.to_dict())
    assert logs
    for secret in (TOKEN, *cloudly.issued_jwts):
        assert secret not in text


async def test_the_agents_routes_answer_cloudly(cloudly: StandInCloudly) -> None:
    """The routes the session is built with answer Cloudly's calls on every connection."""
    status = AgentStatus()

    async def echo(request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        return {"echoed": request["value"], "method": ctx.method}

    session = _session(cloudly, status, routes=Routes([body_route("echo", echo)]))
    async with running(session, drain_timeout=2.0):
        await status.wait_until(is_connected)
        reply = await cloudly.call_agent("echo", {"value": "hi"})
    assert reply == {"echoed": "hi", "method": "echo"}


async def test_cloudly_streams_bytes_into_a_handler(cloudly: StandInCloudly) -> None:
    """Cloudly as initiator writes a stream while its call is pending; the handler reads it."""
    status = AgentStatus()

    async def ingest(request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        digest, size = hashlib.sha256(), 0
        async for chunk in ctx.receive_stream(StreamMarker.from_wire(request["data"])):
            digest.update(chunk)
            size += len(chunk)
        return {"size": size, "sha256": digest.hexdigest()}

    session = _session(cloudly, status, routes=Routes([body_route("ingest", ingest)]))
    chunks = [bytes([n]) * (64 * 1024 + n) for n in range(5)]
    async with running(session, drain_timeout=2.0):
        await status.wait_until(is_connected)
        marker, sink = cloudly.open_send_stream()

        async def write() -> None:
            for chunk in chunks:
                await sink.write(chunk)
            await sink.close()

        async with asyncio.TaskGroup() as group:
            call = group.create_task(cloudly.call_agent("ingest", {"data": marker}))
            group.create_task(write())
    everything = b"".join(chunks)
    assert call.result() == {
        "size": len(everything),
        "sha256": hashlib.sha256(everything).hexdigest(),
    }


async def test_session_call_goes_to_cloudly_and_fails_when_disconnected(
    cloudly: StandInCloudly,
) -> None:
    """`call()` uses the live connection; without one it raises SessionClosed at once."""
    status = AgentStatus()
    session = _session(cloudly, status)
    with pytest.raises(SessionClosed):
        await session.call("getClusterConfig", {}, timeout=1.0)
    async with running(session, drain_timeout=2.0):
        await status.wait_until(is_connected)
        with pytest.raises(CallFailed) as caught:
            await session.call("noSuchMethod", {}, timeout=5.0)
    assert caught.value.error_data["code"] == "unknown-method"


async def test_close_drains_in_flight_work_and_says_going_away(cloudly: StandInCloudly) -> None:
    """close(): new requests get `shutting-down`, the running one finishes, then close 1001."""
    status = AgentStatus()
    started, release = asyncio.Event(), asyncio.Event()

    async def slow(request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        started.set()
        await release.wait()
        return {"done": True}

    session = _session(cloudly, status, routes=Routes([body_route("slow", slow)]))
    task = asyncio.create_task(session.run())
    await status.wait_until(is_connected)
    async with asyncio.TaskGroup() as group:
        pending = group.create_task(cloudly.call_agent("slow", {}))
        await started.wait()
        busy = status.snapshot()
        closing = group.create_task(session.close(drain_timeout=10.0))
        await status.wait_until(lambda s: s.state is SessionState.DRAINING)
        with pytest.raises(CallFailed) as refused:
            await cloudly.call_agent("slow", {})
        release.set()
    await task
    assert busy.in_flight == 1
    assert pending.result() == {"done": True}
    assert closing.done()
    assert refused.value.error_data["code"] == "shutting-down"
    closed = await cloudly.wait_for("disconnected")
    assert closed.detail["code"] == 1001
    assert status.snapshot().state is SessionState.STOPPED


# --- what the agent uses of Cloudly's answers ---------------------------------------------------


def _without(field: str) -> Any:
    return lambda body: {key: value for key, value in body.items() if key != field}


async def test_a_cluster_answer_without_services_connects_and_is_noted_once(
    cloudly: StandInCloudly,
) -> None:
    """`services` (unused by the agent) missing: connected, one warning naming the field,
    however often it is read again."""
    cloudly.answer_edits["getClusterConfig"] = _without("services")
    status = AgentStatus()
    with structlog.testing.capture_logs() as logs:
        async with running(_session(cloudly, status), drain_timeout=2.0):
            await status.wait_until(is_connected)
            await cloudly.drop_connections()
            await status.wait_until(lambda s: is_connected(s) and s.reconnect_count == 1)
    noted = [entry for entry in logs if entry["event"] == "cloudly_answer_deviates"]
    assert [(entry["method"], entry["field"], entry["log_level"]) for entry in noted] == [
        ("getClusterConfig", "services", "warning")
    ]
    assert cloudly.count("cluster-config-read") == 2


async def test_an_identity_without_the_fields_the_agent_does_not_use_is_accepted(
    cloudly: StandInCloudly,
) -> None:
    """An identity with only `jwt` and `expiresAt` authenticates (the rest is not used)."""
    cloudly.answer_edits["getIdentityByToken"] = lambda body: {
        "identity": {key: body["identity"][key] for key in ("jwt", "expiresAt")}
    }
    status = AgentStatus()
    async with running(_session(cloudly, status), drain_timeout=2.0):
        snapshot = await status.wait_until(is_connected)
    assert snapshot.identity_expires_at_ms is not None


async def test_an_unusable_cluster_answer_is_an_error_with_its_reason_and_retried(
    cloudly: StandInCloudly,
) -> None:
    """No `configData`: an error-level line and the status name the field; the session keeps
    trying with backoff (Cloudly may be fixed) instead of connecting without a cluster."""
    cloudly.answer_edits["getClusterConfig"] = _without("configData")
    status = AgentStatus()
    with structlog.testing.capture_logs() as logs:
        async with running(_session(cloudly, status), drain_timeout=2.0):
            await cloudly.wait_for("cluster-config-read", count=2)
            snapshot = await status.wait_until(lambda s: s.last_error is not None)
    assert snapshot.state is not SessionState.CONNECTED
    assert snapshot.last_error == (
        "the getClusterConfig answer is unusable: configData: Field required"
    )
    unusable = [entry for entry in logs if entry["event"] == "cloudly_answer_unusable"]
    assert unusable
    assert {entry["log_level"] for entry in unusable} == {"error"}


async def test_a_push_without_services_is_accepted(cloudly: StandInCloudly) -> None:
    """Cloudly pushing only `configData` is answered `{}` and republishes the view."""
    status = AgentStatus()
    with structlog.testing.capture_logs() as logs:
        async with running(_session(cloudly, status), drain_timeout=2.0):
            await status.wait_until(is_connected)
            fixed = cluster_document("cluster-1", {"node-1": "http://10.20.0.99:3000"})
            reply = await cloudly.call_agent("pushClusterConfig", {"configData": fixed})
            snapshot = status.snapshot()
    assert reply == {}
    assert snapshot.cluster is not None
    assert snapshot.cluster.nodes[0].corestore_endpoint == "http://10.20.0.99:3000"
    noted = [entry["field"] for entry in logs if entry["event"] == "cloudly_answer_deviates"]
    assert noted == ["services"]


async def test_a_stray_stream_frame_from_cloudly_gets_one_answer(cloudly: StandInCloudly) -> None:
    """A keepAlive for a stream nobody knows: the agent echoes it once and never answers the
    echo the stand-in sends back (no frame loop on the session)."""
    status = AgentStatus()
    stray = {
        "method": "##VirtualStream##",
        "request": {
            "streamId": "nobody",
            "cycleId": "stray-1",
            "cycle": "request",
            "mainPurpose": "keepAlive",
            "keepAlive": True,
        },
        "response": None,
    }
    async with running(_session(cloudly, status), drain_timeout=2.0):
        await status.wait_until(is_connected)
        await cloudly.connection.transport.send(json.dumps(stray).encode())
        for _ in range(3):  # round trips on the same socket: a loop would show up in between
            assert await cloudly.push_cluster_config() == {}
        received = cloudly.connection.stream_frames_received
    assert received == 1
