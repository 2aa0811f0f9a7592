"""The agent as VirtualStream RESPONDER, in its own process, for bench/stream_responder.py.

The Python counterpart of bench/node_responder.mjs: a `websockets` server whose connections are
each driven by the agent's own `Peer` (the same code the daemon runs), serving `benchUpload
{archive: <stream marker>}`. The handler reads the stream with `ctx.receive_stream` and hashes
it, exactly like the JS responder's `drainStream`. Run from the repository root:

    .venv/bin/python -m bench._agent_responder [--port 0] [--window 16] [--log-level info]
        [--profile stats.prof]

stdout, one JSON object a line (the same shape as node_responder.mjs):
    {"event":"listening","port":N,"pid":P}                                   once, first
    {"event":"stream","streamId":..,"status":"complete"|"broken","bytes":..,"chunks":..,
     "sha256":..,"seconds":..}                                                per stream
`seconds` runs from the first chunk to the closing bit. Logs (the agent's own structlog
pipeline) go to stderr. Runs until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import hashlib
import os
import signal
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
from websockets.asyncio.server import ServerConnection, serve

from agent.contracts.base import StreamMarker, WireModel
from agent.errors import SessionClosed, StreamBroken
from agent.log import configure_logging
from agent.protocol.connection import ConnectionSettings, StreamSettings
from agent.protocol.handlers import RequestContext, Route, Routes
from agent.session.peer import Peer
from agent.session.transport import WebsocketTransport, quiet_websocket_logger

__all__ = ["main"]


class BenchUpload(WireModel):
    """`benchUpload`'s request: one stream."""

    archive: StreamMarker


class BenchResult(WireModel):
    """What arrived."""

    field: str
    stream_id: str
    status: str
    bytes: int
    chunks: int
    sha256: str
    seconds: float


def emit(obj: Mapping[str, Any]) -> None:
    """One JSON line on stdout."""
    sys.stdout.buffer.write(orjson.dumps(obj) + b"\n")
    sys.stdout.buffer.flush()


async def bench_upload(body: BenchUpload, ctx: RequestContext) -> BenchResult:
    """Drain the stream, hashing it; answer with what arrived."""
    digest = hashlib.sha256()
    size = chunks = 0
    status = "complete"
    first: float | None = None
    try:
        async for chunk in ctx.receive_stream(body.archive):
            if first is None:
                first = time.perf_counter()
            digest.update(chunk)
            size += len(chunk)
            chunks += 1
    except StreamBroken:
        status = "broken"
    seconds = 0.0 if first is None else time.perf_counter() - first
    record = BenchResult(
        field="archive",
        stream_id=body.archive.stream_id,
        status=status,
        bytes=size,
        chunks=chunks,
        sha256=digest.hexdigest(),
        seconds=seconds,
    )
    emit({"event": "stream", **record.to_wire()})
    return record


async def serve_forever(port: int, settings: ConnectionSettings, max_frame: int) -> None:
    """Serve until SIGTERM/SIGINT."""
    router = Routes([Route("benchUpload", BenchUpload, bench_upload)])

    async def one_connection(websocket: ServerConnection) -> None:
        peer = Peer(WebsocketTransport(websocket), router, settings=settings)
        with contextlib.suppress(SessionClosed):  # the initiator hung up: that is the end
            await peer.run()

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    async with serve(
        one_connection,
        "127.0.0.1",
        port,
        max_size=max_frame,
        compression=None,
        logger=quiet_websocket_logger("websockets.server"),
    ) as server:
        bound = server.sockets[0].getsockname()[1]
        emit({"event": "listening", "port": bound, "pid": os.getpid()})
        await stop.wait()


def main() -> None:
    """Parse the flags and serve."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--window", type=int, default=StreamSettings().window)
    parser.add_argument("--max-frame-mib", type=int, default=64)
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--profile", type=Path, help="write cProfile stats here at exit")
    args = parser.parse_args()
    configure_logging("json", args.log_level, sys.stderr)
    settings = ConnectionSettings(streams=StreamSettings(window=args.window))
    work = serve_forever(args.port, settings, args.max_frame_mib * 2**20)
    if args.profile is None:
        asyncio.run(work)
        return
    with cProfile.Profile() as profile:
        asyncio.run(work)
    profile.dump_stats(args.profile)


if __name__ == "__main__":
    main()
