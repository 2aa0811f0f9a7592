"""The whole agent on one clock moved by hand: `app.run(clock=...)` gives it to every part, so a
reconnect's backoff, a retention pass and a stream's stall bound each come when that clock
passes them, and not before, with no real time waited for them.

The real agent runs in-process against the stand-in Cloudly and the reference Corestore, both
on 127.0.0.1 port 0. The stand-in and its credential authority keep the same clock, so the
identities and enrollments they issue are valid in the agent's time however far it is moved.
A test moves the clock only once the wait it means to end has begun (`ManualClock.until`), then
waits for the outcome with a real-time safety bound: nothing sleeps to let something happen.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from agent.config import Config
from agent.domain.job_machine import JobOp
from agent.domain.jobs import JobKey
from agent.entry import app
from agent.errors import CallFailed
from agent.protocol.connection import ConnectionSettings
from agent.protocol.settings import StreamSettings
from agent.store import RevisionStore
from agent.store.retention import DAY_S
from agent.watch.status import AgentStatus, SessionState
from devstack.cloudly import StandInCloudly, cluster_document
from devstack.corestore import CorestoreHandle, start
from devstack.credentials import CredentialAuthority
from tests.clock import ManualClock

TOKEN = "clock-machine-token-5e1d0c2b9a"
BEARER = "clock-corestore-bearer-7f3a91"
CLUSTER, NODE = "cluster-clock", "node-clock"
SERVICE_ID = "svc-app"
KiB = 1024
BACKOFF_S = 0.5  # the reconnect window, base and cap alike: every draw lies below it
STALL_S = 45.0  # [streams] stall_timeout_s: no other wait of the agent lasts as long
SAFETY_S = 30.0  # real seconds a whole test may take, shutdown included


def _secret_file(path: Path, value: str) -> Path:
    path.write_text(value + "\n")
    path.chmod(0o600)
    return path


@dataclass
class Agent:
    """The running agent: its status (on the test's clock) and its health endpoint."""

    status: AgentStatus
    address: str


@pytest.fixture
def clock() -> ManualClock:
    """The one clock of the agent, the stand-in Cloudly and its credential authority."""
    return ManualClock()


@pytest.fixture
async def corestore(tmp_path: Path) -> AsyncIterator[CorestoreHandle]:
    """The reference Corestore on 127.0.0.1, port 0."""
    async with await start(data_dir=tmp_path / "corestore", bearer=BEARER) as handle:
        yield handle


@pytest.fixture
async def cloudly(
    tmp_path: Path, clock: ManualClock, corestore: CorestoreHandle
) -> AsyncIterator[StandInCloudly]:
    """The stand-in Cloudly on the test's clock, its one node's Corestore the reference one.
    Its own peer keeps real time; its streams' idle bound is far beyond any test's length, so
    only the agent's bounds, on the moved clock, decide a stream's fate."""
    patient = ConnectionSettings(streams=StreamSettings(idle_timeout=3600.0))
    async with StandInCloudly(
        token=TOKEN,
        cluster=cluster_document(CLUSTER, {NODE: corestore.url}),
        clock=clock,
        credentials=CredentialAuthority(CLUSTER, {NODE: BEARER}, clock=clock),
        peer_settings=patient,
        closures_dir=tmp_path / "cloudly-closures",
    ) as server:
        yield server


@asynccontextmanager
async def _running(
    tmp_path: Path, cloudly: StandInCloudly, clock: ManualClock
) -> AsyncIterator[Agent]:
    """`app.run` on `clock`, connected; stopped on exit. The agent's streams break on their
    stall bound only: their idle bound is far beyond it."""
    config = Config.model_validate(
        {
            "cloudly": {
                "url": cloudly.url,
                "token_file": str(_secret_file(tmp_path / "token", TOKEN)),
                "backoff_base_s": BACKOFF_S,
                "backoff_cap_s": BACKOFF_S,
            },
            "corestore": {"chunk_size": 64 * KiB, "retries": 1, "outage_tolerance_s": 0},
            "state": {"directory": str(tmp_path / "state"), "retention_days": 1},
            "streams": {"stall_timeout_s": STALL_S, "idle_timeout_s": 3600.0},
            "shutdown": {"drain_timeout_s": 2.0, "close_timeout_s": 2.0},
            "health": {"listen": "127.0.0.1:0"},
        }
    )
    status, stop = AgentStatus(clock=clock), asyncio.Event()
    addresses: list[str] = []
    async with asyncio.timeout(SAFETY_S), asyncio.TaskGroup() as group:
        group.create_task(
            app.run(
                config,
                stop=stop,
                status=status,
                clock=clock,
                handle_signals=False,
                on_ready=addresses.append,
            ),
            name="agent",
        )
        try:
            await status.wait_until(lambda s: s.state is SessionState.CONNECTED)
            yield Agent(status, addresses[0])
        finally:
            stop.set()


async def _jobs(agent: Agent) -> list[dict[str, Any]]:
    """`/v1/jobs`: the relay jobs the agent's store holds."""
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://{agent.address}/v1/jobs") as response,
    ):
        assert response.status == 200
        body: dict[str, Any] = await response.json()
    return list(body["jobs"])


async def _round_trip(agent: Agent) -> None:
    """One request to the agent's health endpoint: the event loop turns it takes (several polls
    of its sockets) give whatever the clock's last move woke the chance to act, so a check read
    after it sees what that wake did (its first steps need a few turns and no I/O)."""
    await _jobs(agent)


async def test_the_agent_reconnects_once_its_backoff_passed_on_its_clock(
    tmp_path: Path, cloudly: StandInCloudly, clock: ManualClock
) -> None:
    """Cloudly drops the session: the agent waits its backoff on the clock it was given, still
    waiting halfway through it, and connects again once the clock is moved to its end."""
    async with _running(tmp_path, cloudly, clock) as agent:
        asked = len(clock.slept)
        await cloudly.drop_connections()
        # Every other wait of the agent is a second or more: a shorter one is the backoff.
        await clock.until(lambda: any(0 < d < BACKOFF_S for d in clock.slept[asked:]))
        [delay] = [d for d in clock.slept[asked:] if 0 < d < BACKOFF_S]
        deadline = clock.monotonic() + delay
        clock.advance(delay / 2)
        await _round_trip(agent)
        waiting = agent.status.state, deadline in clock.sleepers, cloudly.count("connected")
        clock.advance(deadline - clock.monotonic())
        await cloudly.wait_for("connected", 2)
        await agent.status.wait_until(lambda s: s.state is SessionState.CONNECTED)
    assert waiting == (SessionState.BACKING_OFF, True, 1)
    assert cloudly.count("connected") == 2


async def test_a_retention_pass_comes_each_time_its_interval_passed_on_the_agents_clock(
    tmp_path: Path, cloudly: StandInCloudly, clock: ManualClock
) -> None:
    """A relay job that finished 23.5 hours ago (`retention_days = 1`) expires half an hour
    into the run: the pass a minute in keeps it, it is still there a second before the next
    pass an interval (an hour) later, and that pass forgets it."""
    earlier = ManualClock(start=clock.start - DAY_S + 1800.0)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    async with await RevisionStore.open(state, clock=earlier) as store:
        key = JobKey(CLUSTER, NODE, "backup", "bk-old", SERVICE_ID)
        await store.move_job(key, op=JobOp.START, expected_revision=0, digest="d" * 64)
        await store.move_job(key, op=JobOp.SUCCEED, expected_revision=1, digest="d" * 64)
    async with _running(tmp_path, cloudly, clock) as agent:
        await clock.until(lambda: 60.0 in clock.sleepers)  # the first pass, a minute in
        clock.advance(60.0)
        await clock.until(lambda: 3660.0 in clock.sleepers)  # that pass done, the next asleep
        after_first = await _jobs(agent)
        clock.advance(3599.0)  # expired since 1800 s; the next pass is due at 3660 s
        before_next = await _jobs(agent)
        clock.advance(1.0)
        await clock.until(lambda: 7260.0 in clock.sleepers)
        after_next = await _jobs(agent)
    assert [job["backupId"] for job in after_first] == ["bk-old"]
    assert [job["backupId"] for job in before_next] == ["bk-old"]
    assert after_next == []


async def test_a_stream_that_stops_moving_breaks_after_the_stall_bound_on_the_agents_clock(
    tmp_path: Path, cloudly: StandInCloudly, clock: ManualClock, corestore: CorestoreHandle
) -> None:
    """A backup's closure that Cloudly stops reading: the agent's stream waits, still waiting a
    second short of `stall_timeout_s` on its clock, and breaks at it; the backup fails
    `transfer-interrupted`, retryable."""
    # Two chunks: fewer than the stream's window, so the agent never waits for room; its one
    # wait is for the closing bit's acknowledgement, begun once, its deadline fixed then.
    database = hashlib.shake_256(b"stalled on the agent's clock").digest(100 * KiB)
    corestore.services.write_database(SERVICE_ID, [database])
    cloudly.stall_next_closure(1)
    request = {"nodeId": NODE, "backupId": "bk-1", "service": {"id": SERVICE_ID, "data": {}}}
    async with _running(tmp_path, cloudly, clock):
        backup = asyncio.create_task(cloudly.call_agent("backupClusterService", request))
        await cloudly.wait_for("closure-stalled")
        begun = clock.monotonic()
        await clock.until(lambda: begun + STALL_S in clock.timeouts)
        clock.advance(STALL_S - 1.0)
        waiting = backup.done(), begun + STALL_S in clock.timeouts
        clock.advance(1.0)
        with pytest.raises(CallFailed) as failed:
            await backup
    assert waiting == (False, True)
    assert (failed.value.error_data["code"], failed.value.error_data["retryable"]) == (
        "transfer-interrupted",
        True,
    )
    assert f"within {STALL_S:g} s" in str(failed.value)
