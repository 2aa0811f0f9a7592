"""A delay line child (`bench/_delay_proxy.py`) seen from the bench: start it, find its port,
set its round trip on the live line (`Line.set_rtt`: a route change, a failover).

Benchmarks only (bench/wan.py): real time, on purpose. The agent's tests inject their clocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from bench._staging_world import ROOT

__all__ = ["Line", "delay_line"]


@dataclass
class Line:
    """A delay line child: the port it listens on, and its round trip set on the live line."""

    port: int
    control: asyncio.StreamWriter

    async def set_rtt(self, rtt_ms: float) -> None:
        """From now on every byte waits `rtt_ms / 2` each way."""
        self.control.write(json.dumps({"delay_ms": rtt_ms / 2}).encode() + b"\n")
        await self.control.drain()


@contextlib.asynccontextmanager
async def delay_line(
    target_port: int, rtt_ms: float, rate_mbit: float | None, log: Path
) -> AsyncIterator[Line]:
    """A delay line child in front of 127.0.0.1:`target_port`."""
    with log.open("wb") as errors:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench._delay_proxy",
            "--target",
            f"127.0.0.1:{target_port}",
            "--delay-ms",
            str(rtt_ms / 2),
            *([] if rate_mbit is None else ["--rate-mbit", str(rate_mbit)]),
            cwd=ROOT,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=errors,
        )
    try:
        assert process.stdout is not None
        assert process.stdin is not None
        async with asyncio.timeout(30):
            hello = json.loads(await process.stdout.readline() or b"{}")
        yield Line(int(hello["port"]), process.stdin)
    finally:
        if process.returncode is None:
            process.terminate()
        await process.communicate()
