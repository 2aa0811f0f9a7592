"""The asyncio faces of VirtualStreams for `Peer`: wake-up signals, `ByteSource`, `ByteSink`.

Private to `agent.session.peer`. A `StreamHandle` pairs one pure stream machine (responder or
initiator) with a `Signal` that every state change of that stream fires; consumers, producers
and the initiator's driver task wait on it and re-check the machine, so no wake-up is lost.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final

import structlog

from agent.errors import SessionClosed, StreamBroken
from agent.protocol.chunks import CLOSING
from agent.protocol.envelope import Envelope, encode_envelope
from agent.protocol.stream_initiator import InitiatorState, InitiatorStream
from agent.protocol.stream_responder import ResponderStream, StreamState
from agent.protocol.streams import StreamRegistry

__all__ = [
    "MAX_CHUNK",
    "PeerSink",
    "PeerSource",
    "Signal",
    "StreamHandle",
    "drive_initiator",
    "keep_house",
]

log = structlog.get_logger("agent.session.peer")

# A write larger than this goes out as several chunks: one 1 MiB chunk is a ~4 MB frame in the
# Buffer form already, and the window bounds memory as window x chunk size.
MAX_CHUNK: Final = 1 << 20


class Signal:
    """A broadcast wake-up: `fire()` wakes every current waiter; waiters re-check state."""

    def __init__(self) -> None:
        self._waiters: set[asyncio.Future[None]] = set()

    def fire(self) -> None:
        """Wake every waiter."""
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._waiters.clear()

    async def wait(self, within: float | None = None) -> None:
        """Wait for the next `fire()`, or at most `within` seconds."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.add(waiter)
        try:
            if within is None:
                await waiter
            else:
                async with asyncio.timeout(max(within, 0.0)):
                    await waiter
        except TimeoutError:
            pass
        finally:
            self._waiters.discard(waiter)


@dataclass(slots=True)
class StreamHandle:
    """One stream machine and its signal."""

    stream: ResponderStream | InitiatorStream
    signal: Signal = field(default_factory=Signal)

    @property
    def stream_id(self) -> str:
        """The stream id."""
        return self.stream.stream_id


SendAnswer = Callable[[Envelope], Awaitable[object]]


class PeerSource:
    """`ByteSource`: iterate to receive chunks; ends at the closing bit."""

    def __init__(self, handle: StreamHandle, *, on_stop: Callable[[], None]) -> None:
        self.stream_id = handle.stream_id
        self._handle = handle
        self._on_stop = on_stop  # abandon/abort when the consumer stops before the end
        self._finished = False

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        if self._finished:
            raise StopAsyncIteration
        stream = self._handle.stream
        while True:
            try:
                item = stream.take()
            except StreamBroken:
                self._finished = True
                raise
            if item is None:
                await self._handle.signal.wait()
                continue
            self._handle.signal.fire()  # room in the window: the driver may read on
            if item is CLOSING:
                self._finished = True
                raise StopAsyncIteration
            assert isinstance(item, bytes)
            return item

    async def aclose(self) -> None:
        """Stop reading before the end: the rest of the stream is discarded."""
        if not self._finished:
            self._finished = True
            self._on_stop()
            self._handle.signal.fire()


class PeerSink:
    """`ByteSink`: `write` waits while the window is full; `close` sends the closing bit."""

    def __init__(
        self, handle: StreamHandle, *, send_answer: SendAnswer, clock: Callable[[], float]
    ) -> None:
        self.stream_id = handle.stream_id
        self._handle = handle
        self._send_answer = send_answer  # a parked `read` released by our write
        self._clock = clock

    async def write(self, data: bytes) -> None:
        """Queue `data` (split into chunks of at most `MAX_CHUNK`), waiting for room."""
        view = memoryview(data)
        for start in range(0, len(view), MAX_CHUNK):
            await self._wait_for_space()
            piece = bytes(view[start : start + MAX_CHUNK])
            stream = self._handle.stream
            if isinstance(stream, ResponderStream):
                answer = stream.offer(piece)
                if answer is not None:
                    await self._send_answer(answer)
            else:
                stream.write(piece)
            self._handle.signal.fire()

    async def close(self) -> None:
        """Queue the closing bit. On a stream we drive, wait until the responder took it."""
        await self._wait_for_space()
        stream = self._handle.stream
        if isinstance(stream, ResponderStream):
            answer = stream.close()
            self._handle.signal.fire()
            if answer is not None:
                await self._send_answer(answer)
            return
        stream.close()
        self._handle.signal.fire()
        while stream.state not in (InitiatorState.ENDED, InitiatorState.BROKEN):
            await self._handle.signal.wait()
        if stream.state is InitiatorState.BROKEN:
            raise StreamBroken(f"stream {stream.stream_id} broke: {stream.broken_reason}")

    async def abort(self) -> None:
        """Stop without a closing bit; the peer sees the stream break."""
        stream = self._handle.stream
        if isinstance(stream, ResponderStream):
            answer = stream.abort("the sender aborted", self._clock())
            self._handle.signal.fire()
            if answer is not None:
                await self._send_answer(answer)
            return
        stream.abort("the sender aborted")
        self._handle.signal.fire()

    async def _wait_for_space(self) -> None:
        stream = self._handle.stream
        while not stream.has_space():
            if stream.state in (StreamState.BROKEN, InitiatorState.BROKEN):
                break  # the write below raises StreamBroken
            await self._handle.signal.wait()


async def drive_initiator(
    handle: StreamHandle,
    stream: InitiatorStream,
    registry: StreamRegistry,
    send: Callable[[bytes], Awaitable[None]],
    clock: Callable[[], float],
) -> None:
    """The task that sends one initiator stream's frames; ends after its farewell frame."""
    try:
        while True:
            for env in registry.poll(stream, clock()):
                await send(encode_envelope(env))
            handle.signal.fire()
            if stream.done and not stream.poll(clock()):
                break
            wake = stream.next_wakeup()
            await handle.signal.wait(None if wake is None else wake - clock())
    except SessionClosed:
        stream.abort("the session closed")
        handle.signal.fire()
    finally:
        if stream.done:
            if stream.broken_reason:
                log.warning(
                    "stream_broken", stream_id=stream.stream_id, reason=stream.broken_reason
                )
            registry.forget_initiator(stream.stream_id)


async def keep_house(
    registry: StreamRegistry,
    handles: dict[str, StreamHandle],
    send_answer: SendAnswer,
    clock: Callable[[], float],
    wake_up: Signal,
    interval: float,
) -> None:
    """Responder timers: parked `read`s, idle streams, finished registrations. Runs forever."""
    while True:
        for stream_id, answer in registry.expire(clock()):
            if (handle := handles.get(stream_id)) is not None:
                handle.signal.fire()
                if handle.stream.broken_reason:
                    log.warning(
                        "stream_broken", stream_id=stream_id, reason=handle.stream.broken_reason
                    )
            if answer is not None:
                await send_answer(answer)
        for stream_id in [s for s in handles if s not in registry.responders]:
            if stream_id not in registry.initiators:
                del handles[stream_id]
        wake = registry.next_wakeup()
        await wake_up.wait(interval if wake is None else min(interval, wake - clock()))
