"""The running agent seen from outside: its health endpoint and what it tells systemd.

The real composition root (`agent.entry.app.run`) against the stand-in Cloudly; the health endpoint
on 127.0.0.1 port 0 (or a unix socket); a real unix datagram socket stands in for systemd's
notify socket.
"""

from __future__ import annotations

import asyncio
import io
import logging
import re
import socket
import stat
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import structlog

from agent import __version__
from agent.config import Config
from agent.entry import app
from agent.entry.cli import main
from agent.errors import StartupBlocked
from agent.log import configure_logging
from agent.protocol.bytearrays import codec_backends
from agent.protocol.handlers import RequestContext, Routes
from agent.store import statedir
from agent.watch.notify import Notifier
from agent.watch.status import AgentStatus, SessionState, StatusSnapshot
from devstack.cloudly import ABSENT, StandInCloudly, cluster_document
from tests.session._helpers import body_route

TOKEN = "health-machine-token-4d5e6f708192a3b4"
CLUSTER = cluster_document("cluster-1", {"node-1": "http://10.0.0.1:3000"})


def _secret_file(path: Path, value: str) -> Path:
    path.write_text(value + "\n")
    path.chmod(0o600)
    return path


def _config(tmp_path: Path, cloudly: StandInCloudly, *, listen: str = "127.0.0.1:0") -> Config:
    return Config.model_validate(
        {
            "cloudly": {
                "url": cloudly.url,
                "token_file": str(_secret_file(tmp_path / "token", TOKEN)),
                "backoff_base_s": 0.05,
                "backoff_cap_s": 0.2,
            },
            "corestore": {
                "credential_source": "file",
                "credential_file": str(_secret_file(tmp_path / "corestore", "corestore-cred")),
            },
            "state": {"directory": str(tmp_path / "state")},
            "shutdown": {"drain_timeout_s": 5.0, "close_timeout_s": 2.0},
            "health": {"listen": listen},
        }
    )


def _connected(snapshot: StatusSnapshot) -> bool:
    return snapshot.state is SessionState.CONNECTED


class Agent:
    """A running agent: its status, its health endpoint's base URL, its stop event."""

    def __init__(self, status: AgentStatus, address: str, stop: asyncio.Event) -> None:
        self.status, self.address, self.stop = status, address, stop
        self.url = f"http://{address}"

    async def get(self, path: str) -> tuple[int, Any]:
        """GET `path`: (status, JSON body or text)."""
        async with aiohttp.ClientSession() as http, http.get(self.url + path) as response:
            if response.content_type == "application/json":
                return response.status, await response.json()
            return response.status, await response.text()


@asynccontextmanager
async def running(
    config: Config, *, notifier: Notifier | None = None, routes: Routes | None = None
) -> AsyncIterator[Agent]:
    """`app.run(config)` in a task, yielded once the health endpoint listens; stopped on exit."""
    status, stop = AgentStatus(), asyncio.Event()
    listening: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(
        app.run(
            config,
            status=status,
            stop=stop,
            notifier=notifier or Notifier(None),
            extra_routes=routes,
            on_ready=listening.set_result,
        )
    )
    try:
        async with asyncio.timeout(10):
            address = await asyncio.wait({listening, task}, return_when=asyncio.FIRST_COMPLETED)
            del address
            if task.done():
                task.result()  # start-up failed: raise why
        yield Agent(status, listening.result(), stop)
    finally:
        stop.set()
        async with asyncio.timeout(20):
            await task


@pytest.fixture
async def cloudly() -> AsyncIterator[StandInCloudly]:
    async with StandInCloudly(token=TOKEN, cluster=CLUSTER) as server:
        yield server


async def _wait(agent: Agent, predicate: Callable[[StatusSnapshot], bool]) -> None:
    async with asyncio.timeout(10):
        await agent.status.wait_until(predicate)


# --- readiness ----------------------------------------------------------------------------------


async def test_readiness_follows_the_session_lost_and_back(
    tmp_path: Path, cloudly: StandInCloudly
) -> None:
    """Connected: 200. Cloudly gone: 503 naming the session's state and error. Back: 200."""
    async with running(_config(tmp_path, cloudly)) as agent:
        await _wait(agent, _connected)
        ready = await agent.get("/readyz")
        await cloudly.stop()
        await _wait(agent, lambda s: s.state is SessionState.BACKING_OFF)
        lost = await agent.get("/readyz")
        await cloudly.start()
        await _wait(agent, _connected)
        back = await agent.get("/readyz")
    assert ready[0] == 200
    assert ready[1]["ready"] is True
    assert ready[1]["reasons"] == {}
    assert ready[1]["session"]["state"] == "connected"
    assert lost[0] == 503
    assert lost[1]["ready"] is False
    assert set(lost[1]["reasons"]) == {"session"}
    # Between attempts or already trying again: not ready either way, since when Cloudly is
    # unreachable, the last connect, the failed attempts and the error are named (Cloudly's
    # close, or the refused connection of a later attempt).
    assert re.fullmatch(
        r"the Cloudly session is (backing-off|connecting): Cloudly unreachable since "
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \(\d+ s\), last connected "
        r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC, \d+ attempts?, last error: "
        r"(session closed with code 1001.*|could not reach Cloudly.*)",
        lost[1]["reasons"]["session"],
    )
    assert back[0] == 200
    assert back[1]["reasons"] == {}


async def test_readiness_needs_a_node_with_a_corestore(tmp_path: Path) -> None:
    """A cluster document whose nodes have no valid Corestore endpoint is not ready, and the
    reason names each node's problem."""
    document = cluster_document("cluster-9", {"node-x": ABSENT})
    async with (
        StandInCloudly(token=TOKEN, cluster=document) as cloudly,
        running(_config(tmp_path, cloudly)) as agent,
    ):
        await _wait(agent, _connected)
        code, body = await agent.get("/readyz")
    assert code == 503
    assert set(body["reasons"]) == {"cluster"}
    assert body["reasons"]["cluster"].startswith(
        "no node of cluster cluster-9 has a valid Corestore endpoint (node-x: "
    )


async def test_before_cloudly_answers_the_agent_is_alive_but_not_ready(tmp_path: Path) -> None:
    """With Cloudly unreachable the process is healthy (/healthz 200) and not ready (503 with
    the session and cluster reasons)."""
    unreachable = StandInCloudly(token=TOKEN, cluster=CLUSTER)
    await unreachable.start()
    await unreachable.stop()  # a port that refuses connections
    async with running(_config(tmp_path, unreachable)) as agent:
        await _wait(agent, lambda s: s.last_error is not None)
        healthz = await agent.get("/healthz")
        readyz = await agent.get("/readyz")
    assert healthz[0] == 200
    assert healthz[1]["alive"] is True
    assert readyz[0] == 503
    assert set(readyz[1]["reasons"]) == {"session", "cluster"}
    assert "could not reach Cloudly" in readyz[1]["reasons"]["session"]


# --- the other endpoints ------------------------------------------------------------------------


def _sample(text: str, name: str, labels: Mapping[str, str] | None = None) -> float:
    """The value of one sample in Prometheus text (fails if it is absent)."""
    wanted = dict(labels or {})
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        series, value = line.rsplit(" ", 1)
        metric, _, label_text = series.partition("{")
        found = dict(pair.split("=", 1) for pair in label_text.rstrip("}").split(",") if pair)
        if metric == name and {k: v.strip('"') for k, v in found.items()} == wanted:
            return float(value)
    raise AssertionError(f"no sample {name} {wanted}")


async def test_metrics_count_requests_by_method_and_code(
    tmp_path: Path, cloudly: StandInCloudly
) -> None:
    """/metrics is Prometheus text: the session's state, connects, and each request by its
    method and outcome code."""

    async def echo(body: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
        return body

    routes = Routes([body_route("echo", echo)])
    async with running(_config(tmp_path, cloudly), routes=routes) as agent:
        await _wait(agent, _connected)
        await cloudly.call_agent("echo", {"n": 1})
        await cloudly.call_agent("echo", {"n": 2})
        code, text = await agent.get("/metrics")
    assert code == 200
    assert _sample(text, "restore_agent_session_state", {"state": "connected"}) == 1
    assert _sample(text, "restore_agent_session_state", {"state": "backing-off"}) == 0
    assert _sample(text, "restore_agent_cloudly_connects_total", {"kind": "first"}) == 1
    assert _sample(text, "restore_agent_requests_total", {"method": "echo", "code": "ok"}) == 2
    assert _sample(text, "restore_agent_request_duration_seconds_count", {"method": "echo"}) == 2
    assert _sample(text, "restore_agent_restores", {"status": "staging"}) == 0
    assert _sample(text, "restore_agent_build_info", {"version": __version__}) == 1


async def test_metrics_carry_the_process_collectors_and_readiness(
    tmp_path: Path, cloudly: StandInCloudly
) -> None:
    """/metrics has the process's memory and file descriptors, no `_created` series, and
    `restore_agent_ready` 1 once the agent is ready."""
    async with running(_config(tmp_path, cloudly)) as agent:
        await _wait(agent, _connected)
        _, text = await agent.get("/metrics")
    assert _sample(text, "process_resident_memory_bytes") > 1_000_000
    assert _sample(text, "process_open_fds") > 0
    assert _sample(text, "restore_agent_ready") == 1
    assert "_created" not in text


async def test_metrics_say_not_ready_while_cloudly_is_unreachable(
    tmp_path: Path, cloudly: StandInCloudly
) -> None:
    """`restore_agent_ready` is 0 while /readyz answers 503."""
    await cloudly.stop()
    async with running(_config(tmp_path, cloudly)) as agent:
        await _wait(agent, lambda s: s.last_error is not None)
        _, text = await agent.get("/metrics")
    assert _sample(text, "restore_agent_ready") == 0


async def test_metrics_count_losses_by_cause(tmp_path: Path, cloudly: StandInCloudly) -> None:
    """A dropped session is counted as a loss of cause `closed` and a reconnect."""
    async with running(_config(tmp_path, cloudly)) as agent:
        await _wait(agent, _connected)
        await cloudly.drop_connections(1012)
        await _wait(agent, lambda s: _connected(s) and s.reconnect_count >= 1)
        _, text = await agent.get("/metrics")
    labels = {"cause": "closed", "permanent": "false"}
    assert _sample(text, "restore_agent_cloudly_losses_total", labels) == 1
    assert _sample(text, "restore_agent_cloudly_connects_total", {"kind": "reconnect"}) == 1


async def test_restores_endpoint_lists_nothing_before_any_restore(
    tmp_path: Path, cloudly: StandInCloudly
) -> None:
    """/v1/restores answers an empty list while the store holds no node state."""
    async with running(_config(tmp_path, cloudly)) as agent:
        code, body = await agent.get("/v1/restores")
    assert (code, body) == (200, {"restores": []})


async def test_unknown_paths_and_methods_are_refused(
    tmp_path: Path, cloudly: StandInCloudly
) -> None:
    """Only the five GET routes exist."""
    async with running(_config(tmp_path, cloudly)) as agent, aiohttp.ClientSession() as http:
        async with http.get(agent.url + "/admin") as missing:
            missing_status = missing.status
        async with http.post(agent.url + "/readyz") as posted:
            posted_status = posted.status
    assert (missing_status, posted_status) == (404, 405)


@pytest.fixture
def quiet_logs() -> Iterator[None]:
    """The agent's log lines go to a buffer (not stdout, where a command's output is read);
    the logging configuration is restored afterwards."""
    root, capped = logging.getLogger(), logging.getLogger("websockets")
    handlers, level, capped_level = list(root.handlers), root.level, capped.level
    configure_logging(format="json", stream=io.StringIO())
    yield
    structlog.reset_defaults()
    root.handlers[:] = handlers
    root.setLevel(level)
    capped.setLevel(capped_level)


@pytest.mark.usefixtures("quiet_logs")
async def test_the_endpoint_can_be_a_private_unix_socket(
    tmp_path: Path, cloudly: StandInCloudly, capsys: pytest.CaptureFixture[str]
) -> None:
    """`unix:/path` listens on a socket only its owner may use, which `restore-agent status`
    reads too; it is removed when the agent stops."""
    path = tmp_path / "run" / "health.sock"
    path.parent.mkdir()
    config = _config(tmp_path, cloudly, listen=f"unix:{path}")
    status_config = tmp_path / "status.toml"
    status_config.write_text(
        f'[cloudly]\nurl = "{cloudly.url}"\ntoken_file = "token"\n'
        f'[health]\nlisten = "unix:{path}"\n'
    )
    async with running(config) as agent:
        await _wait(agent, _connected)
        mode = stat.S_IMODE(path.stat().st_mode)
        connector = aiohttp.UnixConnector(path=str(path))
        async with (
            aiohttp.ClientSession(connector=connector) as http,
            http.get("http://agent/healthz") as response,
        ):
            healthz = response.status
        capsys.readouterr()
        status_exit = await asyncio.to_thread(main, ["status", "--config", str(status_config)])
        printed = capsys.readouterr().out
    assert agent.address == f"unix:{path}"
    assert mode == 0o600
    assert healthz == 200
    assert status_exit == 0
    assert re.match(r"agent:    ready \(version .+, up \d+ s\)\nsession:  connected for ", printed)
    assert printed.endswith("restores: 0\n\njobs:     0\n")
    assert not path.exists()


async def test_a_taken_address_blocks_start_up_before_anything_is_created(
    tmp_path: Path, cloudly: StandInCloudly
) -> None:
    """An address another process listens on usually frees up: StartupBlocked (exit 75, which
    systemd restarts), raised before the state directory, the key or the store exist."""
    taken = socket.create_server(("127.0.0.1", 0))
    port = taken.getsockname()[1]
    config = _config(tmp_path, cloudly, listen=f"127.0.0.1:{port}")
    try:
        with pytest.raises(
            StartupBlocked, match=rf"health\.listen: cannot listen on 127\.0\.0\.1:{port}"
        ):
            await app.run(config)
    finally:
        taken.close()
    assert cloudly.count("connected") == 0
    assert not config.state.directory.exists()


async def test_a_live_unix_socket_blocks_start_up_and_stays(
    tmp_path: Path, cloudly: StandInCloudly
) -> None:
    """A unix socket path another process accepts on is not taken over: StartupBlocked, and
    the other listener keeps its socket file."""
    path = tmp_path / "health.sock"
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    other.bind(str(path))
    other.listen()
    try:
        with pytest.raises(StartupBlocked, match=r"health\.listen: cannot listen on unix:"):
            await app.run(_config(tmp_path, cloudly, listen=f"unix:{path}"))
        assert stat.S_ISSOCK(path.lstat().st_mode)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.connect(str(path))  # still the other listener's
    finally:
        other.close()


async def test_a_stale_unix_socket_is_replaced(tmp_path: Path, cloudly: StandInCloudly) -> None:
    """A socket file nothing accepts on (left by a killed agent) is replaced at start-up."""
    path = tmp_path / "health.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))
    dead.close()  # the file stays, nobody listens
    async with running(_config(tmp_path, cloudly, listen=f"unix:{path}")) as agent:
        assert agent.address == f"unix:{path}"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600


async def test_a_start_refused_after_the_bind_leaves_no_socket_file(
    tmp_path: Path, cloudly: StandInCloudly
) -> None:
    """The unix socket is bound first; when the state directory's lock then refuses start-up,
    the socket file goes away with the socket."""
    path = tmp_path / "health.sock"
    config = _config(tmp_path, cloudly, listen=f"unix:{path}")
    (tmp_path / "state").mkdir()
    held = statedir.lock(tmp_path / "state")
    try:
        with pytest.raises(StartupBlocked, match="another restore-agent uses this state"):
            await app.run(config)
    finally:
        held.close()
    assert not path.exists()


def test_a_taken_port_exits_75_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`run` on a port in use: one line naming health.listen, exit 75 (not the 2 the unit
    never restarts)."""
    # As in production, without asyncio's debug mode: on a loaded machine it adds a line of its
    # own ("Executing <Task ...> took 0.14 seconds") to stderr.
    monkeypatch.delenv("PYTHONASYNCIODEBUG", raising=False)
    taken = socket.create_server(("127.0.0.1", 0))
    port = taken.getsockname()[1]
    (tmp_path / "token").write_text(TOKEN + "\n")
    (tmp_path / "token").chmod(0o600)
    config = tmp_path / "agent.toml"
    config.write_text(
        '[cloudly]\nurl = "wss://cloudly.example.com"\ntoken_file = "token"\n'
        f'[state]\ndirectory = "state"\n[health]\nlisten = "127.0.0.1:{port}"\n'
    )
    try:
        code = main(["run", "--config", str(config)])
    finally:
        taken.close()
    assert code == 75
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"restore-agent: health.listen: cannot listen on 127.0.0.1:{port}: ")
    assert not (tmp_path / "state").exists()


# --- systemd ------------------------------------------------------------------------------------


class FakeSystemd:
    """A unix datagram socket where `NOTIFY_SOCKET` points: collects what the agent says."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.socket.bind(str(path))
        self.socket.setblocking(False)
        self.messages: list[str] = []

    async def next(self) -> str:
        """The next message (waits for it)."""
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(10):
            data = await loop.sock_recv(self.socket, 4096)
        message = data.decode()
        self.messages.append(message)
        return message

    async def until(self, predicate: Callable[[str], bool]) -> str:
        """Read messages until one satisfies `predicate`; returns it."""
        while not predicate(message := await self.next()):
            pass
        return message

    def close(self) -> None:
        self.socket.close()


@pytest.fixture
def systemd(tmp_path: Path) -> AsyncIterator[FakeSystemd]:
    fake = FakeSystemd(tmp_path / "notify.sock")
    yield fake  # type: ignore[misc]
    fake.close()


class _Held:
    """An extra route `hold` that waits for `release`."""

    def __init__(self) -> None:
        self.started, self.release = asyncio.Event(), asyncio.Event()

    def routes(self) -> Routes:
        async def hold(body: dict[str, Any], ctx: RequestContext) -> dict[str, Any]:
            self.started.set()
            await self.release.wait()
            return {"held": True}

        return Routes([body_route("hold", hold)])


async def test_the_status_during_the_drain_keeps_its_count(
    tmp_path: Path, cloudly: StandInCloudly, systemd: FakeSystemd
) -> None:
    """The STATUS= that follows STOPPING=1 as the session starts draining says how many
    requests it drains, as STOPPING=1 did, instead of overwriting the count."""
    held = _Held()
    async with running(
        _config(tmp_path, cloudly), notifier=Notifier(str(systemd.path)), routes=held.routes()
    ) as agent:
        await systemd.until(lambda m: m.startswith("STATUS=connected"))
        call = asyncio.create_task(cloudly.call_agent("hold", {}))
        await held.started.wait()
        agent.stop.set()
        await systemd.until(lambda m: m.startswith("STOPPING=1"))
        draining = await systemd.next()
        held.release.set()
        await call
    assert draining == "STATUS=stopping: draining 1 requests in flight"


async def test_ready_comes_once_store_and_endpoint_are_up_then_status_then_stopping(
    tmp_path: Path, cloudly: StandInCloudly, systemd: FakeSystemd
) -> None:
    """READY=1 first (the endpoint answers and the store exists by then, Cloudly or not),
    STATUS= as the session connects, STOPPING=1 when the drain begins, nothing after READY
    says READY again."""
    held = _Held()
    config = _config(tmp_path, cloudly)
    with structlog.testing.capture_logs() as logs:
        async with running(
            config, notifier=Notifier(str(systemd.path)), routes=held.routes()
        ) as agent:
            first = await systemd.next()
            alive = await agent.get("/healthz")
            store_exists = (tmp_path / "state" / "state.sqlite3").exists()
            connected = await systemd.until(lambda m: m.startswith("STATUS=connected"))
            call = asyncio.create_task(cloudly.call_agent("hold", {}))
            await held.started.wait()
            agent.stop.set()
            stopping = await systemd.until(lambda m: m.startswith("STOPPING=1"))
            draining = await agent.get("/readyz")  # the endpoint outlives the drain
            held.release.set()
            assert await call == {"held": True}
    assert first.startswith("READY=1\nSTATUS=")
    assert alive[0] == 200
    assert store_exists
    assert connected == "STATUS=connected to Cloudly, cluster cluster-1"
    assert stopping == "STOPPING=1\nSTATUS=stopping: draining 1 requests in flight"
    assert draining[0] == 503
    assert draining[1]["session"]["state"] == "draining"
    assert sum(message.startswith("READY=1") for message in systemd.messages) == 1
    steps = [entry["step"] for entry in logs if entry["event"] == "shutdown_step_done"]
    assert steps == [
        "drain in-flight work",
        "close the Cloudly socket",
        "stop the engine's work",
        "stop the relay's jobs",
        "stop the health server",
        "close the Corestore clients",
        "close the store",
    ]


async def test_status_tells_systemd_why_cloudly_is_unreachable(
    tmp_path: Path, cloudly: StandInCloudly, systemd: FakeSystemd
) -> None:
    """While the session fails, STATUS= carries its last error (what `systemctl status`
    shows)."""
    config = _config(tmp_path, cloudly)
    async with running(config, notifier=Notifier(str(systemd.path))) as agent:
        await systemd.until(lambda m: m.startswith("STATUS=connected"))
        await cloudly.stop()
        unreachable = await systemd.until(lambda m: "unreachable" in m)
        del agent
    assert re.fullmatch(
        r"STATUS=Cloudly unreachable since \S+ \S+ UTC \(\d+ s\), last connected \S+ \S+ UTC, "
        r"\d+ attempts?, last error: .+",
        unreachable,
    )


async def test_the_start_up_line_says_what_runs_against_what(
    tmp_path: Path, cloudly: StandInCloudly
) -> None:
    """One info line at start: version, config path, Cloudly URL, state directory, the
    store's integrity result, where the health endpoint listens and which chunk decoders run."""
    config = _config(tmp_path, cloudly)
    with structlog.testing.capture_logs() as logs:
        async with running(config):
            pass
    [line] = [entry for entry in logs if entry["event"] == "agent_starting"]
    assert line["log_level"] == "info"
    assert line["version"] == __version__
    assert line["cloudly_url"] == cloudly.url.replace("http:", "ws:")
    assert line["state_directory"] == str(tmp_path / "state")
    assert line["store_integrity"] == "new"
    assert line["health"] == "127.0.0.1:0"
    assert line["chunk_decoders"] == codec_backends()
    assert TOKEN not in repr(line)
