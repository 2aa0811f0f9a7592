"""Interop fixtures: the Node stand-in Cloudly (real typedrequest 3.3.0) and the agent under test.

- `NodeCloudly` runs `node tests/interop/cloudly.mjs` as a child process: the first stdout line
  gives the port; after that stdout is the JSON-lines control channel (README.md), read by one
  reader task this object owns. stderr (the library's console output) goes to a file, never a
  pipe, so a chatty library cannot block Node on a full pipe.
- `AgentUnderTest` is the real agent session code: a `Config` loaded from a temporary TOML file
  (token file mode 0600), `app.session_settings(config)`, `CloudlySession` over a real
  websocket client, and `AgentStatus` to wait on.
- Every test in this folder is skipped (with the reason) when `node` or
  tests/interop/node_modules is missing; CI installs both, so there they run.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import os
import shutil
import signal
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Protocol

import pytest

from agent.config import load_config, read_secret_file
from agent.entry.app import session_settings
from agent.protocol.handlers import Route, Routes
from agent.session.client import CloudlySession
from agent.watch.status import AgentStatus, SessionState, StatusSnapshot

__all__ = [
    "TOKEN",
    "AgentUnderTest",
    "NodeCloudly",
    "Spawn",
    "deterministic_bytes",
    "interop_unavailable",
]

HERE = Path(__file__).parent
CLOUDLY_SCRIPT = HERE / "cloudly.mjs"
LIBRARY = HERE / "node_modules" / "@api.global" / "typedrequest" / "package.json"
TOKEN = "interop-machine-token-5c1e9a7d"
CLUSTER_ID = "cluster-interop"
NODE_ID = "node-1"
COMMAND_TIMEOUT_S = 30.0
# The control channel carries `events` snapshots with every recorded request body.
STDOUT_LIMIT = 64 * 2**20


def interop_unavailable() -> str | None:
    """Why the interop suite cannot run here, or None when it can."""
    if shutil.which("node") is None:
        return "node is not on PATH (the interop suite needs Node >= 20)"
    if not LIBRARY.is_file():
        return "tests/interop/node_modules is not installed (run: cd tests/interop && npm ci)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip this folder's tests, with the reason, when Node or the library is missing."""
    del config
    reason = interop_unavailable()
    if reason is None:
        return
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.skip(reason=reason))


def deterministic_bytes(seed: int | str, n: int) -> bytes:
    """The harness's test bytes: the first n bytes of SHAKE256(str(seed))."""
    return hashlib.shake_256(str(seed).encode()).digest(n)


class HarnessError(AssertionError):
    """The Node harness misbehaved (exited, answered garbage, or a command timed out)."""


class NodeCloudly:
    """One `node cloudly.mjs` process and its control channel."""

    def __init__(self, *, log_path: Path, args: Sequence[str] = ()) -> None:
        self._log_path = log_path
        self._args = list(args)
        self._process: asyncio.subprocess.Process | None = None
        self._log: IO[bytes] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._ids = itertools.count(1)
        self.port = 0

    @property
    def url(self) -> str:
        """The websocket URL the agent connects to."""
        return f"ws://127.0.0.1:{self.port}/"

    @property
    def pid(self) -> int:
        """The Node process id."""
        assert self._process is not None
        return self._process.pid

    async def start(self, port: int = 0) -> None:
        """Start Node listening on `port` (0: any) and read the port it got."""
        node = shutil.which("node")
        assert node is not None
        self._log = self._log_path.open("ab")
        self._process = await asyncio.create_subprocess_exec(
            node,
            str(CLOUDLY_SCRIPT),
            "--token",
            TOKEN,
            "--cluster-id",
            CLUSTER_ID,
            "--node-id",
            NODE_ID,
            "--port",
            str(port),
            *self._args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=self._log,
            limit=STDOUT_LIMIT,
        )
        assert self._process.stdout is not None
        async with asyncio.timeout(COMMAND_TIMEOUT_S):
            first = await self._process.stdout.readline()
        hello = json.loads(first) if first else {"event": "exited"}
        if hello.get("event") != "listening":
            await self._reap()
            raise HarnessError(f"cloudly.mjs did not start: {hello} (log: {self._log_path})")
        self.port = int(hello["port"])
        self._reader = asyncio.create_task(self._read_replies(self._process.stdout))

    async def _read_replies(self, stdout: asyncio.StreamReader) -> None:
        try:
            while line := await stdout.readline():
                reply = json.loads(line)
                waiter = self._pending.pop(reply.get("id"), None)
                if waiter is not None and not waiter.done():
                    waiter.set_result(reply)
        finally:
            for waiter in self._pending.values():
                if not waiter.done():
                    waiter.set_exception(HarnessError("cloudly.mjs exited before replying"))
            self._pending.clear()

    async def command(
        self,
        cmd: str,
        /,
        *,
        timeout: float = COMMAND_TIMEOUT_S,  # noqa: ASYNC109  # a bound on the harness, per command
        **fields: Any,
    ) -> dict[str, Any]:
        """Send one control command and return its reply (`ok` may be false)."""
        process = self._process
        if process is None or process.stdin is None or self._reader is None:
            raise HarnessError("cloudly.mjs is not running")
        if self._reader.done():
            raise HarnessError("cloudly.mjs exited")
        command_id = next(self._ids)
        waiter: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[command_id] = waiter
        process.stdin.write(json.dumps({"id": command_id, "cmd": cmd, **fields}).encode() + b"\n")
        await process.stdin.drain()
        try:
            async with asyncio.timeout(timeout):
                return await waiter
        except TimeoutError as exc:
            raise HarnessError(f"cloudly.mjs did not answer {cmd} within {timeout:g} s") from exc
        finally:
            self._pending.pop(command_id, None)

    async def wait_for(self, what: str, count: int = 1, **fields: Any) -> dict[str, Any]:
        """The harness's `wait` command; fails the test if the count is not reached."""
        reply = await self.command("wait", **{"for": what, "count": count, **fields})
        if not reply.get("reached"):
            raise HarnessError(f"{what} reached {reply.get('value')}, not {count}")
        events: dict[str, Any] = reply["events"]
        return events

    async def events(self) -> dict[str, Any]:
        """Everything the stand-in recorded so far."""
        reply = await self.command("events")
        events: dict[str, Any] = reply["events"]
        return events

    async def kill(self) -> None:
        """SIGKILL the process: the agent's socket drops without a close frame."""
        if self._process is not None and self._process.returncode is None:
            self._process.send_signal(signal.SIGKILL)
        await self._reap()

    async def close(self) -> None:
        """End the process (stdin EOF makes it exit 0), killing it if it does not."""
        process = self._process
        if process is not None and process.returncode is None and process.stdin is not None:
            process.stdin.close()
            try:
                async with asyncio.timeout(5):
                    await process.wait()
            except TimeoutError:
                process.kill()
        await self._reap()

    async def _reap(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            if process.stdin is not None:
                process.stdin.close()
            await process.wait()
        reader, self._reader = self._reader, None
        if reader is not None:
            async with asyncio.timeout(5):
                await reader  # ends at stdout EOF, failing whatever was still pending
        if self._log is not None:
            self._log.close()
            self._log = None


class Spawn(Protocol):
    """The `spawn_cloudly` fixture: start one more stand-in Cloudly."""

    async def __call__(self, *, port: int = 0, args: Sequence[str] = ()) -> NodeCloudly: ...


class AgentUnderTest:
    """The agent's real session code, configured from a temporary TOML file."""

    def __init__(
        self,
        directory: Path,
        url: str,
        *,
        chunk_form: str = "buffer",
        max_concurrent_requests: int = 64,
    ) -> None:
        token_file = directory / "machine-token"
        credential_file = directory / "corestore-credential"
        for path, secret in ((token_file, TOKEN), (credential_file, "corestore-secret")):
            path.write_text(secret + "\n")
            os.chmod(path, 0o600)
        config_file = directory / "agent.toml"
        config_file.write_text(
            f"""
[cloudly]
url = "{url}"
token_file = "{token_file.name}"
call_timeout_s = 30.0
backoff_base_s = 0.05
backoff_cap_s = 0.2
tag_payload = {{ role = "relay", node = "{NODE_ID}" }}
max_concurrent_requests = {max_concurrent_requests}

[corestore]
credential_source = "file"
credential_file = "{credential_file.name}"

[state]
directory = "{directory}"

[streams]
chunk_form = "{chunk_form}"

[shutdown]
close_timeout_s = 2.0
"""
        )
        self.config = load_config(config_file)
        self.status = AgentStatus()
        self._routes: list[Route[Any, Any]] = []
        self.session = self._session()

    def serve(self, route: Route[Any, Any]) -> None:
        """Serve `route` too (before `running()`: a session's routes are fixed when it is made)."""
        self._routes.append(route)
        self.session = self._session()

    def _session(self) -> CloudlySession:
        # A fixed draw: every backoff delay is half its (small, configured) window.
        return CloudlySession(
            session_settings(self.config),
            read_secret_file(self.config.cloudly.token_file, "cloudly.token_file"),
            self.status,
            routes=Routes(self._routes),
            rng=lambda: 0.5,
        )

    async def wait_until(self, predicate: Callable[[StatusSnapshot], bool]) -> StatusSnapshot:
        """The first status snapshot that satisfies `predicate` (bounded)."""
        async with asyncio.timeout(COMMAND_TIMEOUT_S):
            return await self.status.wait_until(predicate)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[StatusSnapshot]:
        """Run the session until the block ends; yields the first connected snapshot."""
        task = asyncio.create_task(self.session.run(), name="agent-session")
        try:
            yield await self.wait_until(connected)
        finally:
            async with asyncio.timeout(10):
                await self.session.close(drain_timeout=2.0)
                await task


def connected(snapshot: StatusSnapshot) -> bool:
    """The session is authenticated, tagged and has read the cluster."""
    return snapshot.state is SessionState.CONNECTED


@pytest.fixture
async def cloudly(tmp_path: Path) -> AsyncIterator[NodeCloudly]:
    """A running stand-in Cloudly on the real library (any free port)."""
    harness = NodeCloudly(log_path=tmp_path / "cloudly-stderr.log")
    await harness.start()
    try:
        yield harness
    finally:
        await harness.close()


@pytest.fixture
async def spawn_cloudly(tmp_path: Path) -> AsyncIterator[Spawn]:
    """`await spawn_cloudly(port=N, args=[...])`: more stand-ins, all closed at teardown."""
    spawned: list[NodeCloudly] = []

    async def spawn(*, port: int = 0, args: Sequence[str] = ()) -> NodeCloudly:
        harness = NodeCloudly(log_path=tmp_path / f"cloudly-{len(spawned) + 2}.log", args=args)
        spawned.append(harness)
        await harness.start(port)
        return harness

    try:
        yield spawn
    finally:
        for harness in spawned:
            await harness.close()


@pytest.fixture
def agent(cloudly: NodeCloudly, tmp_path: Path) -> AgentUnderTest:
    """The agent's session, configured for `cloudly`, not yet running."""
    return AgentUnderTest(tmp_path, cloudly.url)


def request_of(events: Mapping[str, Any], method: str) -> list[Any]:
    """The request bodies Cloudly received for `method`, in order."""
    return [call["request"] for call in events["calls"] if call["method"] == method]
