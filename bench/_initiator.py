"""A fast VirtualStream INITIATOR for bench/stream_responder.py: pre-encoded chunk frames.

It speaks exactly what typedrequest 3.3.0's initiator sends (tests/interop/README.md, "The
order TS sends a stream in"): the outer request with the marker, one `feedback` probe, then
one `chunk` frame per chunk with ONE frame in flight, the closing-bit chunk last; on
`backpressure: true` it re-probes with `feedback` every `probe_interval` s (TS: ~50 ms).

The chunk JSON (`chunkData`) is encoded once per distinct chunk, before any timing; a frame is
`head + cycleId + mid + chunk JSON + tail`, one `bytes.join` (a memcpy), so the initiator costs
next to nothing and every responder receives byte-identical frames for the same stream id.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import orjson
from websockets.asyncio.client import ClientConnection, connect

__all__ = ["FORMS", "ChunkSet", "RunResult", "run_stream"]

STREAM_METHOD: Final = "##VirtualStream##"
CLOSING_BIT: Final = "#############CLOSING BIT#############"
FORMS: Final = ("buffer", "base64", "object")


def _chunk_json(data: bytes, form: str) -> bytes:
    if form == "buffer":  # a Node Buffer through JSON.stringify
        return orjson.dumps({"type": "Buffer", "data": list(data)})
    if form == "base64":  # smartjson's EncodedBuffer
        return orjson.dumps({"type": "EncodedBuffer", "data": "base64:" + _b64(data)})
    if form == "object":  # a Uint8Array through JSON.stringify
        return orjson.dumps({str(i): b for i, b in enumerate(data)})
    raise ValueError(f"unknown form {form!r}")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


@dataclass(frozen=True, slots=True)
class ChunkSet:
    """`distinct` chunks of `chunk_size` bytes, cycled to make a stream of any chunk count."""

    chunks: tuple[bytes, ...]

    @classmethod
    def generate(cls, seed: str, chunk_size: int, distinct: int) -> ChunkSet:
        """Deterministic bytes (SHAKE256 of the seed, as the interop harness makes them)."""
        data = hashlib.shake_256(seed.encode()).digest(chunk_size * distinct)
        return cls(tuple(data[i * chunk_size : (i + 1) * chunk_size] for i in range(distinct)))

    @property
    def chunk_size(self) -> int:
        """Bytes per chunk."""
        return len(self.chunks[0])

    def sha256(self, count: int) -> str:
        """The sha256 of a stream of `count` chunks."""
        digest = hashlib.sha256()
        for index in range(count):
            digest.update(self.chunks[index % len(self.chunks)])
        return digest.hexdigest()

    def encode(self, form: str) -> tuple[bytes, ...]:
        """The `chunkData` JSON of every distinct chunk in `form`."""
        return tuple(_chunk_json(chunk, form) for chunk in self.chunks)


def _stream_frame(stream_id: str, cycle_id: str, purpose: str, **fields: Any) -> bytes:
    package = {"streamId": stream_id, "cycleId": cycle_id, "cycle": "request"}
    package["mainPurpose"] = purpose
    return orjson.dumps({"method": STREAM_METHOD, "request": package | fields, "response": None})


@dataclass(frozen=True, slots=True)
class RunResult:
    """One stream pushed through one responder."""

    bytes: int
    seconds: float  # first chunk sent -> outer reply received
    cpu_seconds: float  # the responder process's user+system time over the same span
    initiator_cpu_seconds: float  # this process's CPU time over the same span
    response: dict[str, Any] | None  # the outer call's response (None: error or cut short)
    error: dict[str, Any] | None  # the outer call's `error`, if any
    chunks_sent: int
    backpressure_probes: int

    @property
    def mb_per_s(self) -> float:
        """Decimal MB per second, end to end."""
        return self.bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0


class _Ended(Exception):
    """The outer call was answered before the stream was through."""


class _Conversation:
    def __init__(self, ws: ClientConnection, method: str) -> None:
        self.ws = ws
        self.method = method
        self.outer: dict[str, Any] | None = None

    async def stream_reply(self) -> dict[str, Any] | None:
        """The next stream answer's package (None: the responder echoed it, unknown stream)."""
        while True:
            message = orjson.loads(await self.ws.recv(decode=False))
            if message.get("method") == STREAM_METHOD:
                package: dict[str, Any] | None = message.get("response")
                return package
            if (message.get("correlation") or {}).get("phase") == "response":
                self.outer = message
                raise _Ended

    async def outer_reply(self) -> dict[str, Any]:
        while self.outer is None:
            try:
                await self.stream_reply()
            except _Ended:
                break
        assert self.outer is not None
        return self.outer


async def run_stream(
    url: str,
    *,
    stream_id: str,
    chunk_json: tuple[bytes, ...],
    chunk_size: int,
    count: int,
    cpu_of_responder: Callable[[], float],
    probe_interval: float,
    method: str = "benchUpload",
) -> RunResult:
    """Push `count` chunks (cycling `chunk_json`) through the responder at `url`."""
    head = f'{{"method":"{STREAM_METHOD}","request":{{"streamId":"{stream_id}","cycleId":"'
    mid = b'","cycle":"request","mainPurpose":"chunk","backpressure":false,"next":true,"chunkData":'
    tail = b'},"response":null}'
    probes = 0
    async with connect(url, max_size=None, compression=None, ping_interval=None) as ws:
        talk = _Conversation(ws, method)
        marker = {"_isVirtualStream": True, "streamId": stream_id}
        await ws.send(
            orjson.dumps(
                {
                    "method": method,
                    "request": {"archive": marker},
                    "response": None,
                    "correlation": {"id": f"{stream_id}-call", "phase": "request"},
                }
            ),
            text=True,
        )

        async def feedback_until_clear(cycle: str) -> None:
            nonlocal probes
            probe = _stream_frame(stream_id, cycle, "feedback", next=True, backpressure=False)
            while True:
                await ws.send(probe, text=True)
                package = await talk.stream_reply()
                if package is not None and not package.get("backpressure"):
                    return
                probes += 1
                await asyncio.sleep(probe_interval)

        sent = 0
        started, own_started = time.perf_counter(), time.process_time()
        cpu_started = cpu_of_responder()
        try:
            await feedback_until_clear("probe-0")
            started, own_started = time.perf_counter(), time.process_time()
            cpu_started = cpu_of_responder()
            head_bytes = head.encode()
            for index in range(count):
                cycle = f"c{index:09d}".encode()
                payload = chunk_json[index % len(chunk_json)]
                await ws.send(b"".join((head_bytes, cycle, mid, payload, tail)), text=True)
                sent += 1
                package = await talk.stream_reply()
                if package is None:
                    raise RuntimeError(f"the responder did not take chunk {index} of {stream_id}")
                if package.get("backpressure"):
                    probes += 1
                    await asyncio.sleep(probe_interval)
                    await feedback_until_clear(f"p{index:09d}")
            closing = _stream_frame(
                stream_id, "closing", "chunk", backpressure=False, next=False, chunkData=CLOSING_BIT
            )
            await ws.send(closing, text=True)
            await talk.stream_reply()
            outer = await talk.outer_reply()
        except _Ended:
            outer = await talk.outer_reply()
        seconds = time.perf_counter() - started
        own_cpu = time.process_time() - own_started
        cpu = cpu_of_responder() - cpu_started
    response = outer.get("response")
    return RunResult(
        bytes=sent * chunk_size,
        seconds=seconds,
        cpu_seconds=cpu,
        initiator_cpu_seconds=own_cpu,
        response=response if isinstance(response, dict) else None,
        error=outer.get("error"),
        chunks_sent=sent,
        backpressure_probes=probes,
    )
