"""A TCP proxy between the agent and the stand-in Cloudly that forwards the agent's websocket
frames one per write, and can lose the agent's answer to a method.

The agent writes an answer and the ping that would confirm it in one step, so a websocket peer
usually reads both in one read. Cloudly's `ws` does not have to: TCP may split them, and with
`allowSynchronousEvents: false` `ws` yields to the event loop after every frame anyway. Either
way Cloudly's code can send its next request before `ws` answers the ping. This proxy is for
that case: it forwards the agent's frames one per write (each drained before the next), as a
real network splits them, so Node's socket can read an answer without the ping behind it.
Cloudly's bytes go to the agent as they come.

Client frames (agent -> Cloudly) are parsed per RFC 6455 (2-byte header, 16/64-bit extended
length, always masked); nothing is changed in them. `lose_next_answer(method)` arms a one-shot
cut: the agent's next text frame that answers `method` (`correlation.phase: "response"`) is not
forwarded, `then()` runs (a test kills the agent there: right after it wrote its answer) and both
sockets are aborted, so nothing that could confirm the answer (Cloudly's pong) ever reaches the
agent. Each accepted connection gets its own upstream connection; the proxy keeps listening.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Cut", "SplittingProxy"]

OPCODE_TEXT = 0x1
# Answers are small JSON objects; a bigger text frame (a closure chunk) is never unmasked.
MAX_INSPECTED = 1 << 20


@dataclass
class Cut:
    """A cut armed with `lose_next_answer`: `done` is set once it happened."""

    method: str
    then: Callable[[], object] | None
    done: asyncio.Event = field(default_factory=asyncio.Event)


class SplittingProxy:
    """127.0.0.1, any free port -> the stand-in Cloudly on `upstream_port`."""

    def __init__(self, upstream_port: int) -> None:
        self._upstream_port = upstream_port
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._cut: Cut | None = None
        self.port = 0

    @property
    def url(self) -> str:
        """The websocket URL the agent connects to."""
        return f"ws://127.0.0.1:{self.port}/"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def lose_next_answer(self, method: str, *, then: Callable[[], object] | None = None) -> Cut:
        """Arm the cut: the agent's next answer to `method` is dropped and its connection cut
        (after `then()`)."""
        self._cut = Cut(method, then)
        return self._cut

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.create_task(self._serve(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, agent_in: asyncio.StreamReader, agent_out: asyncio.StreamWriter) -> None:
        try:
            cloudly_in, cloudly_out = await asyncio.open_connection(
                "127.0.0.1", self._upstream_port
            )
        except OSError:
            agent_out.transport.abort()
            return
        up = asyncio.create_task(self._agent_to_cloudly(agent_in, cloudly_out))
        down = asyncio.create_task(_pipe(cloudly_in, agent_out))
        try:
            # Either direction ending (its end of file, a reset, the cut) ends the connection.
            await asyncio.wait({up, down}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            agent_out.transport.abort()
            cloudly_out.transport.abort()
            up.cancel()
            down.cancel()
            await asyncio.gather(up, down, return_exceptions=True)

    async def _agent_to_cloudly(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter
    ) -> None:
        sink.write(await source.readuntil(b"\r\n\r\n"))  # the HTTP upgrade request, as it is
        await sink.drain()
        while True:
            frame, payload = await _read_frame(source)
            cut = self._cut
            if cut is not None and _answers(payload(), cut.method):
                self._cut = None
                if cut.then is not None:
                    cut.then()
                cut.done.set()
                return  # not forwarded; _serve aborts both sockets
            sink.write(frame)
            await sink.drain()


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    while data := await source.read(65536):
        sink.write(data)
        await sink.drain()


async def _read_frame(
    source: asyncio.StreamReader,
) -> tuple[bytes, Callable[[], bytes | None]]:
    """One client frame: its bytes as they came, and what unmasks its payload if it is a final
    text frame of at most `MAX_INSPECTED` bytes (else None): only an armed cut looks."""
    head = await source.readexactly(2)
    fin, opcode = head[0] & 0x80, head[0] & 0x0F
    masked, length = head[1] & 0x80, head[1] & 0x7F
    extended = b""
    if length == 126:
        extended = await source.readexactly(2)
        (length,) = struct.unpack("!H", extended)
    elif length == 127:
        extended = await source.readexactly(8)
        (length,) = struct.unpack("!Q", extended)
    mask = await source.readexactly(4) if masked else b""
    body = await source.readexactly(length)

    def payload() -> bytes | None:
        if not fin or opcode != OPCODE_TEXT or length > MAX_INSPECTED:
            return None
        return _unmask(body, mask) if masked else body

    return head + extended + mask + body, payload


def _unmask(body: bytes, mask: bytes) -> bytes:
    repeated = (mask * (len(body) // 4 + 1))[: len(body)]
    return (int.from_bytes(body, "big") ^ int.from_bytes(repeated, "big")).to_bytes(
        len(body), "big"
    )


def _answers(payload: bytes | None, method: str) -> bool:
    """Whether `payload` is an answer (response or error) to a request for `method`."""
    if payload is None or method.encode() not in payload:
        return False
    with contextlib.suppress(ValueError):
        frame: Any = json.loads(payload)
        return (
            isinstance(frame, dict)
            and frame.get("method") == method
            and isinstance(frame.get("correlation"), dict)
            and frame["correlation"].get("phase") == "response"
        )
    return False
