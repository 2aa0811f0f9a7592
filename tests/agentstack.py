"""What the end-to-end and interop tests share to start the real agent: its secret files, its
configuration written as TOML, the agent in this process until it is connected (`connected`),
and `python -m agent run` on that file as a process of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

from agent.config import Config
from agent.entry import app
from agent.watch.status import AgentStatus, SessionState
from tests.processes import REPO

__all__ = ["connected", "secret_file", "spawn_agent", "toml"]


def secret_file(path: Path, value: str) -> Path:
    """`value` and a newline, readable by the owner only (the agent refuses anything looser)."""
    path.write_text(value + "\n")
    path.chmod(0o600)
    return path


def toml(data: Mapping[str, Mapping[str, Any]]) -> str:
    """The sections of a configuration as TOML (flat values only: all a test's need)."""
    lines: list[str] = []
    for section, values in data.items():
        lines.append(f"[{section}]")
        for key, value in values.items():
            if isinstance(value, bool):
                lines.append(f"{key} = {'true' if value else 'false'}")
            elif isinstance(value, int | float):
                lines.append(f"{key} = {value}")
            else:
                lines.append(f'{key} = "{value}"')
    return "\n".join(lines) + "\n"


@contextlib.asynccontextmanager
async def connected(
    config: Config,
    *,
    start_timeout: float,
    on_ready: Callable[[str], None] | None = None,
    handle_signals: bool = True,
) -> AsyncIterator[AgentStatus]:
    """`agent.entry.app.run` in this process, once connected (within `start_timeout` s); asked
    to stop in order when the block ends."""
    status, stop = AgentStatus(), asyncio.Event()
    async with asyncio.TaskGroup() as group:
        group.create_task(
            app.run(
                config,
                stop=stop,
                status=status,
                on_ready=on_ready,
                handle_signals=handle_signals,
            ),
            name="agent",
        )
        try:
            async with asyncio.timeout(start_timeout):
                await status.wait_until(lambda s: s.state is SessionState.CONNECTED)
            yield status
        finally:
            stop.set()


async def spawn_agent(
    config_file: Path, *, environ: Mapping[str, str], stdout: Path, stderr: Path | None = None
) -> asyncio.subprocess.Process:
    """`python -m agent run --config CONFIG_FILE` from the checkout, without the test run's
    PYTEST* variables; its output to `stdout` and `stderr` (the same file when None)."""
    with stdout.open("wb") as out:
        if stderr is None:
            return await _exec(config_file, environ, out, out)
        with stderr.open("wb") as err:
            return await _exec(config_file, environ, out, err)


async def _exec(
    config_file: Path, environ: Mapping[str, str], out: Any, err: Any
) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agent",
        "run",
        "--config",
        str(config_file),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=out,
        stderr=err,
        cwd=REPO,
        env={k: v for k, v in environ.items() if not k.startswith("PYTEST")},
    )
