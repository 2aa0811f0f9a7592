"""CloudlySession over time: reconnect with backoff, re-authenticate, re-read, renew identity."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from agent.clock import SYSTEM_CLOCK
from agent.retry import Backoff
from agent.secret import Secret
from agent.session.client import CloudlySession, SessionSettings
from agent.watch.status import AgentStatus, SessionState
from devstack.cloudly import StandInCloudly, cluster_document
from tests.clock import ManualClock
from tests.session._helpers import is_connected, running

TOKEN = "machine-token-5b8e0d1f2a3c4e6f"


def _session(
    cloudly: StandInCloudly,
    status: AgentStatus,
    *,
    clock: ManualClock | None = None,
    rng_value: float = 0.0,
    margin: float = 60.0,
) -> CloudlySession:
    settings = SessionSettings(
        url=cloudly.url,
        tag_name="restore-agent",
        tag_payload={},
        max_frame_bytes=16 * 2**20,
        close_timeout=2.0,
        call_timeout=10.0,
        identity_renew_margin_s=margin,
        backoff=Backoff(base=1.0, cap=60.0),
        stable_after=60.0,
        # The keepalive sleeps on the same clock: keep its pings beyond what these tests step.
        ping_interval=86_400.0,
    )
    return CloudlySession(
        settings, Secret(TOKEN), status, clock=clock or SYSTEM_CLOCK, rng=lambda: rng_value
    )


def _reconnected(times: int) -> Any:
    return lambda s: s.state is SessionState.CONNECTED and s.reconnect_count >= times


@pytest.fixture
async def cloudly() -> AsyncIterator[StandInCloudly]:
    document = cluster_document("cluster-1", {"node-1": "http://10.0.0.1:3000"})
    async with StandInCloudly(token=TOKEN, cluster=document) as server:
        yield server


@pytest.mark.parametrize(("code", "abort"), [(1012, False), (1011, False), (None, True)])
async def test_dropped_connection_is_reestablished_and_reauthenticated(
    cloudly: StandInCloudly, code: int | None, abort: bool
) -> None:
    """After Cloudly drops the socket (close frame or cut TCP) the agent connects again,
    re-authenticates, re-tags and re-reads the cluster document."""
    status = AgentStatus()
    async with running(_session(cloudly, status)):
        await status.wait_until(is_connected)
        await cloudly.drop_connections(code or 1000, abort=abort)
        snapshot = await status.wait_until(_reconnected(1))
    second = [event.kind for event in cloudly.events if event.connection == 2]
    assert second[:4] == ["connected", "identity-issued", "tag-set", "cluster-config-read"]
    assert snapshot.reconnect_count == 1
    assert snapshot.last_error is not None
    assert snapshot.last_error.startswith("session closed with code")


async def test_cloudly_restart_is_survived(cloudly: StandInCloudly) -> None:
    """Cloudly restarting on the same port: the agent comes back on the new server."""
    status = AgentStatus()
    async with running(_session(cloudly, status)):
        await status.wait_until(is_connected)
        await cloudly.restart()
        await status.wait_until(_reconnected(1))
    assert cloudly.count("identity-issued") == 2
    assert cloudly.count("cluster-config-read") == 2


async def test_reconnect_reads_the_cluster_document_again(cloudly: StandInCloudly) -> None:
    """A document changed while the agent was away is what it publishes after reconnecting."""
    status = AgentStatus()
    async with running(_session(cloudly, status)):
        await status.wait_until(is_connected)
        cloudly.cluster = cluster_document("cluster-1", {"node-1": "http://10.0.0.9:3000"})
        await cloudly.drop_connections()
        snapshot = await status.wait_until(_reconnected(1))
    assert snapshot.cluster is not None
    assert snapshot.cluster.nodes[0].corestore_endpoint == "http://10.0.0.9:3000"


async def test_unreachable_cloudly_is_retried_after_the_backoff_delay(
    cloudly: StandInCloudly,
) -> None:
    """With Cloudly down the session waits the jittered delay on its clock, then tries again."""
    clock = ManualClock()
    status = AgentStatus()
    await cloudly.stop()
    async with running(_session(cloudly, status, clock=clock, rng_value=0.5)):
        first = await clock.next_wakeup()
        backing_off = status.snapshot()
        await cloudly.start()
        clock.advance(first - clock.monotonic())
        await status.wait_until(is_connected)
    assert first == 0.5  # half of the first 1 s window
    assert backing_off.state is SessionState.BACKING_OFF
    assert backing_off.last_error is not None
    assert "could not reach Cloudly" in backing_off.last_error


async def test_backoff_window_grows_while_attempts_keep_failing(cloudly: StandInCloudly) -> None:
    """Consecutive failures double the window: full draws give 1 s, then 2 s, then 4 s."""
    clock = ManualClock()
    status = AgentStatus()
    await cloudly.stop()
    waits: list[float] = []
    async with running(_session(cloudly, status, clock=clock, rng_value=1.0)):
        for _ in range(3):
            waits.append(await clock.run_until_sleeping())
        await clock.next_wakeup()
    assert waits == [1.0, 2.0, 4.0]


async def test_identity_is_renewed_the_margin_before_it_expires() -> None:
    """With a 600 s identity and a 60 s margin the session renews at 540 s on the same socket."""
    clock = ManualClock()
    document = cluster_document("cluster-1", {"node-1": "http://10.0.0.1:3000"})
    status = AgentStatus()
    async with (
        StandInCloudly(
            token=TOKEN, cluster=document, identity_lifetime_s=600.0, clock=clock
        ) as cloudly,
        running(_session(cloudly, status, clock=clock, margin=60.0)),
    ):
        first = await status.wait_until(is_connected)
        wakeup = await clock.next_wakeup()
        clock.advance(wakeup - clock.monotonic())
        second = await cloudly.wait_for("identity-issued", count=2)
        renewed = await status.wait_until(
            lambda s: s.identity_expires_at_ms == second.detail["expires_at"]
        )
    assert wakeup == 540.0
    assert first.identity_expires_at_ms == int((clock.start + 600.0) * 1000)
    assert second.detail["expires_at"] == int((clock.start + 1140.0) * 1000)
    assert second.connection == 1  # renewed in place, no reconnect
    assert renewed.state is SessionState.CONNECTED
    assert renewed.reconnect_count == 0


async def test_identity_expired_on_arrival_is_retried(cloudly: StandInCloudly) -> None:
    """An identity that is already expired (clock skew) fails the attempt loudly and is retried."""
    cloudly.identity_lifetime_s = -5.0
    status = AgentStatus()
    async with running(_session(cloudly, status)):
        await cloudly.wait_for("identity-issued", count=2)
        snapshot = await status.wait_until(lambda s: s.last_error is not None)
    assert snapshot.last_error is not None
    assert "already expired" in snapshot.last_error


class _BrokenClock(ManualClock):
    """A clock whose waits fail: stands in for a bug inside the session."""

    async def sleep(self, seconds: float) -> None:
        raise ValueError("clock broke")


async def test_a_bug_ends_run_instead_of_being_retried(cloudly: StandInCloudly) -> None:
    """An exception that is no session loss propagates out of `run()`; nothing reconnects."""
    status = AgentStatus()
    session = _session(cloudly, status, clock=_BrokenClock())
    with pytest.raises(ExceptionGroup) as caught:
        await session.run()
    assert caught.group_contains(ValueError, match="clock broke")
    assert status.snapshot().state is SessionState.STOPPED
    assert cloudly.count("connected") == 1
    closed = await cloudly.wait_for("disconnected")
    assert closed.detail["code"] == 1011
