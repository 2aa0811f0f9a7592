"""A replaying VirtualStream initiator for a REAL agent's stage: pre-encoded chunk frames.

The stand-in Cloudly (`devstack.cloudly.StandInCloudly`, in the bench process) holds the
agent's session and sends `stageIsolatedRestoreArchive` with a stream marker; the stream's own
frames do not come from its `Peer` but are replayed here, straight onto the same websocket, as
typedrequest 3.3.0's initiator sends them (bench/_initiator.py): one `feedback` probe, then one
`chunk` frame per chunk with ONE frame in flight, the closing bit last, and on `backpressure`
a re-probe every `probe_interval`. Each frame is `head + cycleId + mid + chunk JSON + tail`,
the chunk JSON encoded once per distinct chunk before timing, so the initiator costs next to
nothing and the agent receives byte-identical frames to those the JS responder gets.

The agent's answers are read through the stand-in connection's `taps` (the stand-in's peer drops
them: they answer no cycle it sent), each matched to its frame by `cycleId`, as an initiator
matches them: the stand-in's peer echoes the first answer of a stream it does not know back to
the agent once, and the agent's answer to that echo answers no frame sent here. Concurrent
replays on one connection send one frame at a time (a lock per websocket): on Python 3.11 an
asyncio transport keeps unsent data in one bytearray and deletes what each partial send took
from its front, so sixteen 3.7 MB frames written at once cost this process a memmove of the
whole backlog per send -- a cost of the bench's own Cloudly, which the agent's node would never
pay.
"""

from __future__ import annotations

import asyncio
import secrets
import time
import weakref
from dataclasses import dataclass
from typing import Any, Final

import orjson

from agent.contracts.isolatedrestore import METHOD_STAGE
from devstack.cloudly import StandInCloudly
from devstack.driver import ObjectSpec, RestoreDriver

__all__ = ["ReplayResult", "replay_stage"]

_SEND_LOCKS: weakref.WeakKeyDictionary[Any, asyncio.Lock] = weakref.WeakKeyDictionary()

STREAM_METHOD: Final = "##VirtualStream##"
CLOSING_BIT: Final = "#############CLOSING BIT#############"
_PREFIX: Final = b'{"method":"##VirtualStream##"'


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """One replayed stage."""

    bytes: int
    seconds: float  # first chunk sent -> the stage's reply
    state: dict[str, Any]  # the node state the stage answered
    probes: int  # backpressure re-probes
    waited: float = 0.0  # the stage call sent -> its first chunk sent
    # The longest backpressure pause after the first chunk: a stage waiting for its node's
    # transfer slot holds its stream (after the window it took before it was held).
    longest_pause: float = 0.0

    @property
    def moving_mb_per_s(self) -> float:
        """MB/s without the longest pause (the wait for a transfer slot, when there was one)."""
        return self.bytes / 1e6 / max(self.seconds - self.longest_pause, 1e-9)

    @property
    def mb_per_s(self) -> float:
        """Decimal MB/s, end to end."""
        return self.bytes / 1e6 / self.seconds


def _package(stream_id: str, cycle: str, purpose: str, **fields: Any) -> bytes:
    package = {"streamId": stream_id, "cycleId": cycle, "cycle": "request", "mainPurpose": purpose}
    return orjson.dumps({"method": STREAM_METHOD, "request": package | fields, "response": None})


async def replay_stage(
    cloudly: StandInCloudly,
    driver: RestoreDriver,
    spec: ObjectSpec,
    *,
    chunk_json: tuple[bytes, ...],
    chunk_size: int,
    probe_interval: float = 0.05,
    timeout: float = 1800.0,  # noqa: ASYNC109  # the stage call's deadline
) -> ReplayResult:
    """Stage `spec` (prepared already) whose bytes are `chunk_json` cycled, chunk by chunk."""
    count, rest = divmod(spec.size, chunk_size)
    if rest:
        raise ValueError("the object must be a whole number of chunks")
    connection = cloudly.connection
    websocket = connection.websocket
    lock = _SEND_LOCKS.setdefault(websocket, asyncio.Lock())

    async def send(frame: bytes, cycle: str) -> None:
        nonlocal sent_cycle
        sent_cycle = cycle
        async with lock:
            await websocket.send(frame, text=True)

    stream_id = "uni_" + secrets.token_hex(12)
    tag = stream_id[-8:]
    answers: asyncio.Queue[tuple[Any, dict[str, Any] | None]] = asyncio.Queue()
    sent_cycle = ""

    def tap(frame: bytes) -> None:
        if not frame.startswith(_PREFIX) or len(frame) > 4096:
            return
        message = orjson.loads(frame)
        response, request = message.get("response"), message.get("request")
        package = response if isinstance(response, dict) else request
        if isinstance(package, dict) and package.get("streamId") == stream_id:
            answer = response if isinstance(response, dict) else None
            answers.put_nowait((package.get("cycleId"), answer))

    async def next_answer() -> dict[str, Any] | None:
        """The answer to the frame sent last (answers to other cycles are not ours)."""
        async with asyncio.timeout(60):
            while True:
                cycle, answer = await answers.get()
                if cycle == sent_cycle:
                    return answer

    connection.taps.append(tap)
    probes, longest_pause = 0, 0.0
    body = {
        **driver._base(),  # the driver's fresh grant and routing fields
        "expectedRevision": driver.revision,
        "object": spec.entry(),
        "archive": {"_isVirtualStream": True, "streamId": stream_id},
    }
    call = asyncio.create_task(cloudly.call_agent(METHOD_STAGE, body, timeout))
    called = time.perf_counter()

    async def until_clear(prefix: str) -> None:
        """Probe with `feedback` until the agent knows the stream and has room."""
        nonlocal probes
        for attempt in range(100_000):
            cycle = f"{tag}-{prefix}{attempt}"  # cycle ids are unique on a connection, as in TS
            await send(_package(stream_id, cycle, "feedback"), cycle)
            answer = await next_answer()
            if answer is not None and not answer.get("backpressure"):
                return
            probes += 1
            if call.done():
                call.result()  # the stage was refused: say why
            await asyncio.sleep(probe_interval)
        raise RuntimeError("the agent never took the stream")

    try:
        await until_clear("start-")  # the stage request went first: the agent knows the stream
        head = (
            b'{"method":"##VirtualStream##","request":{"streamId":"' + stream_id.encode()
        ) + b'","cycleId":"'
        mid = (
            b'","cycle":"request","mainPurpose":"chunk","backpressure":false,"next":true,'
            b'"chunkData":'
        )
        tail = b'},"response":null}'
        started = time.perf_counter()
        for index in range(count):
            cycle = f"{tag}-c{index:09d}"
            frame = b"".join((head, cycle.encode(), mid, chunk_json[index % len(chunk_json)], tail))
            await send(frame, cycle)
            answer = await next_answer()
            if answer is None:
                raise RuntimeError(f"the agent did not take chunk {index}")
            if answer.get("backpressure"):
                probes += 1
                paused = time.perf_counter()
                await asyncio.sleep(probe_interval)
                await until_clear(f"p{index:09d}-")
                longest_pause = max(longest_pause, time.perf_counter() - paused)
        closing = _package(
            stream_id,
            f"{tag}-closing",
            "chunk",
            backpressure=False,
            next=False,
            chunkData=CLOSING_BIT,
        )
        await send(closing, f"{tag}-closing")
        await next_answer()
        answer = await call
        seconds = time.perf_counter() - started
    finally:
        connection.taps.remove(tap)
        if not call.done():
            call.cancel()
    driver._seen(METHOD_STAGE, answer["state"])  # keep the driver's revision
    return ReplayResult(
        spec.size, seconds, answer["state"], probes, started - called, longest_pause
    )
