"""The composition root: run until stopped, then drain, close with 1001 and close resources."""

from __future__ import annotations

import asyncio
import secrets
import signal
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import pytest
import structlog

from agent.config import Config
from agent.entry import app, shutdown, systemd
from agent.errors import AgentError, CallFailed, ConfigError, SessionClosed
from agent.log import scrub_text
from agent.protocol.handlers import RequestContext, Routes
from agent.secret import MASK
from agent.startup.preflight import STEP_GRACE_S
from agent.watch.status import AgentStatus, SessionState, StatusSnapshot
from devstack.cloudly import StandInCloudly, cluster_document
from tests.clock import ManualClock
from tests.session._helpers import body_route

TOKEN = "machine-token-a1b2c3d4e5f60718"


def _secret_file(path: Path, value: str) -> Path:
    path.write_text(value + "\n")
    path.chmod(0o600)
    return path


def _config(
    tmp_path: Path,
    cloudly: StandInCloudly,
    *,
    drain_s: float = 10.0,
    credential: str = "corestore-cred-1",
) -> Config:
    return Config.model_validate(
        {
            "cloudly": {
                "url": cloudly.url,
                "token_file": str(_secret_file(tmp_path / "token", TOKEN)),
            },
            "corestore": {
                "credential_source": "file",
                "credential_file": str(_secret_file(tmp_path / "corestore", credential)),
            },
            "state": {"directory": str(tmp_path / "state")},
            "shutdown": {"drain_timeout_s": drain_s, "close_timeout_s": 2.0},
            "health": {"listen": "127.0.0.1:0"},
        }
    )


async def _outcome(call: Awaitable[dict[str, Any]]) -> dict[str, Any] | AgentError:
    try:
        return await call
    except AgentError as exc:
        return exc


def _connected(snapshot: StatusSnapshot) -> bool:
    return snapshot.state is SessionState.CONNECTED


class _SlowWork:
    """An extra route `slow`, which waits for `release`."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.cancelled = False

    def routes(self) -> Routes:
        async def slow(request: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
            self.started.set()
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled = True
                raise
            return {"done": True}

        return Routes([body_route("slow", slow)])


SHUTDOWN_ORDER = [
    "drain in-flight work",
    "close the Cloudly socket",
    "stop the engine's work",
    "stop the relay's jobs",
    "stop the health server",
    "close the Corestore clients",
    "close the store",
]


def _steps(logs: list[dict[str, Any]]) -> list[str]:
    return [entry["step"] for entry in logs if entry["event"] == "shutdown_step_done"]


@pytest.fixture
async def cloudly() -> AsyncIterator[StandInCloudly]:
    document = cluster_document("cluster-1", {"node-1": "http://10.0.0.1:3000"})
    async with StandInCloudly(token=TOKEN, cluster=document) as server:
        yield server


async def test_stop_drains_in_flight_work_then_closes_with_going_away(
    tmp_path: Path, cloudly: StandInCloudly
) -> None:
    """On stop: new requests are refused `shutting-down`, running ones finish, then 1001."""
    stop, status, hook = asyncio.Event(), AgentStatus(), _SlowWork()
    with structlog.testing.capture_logs() as logs:
        async with asyncio.TaskGroup() as group:
            agent = group.create_task(
                app.run(
                    _config(tmp_path, cloudly), stop=stop, status=status, extra_routes=hook.routes()
                )
            )
            await status.wait_until(_connected)
            pending = group.create_task(cloudly.call_agent("slow", {}))
            await hook.started.wait()
            stop.set()
            await status.wait_until(lambda s: s.state is SessionState.DRAINING)
            with pytest.raises(CallFailed) as refused:
                await cloudly.call_agent("slow", {})
            hook.release.set()
    assert agent.result() is None
    assert pending.result() == {"done": True}
    assert refused.value.error_data == {"code": "shutting-down", "retryable": True}
    closed = await cloudly.wait_for("disconnected")
    assert closed.detail["code"] == 1001
    # The health endpoint outlives the socket (it reports the drain); the store closes last.
    assert _steps(logs) == SHUTDOWN_ORDER
    assert status.snapshot().state is SessionState.STOPPED


async def test_work_outliving_the_drain_deadline_is_cancelled(
    tmp_path: Path, cloudly: StandInCloudly
) -> None:
    """A handler still running at `drain_timeout_s` is cancelled; the socket still closes 1001."""
    stop, status, hook = asyncio.Event(), AgentStatus(), _SlowWork()
    config = _config(tmp_path, cloudly, drain_s=0.2)
    async with asyncio.TaskGroup() as group:
        agent = group.create_task(
            app.run(config, stop=stop, status=status, extra_routes=hook.routes())
        )
        await status.wait_until(_connected)
        pending = group.create_task(_outcome(cloudly.call_agent("slow", {})))
        await hook.started.wait()
        stop.set()
    assert agent.result() is None
    assert isinstance(pending.result(), CallFailed | SessionClosed)
    assert hook.cancelled
    closed = await cloudly.wait_for("disconnected")
    assert closed.detail["code"] == 1001


async def test_sigterm_stops_the_agent_in_order(tmp_path: Path, cloudly: StandInCloudly) -> None:
    """SIGTERM sets the stop event: the agent closes with 1001 and `run()` returns."""
    status = AgentStatus()
    async with asyncio.TaskGroup() as group:
        agent = group.create_task(app.run(_config(tmp_path, cloudly), status=status))
        await status.wait_until(_connected)
        signal.raise_signal(signal.SIGTERM)
        await agent
    closed = await cloudly.wait_for("disconnected")
    assert closed.detail["code"] == 1001
    assert status.snapshot().state is SessionState.STOPPED


async def test_a_second_ctrl_c_skips_the_drain(tmp_path: Path, cloudly: StandInCloudly) -> None:
    """The first SIGINT starts the drain; a second one cancels the run at once (the work in
    flight is cancelled, the socket still closes with 1001), long before drain_timeout_s."""
    status, hook = AgentStatus(), _SlowWork()
    config = _config(tmp_path, cloudly, drain_s=60.0)
    agent = asyncio.create_task(app.run(config, status=status, extra_routes=hook.routes()))
    await status.wait_until(_connected)
    pending = asyncio.create_task(_outcome(cloudly.call_agent("slow", {})))
    await hook.started.wait()
    signal.raise_signal(signal.SIGINT)
    await status.wait_until(lambda s: s.state is SessionState.DRAINING)
    loop = asyncio.get_running_loop()
    second = loop.time()
    signal.raise_signal(signal.SIGINT)
    with pytest.raises(asyncio.CancelledError):
        await agent
    assert loop.time() - second < 10
    assert hook.cancelled
    assert isinstance(await pending, AgentError)
    closed = await cloudly.wait_for("disconnected")
    assert closed.detail["code"] == 1001


async def test_cancelled_run_still_says_going_away(tmp_path: Path, cloudly: StandInCloudly) -> None:
    """Cancelling `run()` propagates the cancellation and still closes the socket with 1001."""
    status = AgentStatus()
    agent = asyncio.create_task(app.run(_config(tmp_path, cloudly), status=status))
    await status.wait_until(_connected)
    agent.cancel()
    with pytest.raises(asyncio.CancelledError):
        await agent
    closed = await cloudly.wait_for("disconnected")
    assert closed.detail["code"] == 1001
    assert status.snapshot().state is SessionState.STOPPED


async def test_missing_token_file_stops_start_up(tmp_path: Path, cloudly: StandInCloudly) -> None:
    """An unreadable machine token is a ConfigError before any connection is made."""
    config = _config(tmp_path, cloudly)
    (tmp_path / "token").unlink()
    with pytest.raises(ConfigError, match=r"cloudly\.token_file"):
        await app.run(config, stop=asyncio.Event())
    assert cloudly.count("connected") == 0


def test_session_settings_follow_the_configuration(tmp_path: Path) -> None:
    """The session gets the Cloudly section's values, with the URL mapped to ws(s)."""
    config = Config.model_validate(
        {
            "cloudly": {
                "url": "https://cloudly.example",
                "token_file": str(tmp_path / "t"),
                "max_frame_bytes": 32 * 2**20,
                "ping_interval_s": 7.0,
                "tag_payload": {"cluster": "c1"},
            },
            "corestore": {"credential_source": "file", "credential_file": str(tmp_path / "c")},
            "streams": {
                "window": 8,
                "window_bytes": 4 * 2**20,
                "receive_budget_bytes": 32 * 2**20,
            },
            "shutdown": {"close_timeout_s": 3.0},
        }
    )
    settings = app.session_settings(config)
    assert settings.url == "wss://cloudly.example"
    assert (settings.max_frame_bytes, settings.ping_interval) == (32 * 2**20, 7.0)
    assert settings.tag_payload == {"cluster": "c1"}
    assert (settings.close_timeout, settings.connection.streams.window) == (3.0, 8)
    assert settings.connection.streams.window_bytes == 4 * 2**20
    assert settings.connection.receive_budget == 32 * 2**20


def test_the_request_class_bounds_reach_the_connection(tmp_path: Path) -> None:
    """`[cloudly]`'s seats per request class become the connection's, one key each."""
    config = Config.model_validate(
        {
            "cloudly": {
                "url": "https://cloudly.example",
                "token_file": str(tmp_path / "t"),
                "max_concurrent_requests": 8,
                "max_stream_requests": 100,
                "max_stream_requests_per_node": 10,
            },
            "corestore": {"credential_source": "file", "credential_file": str(tmp_path / "c")},
        }
    )
    connection = app.session_settings(config).connection
    assert (
        connection.max_concurrent_requests,
        connection.max_stream_requests,
        connection.max_stream_requests_per_node,
    ) == (8, 100, 10)


async def test_the_secrets_it_reads_are_masked_in_every_log_line(
    tmp_path: Path, cloudly: StandInCloudly
) -> None:
    """`run()` registers the secrets it read with the log redactor before anything runs."""
    credential = "opaque-" + secrets.token_hex(12)
    stop, status = asyncio.Event(), AgentStatus()
    config = _config(tmp_path, cloudly, credential=credential)
    async with asyncio.TaskGroup() as group:
        agent = group.create_task(app.run(config, stop=stop, status=status))
        await status.wait_until(_connected)
        stop.set()
    assert agent.result() is None
    assert scrub_text(f"sending {credential} now") == f"sending {MASK} now"


async def test_a_shutdown_step_is_bounded_on_the_agents_clock() -> None:
    """A hung step ends when the clock it was given passes its bound (+ grace), not when the
    loop's time does: the one Clock bounds the shutdown too."""
    clock = ManualClock()
    hung = asyncio.Event()
    step = asyncio.create_task(shutdown.step("hung", hung.wait, 1.0, clock))
    await asyncio.sleep(0)  # the step starts and enters its bound
    assert clock.timeouts == [1.0 + STEP_GRACE_S]
    assert not step.done()
    clock.advance(clock.timeouts[0] - clock.monotonic())
    assert await step is False


class _Notifications:
    """A notifier that keeps every STATUS= line."""

    enabled = True

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.sent = asyncio.Event()

    def status(self, line: str) -> None:
        self.lines.append(line)
        self.sent.set()


async def test_status_is_sent_again_as_the_outage_grows_without_a_state_change() -> None:
    """Two minutes into an outage with no new attempt, STATUS= says `2 min`, not the `0 s` of
    the last change: the line is recomputed every `refresh_s` and sent when it differs."""
    clock = ManualClock(start=1_750_000_000.0)
    status = AgentStatus(clock=clock)
    status.move_to(SessionState.CONNECTING)
    status.record_error("refused")
    status.move_to(SessionState.BACKING_OFF)
    notifications = _Notifications()
    task = asyncio.create_task(
        systemd.tell_systemd(status, notifications, clock=clock, refresh_s=30.0)  # type: ignore[arg-type]
    )
    try:
        for _ in range(5):  # the task computes its first line and waits, bounded
            await asyncio.sleep(0)
        assert clock.timeouts == [30.0]
        assert notifications.lines == []
        clock.advance(125)
        await asyncio.wait_for(notifications.sent.wait(), 10)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert notifications.lines == [
        "Cloudly unreachable since 2025-06-15 15:06:40 UTC (2 min), never connected, 1 attempt, "
        "last error: refused"
    ]


def test_the_status_line_of_an_outage_is_the_status_commands_sentence() -> None:
    """`systemctl status` shows the same outage sentence as `restore-agent status`."""
    clock = ManualClock(start=1_750_000_000.0)
    status = AgentStatus(clock=clock)
    for state in (SessionState.CONNECTING, SessionState.AUTHENTICATING, SessionState.CONNECTED):
        status.move_to(state)
    clock.advance(60)
    status.move_to(SessionState.BACKING_OFF)
    status.move_to(SessionState.CONNECTING)
    status.record_error("refused")
    status.move_to(SessionState.BACKING_OFF)
    snapshot = status.snapshot()
    assert systemd.status_line(snapshot, clock.time() + 30) == snapshot.unreachable(
        clock.time() + 30
    )
    assert systemd.status_line(snapshot, clock.time()).startswith(
        "Cloudly unreachable since 2025-06-15 15:07:40 UTC (0 s), last connected "
        "2025-06-15 15:06:40 UTC, 1 attempt"
    )


def test_stopping_says_what_the_draining_status_line_says() -> None:
    """STOPPING=1's line is the STATUS= line of a draining agent, its count of requests in
    flight included."""
    status = AgentStatus()
    status.bind_in_flight(lambda: 3)
    for state in (SessionState.CONNECTING, SessionState.AUTHENTICATING, SessionState.DRAINING):
        status.move_to(state)
    assert systemd.draining_line(3) == "stopping: draining 3 requests in flight"
    assert systemd.status_line(status.snapshot()) == systemd.draining_line(3)
