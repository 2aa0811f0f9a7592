"""The agent's session survives the real-library Cloudly going away and coming back.

Two ways Cloudly restarts: the whole Node process is killed (SIGKILL: no close frame, the
agent sees 1006) and a new one listens on the same port; or the server stops and starts
listening again inside one process (its recorded events survive, so both logins are visible).
Synchronisation is the harness's `wait` command and `AgentStatus.wait_until`, never a sleep.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.interop.conftest import CLUSTER_ID, NODE_ID, connected, request_of

if TYPE_CHECKING:
    from tests.interop.conftest import AgentUnderTest, NodeCloudly, Spawn

pytestmark = pytest.mark.interop

REPLACEMENT_ENDPOINT = "http://10.20.30.40:3000"


def corestore_of(agent: AgentUnderTest) -> str | None:
    """The Corestore endpoint the agent currently knows for the test node."""
    view = agent.session.cluster_view
    assert view is not None
    return view.nodes[NODE_ID].corestore_endpoint


@pytest.mark.slow
async def test_session_survives_cloudly_process_killed_and_restarted_on_same_port(
    cloudly: NodeCloudly, agent: AgentUnderTest, spawn_cloudly: Spawn
) -> None:
    """Kill -9, new process on the same port: the agent logs in again and re-reads the cluster."""
    async with agent.running() as first:
        assert first.reconnect_count == 0
        await cloudly.kill()
        await agent.wait_until(lambda s: s.state is not first.state)
        replacement = await spawn_cloudly(
            port=cloudly.port, args=["--corestore-endpoint", REPLACEMENT_ENDPOINT]
        )
        events = await replacement.wait_for("calls", 1, method="getClusterConfig")
        again = await agent.wait_until(lambda s: connected(s) and s.reconnect_count >= 1)
        # the cluster document of the NEW process is the one the agent now routes by
        assert corestore_of(agent) == REPLACEMENT_ENDPOINT
        echoed = await agent.session.call("echo", {"after": "restart"}, timeout=10)
    assert echoed == {"after": "restart"}
    assert again.cluster_id == CLUSTER_ID
    assert len(events["identities"]) == 1
    [tag] = events["tags"]
    assert tag["name"] == "restore-agent"
    [read] = request_of(events, "getClusterConfig")
    assert read["identity"]["jwt"] == events["identities"][0]["jwt"]


async def test_session_survives_cloudly_server_restart_and_logs_in_again(
    cloudly: NodeCloudly, agent: AgentUnderTest
) -> None:
    """Server stop/start in one process: a second getIdentityByToken and getClusterConfig follow."""
    async with agent.running():
        restarted = await cloudly.command("restart", mode="close", code=1012, reason="restart")
        assert restarted["closed"] == 1
        assert restarted["port"] == cloudly.port
        events = await cloudly.wait_for("calls", 2, method="getClusterConfig")
        await agent.wait_until(lambda s: connected(s) and s.reconnect_count >= 1)
    identities = events["identities"]
    assert len(identities) == 2
    assert identities[0]["conn"] != identities[1]["conn"]
    reads = request_of(events, "getClusterConfig")
    # each login's cluster read presents the JWT issued on that connection
    assert [r["identity"]["jwt"] for r in reads] == [i["jwt"] for i in identities]
    [closed] = [c for c in events["connections"] if c["closedAt"] is not None]
    assert closed["closeCode"] == 1012
