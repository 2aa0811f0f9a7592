"""A delay line for one TCP leg: every byte waits `delay` seconds each way, optionally paced.

    python -m bench._delay_proxy --target HOST:PORT --delay-ms 100 [--rate-mbit 200]

listens on 127.0.0.1 (a free port), prints one JSON line `{"port": N}` and forwards each
connection to `--target`, both directions. What arrives is stamped and handed on `delay-ms`
milliseconds later (so a round trip through it gains twice that), in order; with `--rate-mbit`
the bytes leave no faster than that, per direction (a token bucket, so a long transfer sees
the cap and queueing builds up as on a real link). What waits in the line is bounded
(`--buffer-mib`, default 64 MiB per direction): past it the proxy stops reading, and TCP's
own flow control pushes back on the sender, as a full router queue would. SIGTERM stops it.

The delay changes on a live line: each JSON line `{"delay_ms": N}` on stdin sets it for every
connection, both directions (a route change, a failover): what arrives from then on waits the
new delay; what is already in the line keeps its time, and nothing overtakes it.

Benchmarks only (bench/wan.py): real time, on purpose. The agent's tests inject their clocks.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
from collections import deque

__all__ = ["Delay", "DelayLine", "main"]

_READ = 256 * 1024


class Delay:
    """The seconds every line waits, shared by all of them (stdin changes it)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds


class DelayLine:
    """One direction of one connection: read, stamp, hold `delay` s, pace, write."""

    def __init__(self, delay: Delay, rate: float | None, buffer: int) -> None:
        self._delay, self._rate, self._buffer = delay, rate, buffer
        self._queue: deque[tuple[float, bytes]] = deque()
        self._held = 0
        self._arrived = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._ended = False

    async def intake(self, reader: asyncio.StreamReader) -> None:
        loop = asyncio.get_running_loop()
        try:
            while data := await reader.read(_READ):
                while self._held >= self._buffer:
                    self._room.clear()
                    await self._room.wait()
                self._queue.append((loop.time() + self._delay.seconds, data))
                self._held += len(data)
                self._arrived.set()
        finally:
            self._ended = True
            self._arrived.set()

    async def outlet(self, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        free_at = loop.time()  # when the paced line can take the next byte
        while True:
            while not self._queue:
                if self._ended:
                    with contextlib.suppress(OSError):
                        writer.write_eof()
                    return
                self._arrived.clear()
                await self._arrived.wait()
            due, data = self._queue.popleft()
            self._held -= len(data)
            self._room.set()
            now = loop.time()
            if self._rate is not None:
                free_at = max(free_at, now) + len(data) / self._rate
                due = max(due, free_at)
            if due > now:
                await asyncio.sleep(due - now)
            writer.write(data)
            await writer.drain()


async def _serve(args: argparse.Namespace) -> None:
    host, _, port = args.target.rpartition(":")
    delay = Delay(args.delay_ms / 1000.0)
    rate = None if args.rate_mbit is None else args.rate_mbit * 1e6 / 8
    buffer = args.buffer_mib * 1024 * 1024
    tasks: set[asyncio.Task[None]] = set()

    async def connection(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(host, int(port))
        except OSError:
            client_w.close()
            return
        up, down = DelayLine(delay, rate, buffer), DelayLine(delay, rate, buffer)
        work = [
            up.intake(client_r),
            up.outlet(server_w),
            down.intake(server_r),
            down.outlet(client_w),
        ]
        try:
            await asyncio.gather(*work)
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            for writer in (client_w, server_w):
                writer.close()

    def spawn(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        task = asyncio.create_task(connection(r, w))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    server = await asyncio.start_server(spawn, "127.0.0.1", 0)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    print(json.dumps({"port": server.sockets[0].getsockname()[1]}), flush=True)
    control = asyncio.create_task(_control(delay))
    async with server:
        await stop.wait()
    control.cancel()
    for task in list(tasks):
        task.cancel()


async def _control(delay: Delay) -> None:
    """Set the delay from each `{"delay_ms": N}` line on stdin until it ends."""
    reader = asyncio.StreamReader()
    loop = asyncio.get_running_loop()
    try:
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    except (OSError, ValueError):  # stdin is no pipe: a fixed delay
        return
    while line := await reader.readline():
        delay.seconds = float(json.loads(line)["delay_ms"]) / 1000.0
        print(json.dumps({"delay_ms": delay.seconds * 1000.0}), file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """Parse the flags and forward until SIGTERM."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="HOST:PORT to forward to")
    parser.add_argument("--delay-ms", type=float, required=True, help="added each way")
    parser.add_argument("--rate-mbit", type=float, help="cap per direction (default none)")
    parser.add_argument("--buffer-mib", type=int, default=64, help="held per direction")
    asyncio.run(_serve(parser.parse_args(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
