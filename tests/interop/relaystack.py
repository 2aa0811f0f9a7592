"""The whole agent against the Node stand-in Cloudly and the reference Corestore.

The relay tests need the real daemon, not only its session: `agent.entry.app.run` serves
`backupClusterService` / `restoreClusterService` with its job runner and its state database,
and reaches the node's Corestore (`devstack.corestore`, in this process, so a test reads its
disk and its counters). The agent connects to whatever URL it is given (here the splitting
proxy in front of the stand-in), reads its Corestore bearer from a 0600 file
(`credential_source = "file"`: the Node stand-in seals no credentials) and keeps its state in a
temporary directory.

- `RelayAgent(directory, url)`: its configuration (`config`, and `config_file` for a process);
  `running()` runs it in this process until the block ends; `spawn()` starts it as a process of
  its own (`python -m agent run`, as production does) that a test may SIGKILL and start again on
  the same state directory.
- `call(cloudly, method, request)`: one call fired by the stand-in, sent again while the agent
  answers `not-ready` (retryable: a session that just connected serves a moment later).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from agent.config import Config
from agent.watch.status import AgentStatus
from tests.agentstack import connected, secret_file, spawn_agent, toml
from tests.interop.conftest import TOKEN, NodeCloudly
from tests.processes import agent_environ

__all__ = ["BEARER", "AgentProcess", "RelayAgent", "call"]

BEARER = "interop-relay-corestore-bearer"
KiB = 1024
NOT_READY_RETRY_S = 0.02  # as Cloudly retries a retryable refusal, not a wait for an event
START_TIMEOUT_S = 30.0


class AgentProcess:
    """`python -m agent run` on a `RelayAgent`'s configuration; output to files."""

    def __init__(self, process: asyncio.subprocess.Process, log: Path) -> None:
        self.process = process
        self.log = log

    def kill(self) -> None:
        """SIGKILL: no shutdown, no flush."""
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGKILL)

    async def stop(self) -> int:
        """SIGTERM, and the exit status (SIGKILL if it does not exit)."""
        if self.process.returncode is None:
            self.process.terminate()
        try:
            async with asyncio.timeout(15):
                return await self.process.wait()
        except TimeoutError:
            self.process.kill()
            return await self.process.wait()


class RelayAgent:
    """The agent's configuration for one test: its state directory, secrets and log files."""

    def __init__(self, directory: Path, url: str, *, corestore_chunk: int = 64 * KiB) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.directory = directory
        self.state_dir = directory / "state"
        token = secret_file(directory / "machine-token", TOKEN)
        bearer = secret_file(directory / "corestore-credential", BEARER)
        self.data: dict[str, dict[str, Any]] = {
            "cloudly": {
                "url": url,
                "token_file": str(token),
                "backoff_base_s": 0.05,
                "backoff_cap_s": 0.2,
            },
            "corestore": {
                "credential_source": "file",
                "credential_file": str(bearer),
                "chunk_size": corestore_chunk,
                "retries": 1,
                "outage_tolerance_s": 0,
                "restore_poll_interval_s": 0.05,
            },
            "state": {"directory": str(self.state_dir)},
            "shutdown": {"drain_timeout_s": 2.0, "close_timeout_s": 2.0},
            "log": {"format": "json", "level": "info"},
            "health": {"listen": "127.0.0.1:0"},
        }
        self.config = Config.model_validate(self.data)
        self.config_file = directory / "agent.toml"
        self.config_file.write_text(toml(self.data))
        self.processes: list[AgentProcess] = []

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[AgentStatus]:
        """The agent in this process, connected (serving) until the block ends."""
        async with connected(
            self.config, start_timeout=START_TIMEOUT_S, handle_signals=False
        ) as status:
            yield status

    async def spawn(self) -> AgentProcess:
        """The agent as a process of its own on this configuration (and state directory)."""
        log = self.directory / f"agent-{len(self.processes) + 1}.log"
        process = await spawn_agent(self.config_file, environ=agent_environ(), stdout=log)
        spawned = AgentProcess(process, log)
        self.processes.append(spawned)
        return spawned

    async def reap(self) -> None:
        """Stop every process `spawn` started that still runs."""
        for spawned in self.processes:
            await spawned.stop()


async def call(
    cloudly: NodeCloudly, method: str, request: dict[str, Any], *, timeout_ms: int = 60000
) -> dict[str, Any]:
    """`fire` through the stand-in, sent again while the agent answers `not-ready`."""
    async with asyncio.timeout(timeout_ms / 1000 + 10):
        while True:
            reply = await cloudly.command(
                "fire",
                method=method,
                request=request,
                timeoutMs=timeout_ms,
                timeout=timeout_ms / 1000 + 5,
            )
            if (reply.get("errorData") or {}).get("code") != "not-ready":
                return reply
            await asyncio.sleep(NOT_READY_RETRY_S)
