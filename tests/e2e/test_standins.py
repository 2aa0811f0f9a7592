"""`bench/standins.py`, the stand-ins an installed agent runs against, in the README's order:
`check-config --connect` probes the stand-in Cloudly before the agent starts, and the stand-ins
still drive their restore once the agent's own session is up."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
_ENV = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}


@asynccontextmanager
async def _running(*argv: str, **options: Any) -> AsyncIterator[asyncio.subprocess.Process]:
    process = await asyncio.create_subprocess_exec(*argv, cwd=REPO, env=_ENV, **options)
    try:
        yield process
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            await process.wait()


async def _line(process: asyncio.subprocess.Process) -> dict[str, Any]:
    """The stand-ins' next JSON line (their unconfigured log lines go to stdout as well)."""
    assert process.stdout is not None
    async with asyncio.timeout(60):
        while line := await process.stdout.readline():
            if line.startswith(b"{"):
                parsed: dict[str, Any] = json.loads(line)
                return parsed
    raise AssertionError(f"the stand-ins ended (exit {await process.wait()}) before their line")


async def test_the_stand_ins_survive_the_probe_and_drive_the_agent_that_follows(
    tmp_path: Path,
) -> None:
    """A `check-config --connect` probe before the agent: the probe passes, the stand-ins keep
    running, and the agent that connects next gets its restore driven to `ready`."""
    workdir = tmp_path / "run"
    standins = (sys.executable, "-c", "import bench.standins as s; s.main()", str(workdir))
    async with _running(
        *standins, "--health", "127.0.0.1:0", stdout=asyncio.subprocess.PIPE
    ) as stand_ins:
        config = (await _line(stand_ins))["config"]
        probe = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "agent",
            "check-config",
            config,
            "--connect",
            cwd=REPO,
            env=_ENV,
            stdout=asyncio.subprocess.PIPE,
        )
        async with asyncio.timeout(60):
            out, _ = await probe.communicate()
        assert probe.returncode == 0, out.decode()
        assert b"cloudly: OK" in out
        agent = (sys.executable, "-m", "agent", "run", "--config", config)
        with (tmp_path / "agent.log").open("wb") as log:
            async with _running(*agent, stderr=log):
                restore = await _line(stand_ins)
        assert restore["status"] == "ready"
        assert stand_ins.returncode is None
