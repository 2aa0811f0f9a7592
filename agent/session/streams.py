"""The asyncio faces of VirtualStreams: `Signal`, a `Peer`'s `ByteSource`/`ByteSink`, and the
`RequestContext` its handlers get (`HandlerContext`).

A source or sink names one stream of the peer's `Connection` by its id: it acts through the
connection (`take`, `write`, `end_stream`, ...), asks it (`can_write`, `stream_outcome`), then
lets the peer flush what that produced. It waits on its `Signal`, which the peer fires for
every `StreamChanged`, `StreamEnded` and `StreamBroke` event of its stream; waiters always ask
the connection again, so no wake-up is lost.

The stall deadline (`StreamOwner.stall_timeout`): a peer can keep a stream alive with
keepAlives forever while it moves no byte (it stops sending, or stops reading so the window
never frees). The protocol's keep-alive timeout cannot see that, so every wait here is bounded:
a source that waits `stall_timeout` s for the next chunk, a sink that waits as long for room in
the window (or for the closing bit's acknowledgement) aborts the stream and raises
`StreamBroken` (`transfer-interrupted`, retryable), and whoever reads or writes it ends as on
any broken stream. The deadline is set and waited for on the owner's clock (`now()`, and the
`Signal`'s `clock.timeout_at`), as every stream timer: a clock moved by hand moves it too.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Protocol

from agent.clock import Clock
from agent.contracts.base import StreamMarker
from agent.errors import StreamBroken
from agent.observe import Direction
from agent.protocol.chunks import CLOSING
from agent.protocol.connection import Connection, StreamBroke
from agent.protocol.delivery import Mark
from agent.protocol.handlers import ByteSink, ByteSource, Producer
from agent.session.delivery import DeliveryTracker, OnDelivered

__all__ = ["HandlerContext", "Signal", "Sink", "Source", "StreamOwner", "marker_of"]


class Signal:
    """A broadcast wake-up: `fire()` wakes every current waiter. Waits are bounded on `clock`."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._waiters: set[asyncio.Future[None]] = set()

    def fire(self) -> None:
        """Wake every waiter."""
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._waiters.clear()

    async def wait(self, deadline: float | None = None) -> bool:
        """Wait for the next `fire()` (True), or until the clock reads `deadline` (False; None:
        no bound)."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.add(waiter)
        try:
            if deadline is None:
                await waiter
            else:
                async with self._clock.timeout_at(deadline):
                    await waiter
        except TimeoutError:
            return False
        finally:
            self._waiters.discard(waiter)
        return True


class StreamOwner(Protocol):
    """What a source or sink needs of its peer."""

    @property
    def connection(self) -> Connection: ...

    def now(self) -> float: ...

    async def flush(self, *, closed_ok: bool = False) -> None: ...

    def watch(self, stream_id: str) -> Signal: ...

    def unwatch(self, stream_id: str) -> None: ...

    def count_stream_bytes(self, direction: Direction, count: int) -> None: ...

    @property
    def stall_timeout(self) -> float | None:
        """How long one wait of a source or sink may last (None: unbounded)."""
        ...


class _Stall:
    """The deadline of one wait on a stream (`deadline`, on the owner's clock), `expired()`."""

    __slots__ = ("_owner", "deadline")

    def __init__(self, owner: StreamOwner) -> None:
        self._owner = owner
        timeout = owner.stall_timeout
        self.deadline = None if timeout is None else owner.now() + timeout

    def expired(self) -> bool:
        return self.deadline is not None and self._owner.now() >= self.deadline


async def _stall_stream(owner: StreamOwner, stream_id: str, waiting_for: str) -> None:
    """Break stream `stream_id` because its peer moved nothing for the stall timeout."""
    reason = f"no {waiting_for} within {owner.stall_timeout:g} s while the stream was kept alive"
    owner.connection.abort_stream(stream_id, reason, owner.now())
    await owner.flush()


class Source:
    """`ByteSource`: iterate to receive chunks; ends at the closing bit."""

    def __init__(self, owner: StreamOwner, stream_id: str) -> None:
        self.stream_id = stream_id
        self._owner = owner
        self._signal = owner.watch(stream_id)
        self._finished = False
        # Reading a held stream answered the probe its initiator parked on it: that answer
        # goes out before the first wait for the chunk it invites (once; later waits follow
        # frames the connection sent already).
        self._answered_read = False

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        if self._finished:
            raise StopAsyncIteration
        owner, stream_id = self._owner, self.stream_id
        stall = _Stall(owner)
        while True:
            try:
                item = owner.connection.take(stream_id, owner.now())
            except StreamBroken:
                self._finish()
                raise
            if item is None:
                if stall.expired():
                    await _stall_stream(owner, stream_id, "chunk from the peer")
                else:
                    if not self._answered_read:
                        self._answered_read = True
                        await owner.flush(closed_ok=True)
                    await self._signal.wait(stall.deadline)
                continue
            # A `read` we drive may go out now that there is room. A transport already gone
            # breaks the stream with it: this item is still the reader's, the next take says so.
            await owner.flush(closed_ok=True)
            if item is CLOSING:
                self._finish()
                raise StopAsyncIteration
            assert isinstance(item, bytes)
            owner.count_stream_bytes("in", len(item))
            return item

    async def aclose(self) -> None:
        """Stop reading before the end: the rest of the stream is discarded."""
        if not self._finished:
            self._owner.connection.stop_reading(self.stream_id, self._owner.now())
            self._finish()
            await self._owner.flush()

    def _finish(self) -> None:
        self._finished = True
        self._owner.unwatch(self.stream_id)


class Sink:
    """`ByteSink`: `write` waits while the window is full; `close` sends the closing bit.

    `acknowledged`: the stream is one we drive, whose closing bit the responder acknowledges;
    `close()` returns once it did (and raises `StreamBroken` if the stream broke first).
    """

    def __init__(self, owner: StreamOwner, stream_id: str, *, acknowledged: bool) -> None:
        self.stream_id = stream_id
        self._owner = owner
        self._acknowledged = acknowledged
        self._signal = owner.watch(stream_id)

    async def write(self, data: bytes) -> None:
        """Queue `data` (the connection cuts it into chunks of at most `MAX_CHUNK`), waiting
        for room in the window."""
        owner, stream_id = self._owner, self.stream_id
        view, offset, size = memoryview(data), 0, len(data)
        while offset < size:
            await self._wait_for_space()
            piece = data if offset == 0 else view[offset:]
            taken = owner.connection.write(stream_id, piece, owner.now())
            owner.count_stream_bytes("out", taken)
            offset += taken
            await owner.flush()

    async def close(self) -> None:
        """Queue the closing bit; on a stream we drive, return once the responder took it."""
        await self._wait_for_space()
        owner, stream_id = self._owner, self.stream_id
        try:
            owner.connection.end_stream(stream_id, owner.now())
            await owner.flush()
            if self._acknowledged:
                stall = _Stall(owner)
                while (outcome := owner.connection.stream_outcome(stream_id)) is None:
                    if stall.expired():
                        await _stall_stream(owner, stream_id, "acknowledgement of the closing bit")
                    else:
                        await self._signal.wait(stall.deadline)
                if isinstance(outcome, StreamBroke):
                    raise outcome.error()
        finally:
            owner.unwatch(stream_id)

    async def abort(self) -> None:
        """Stop without a closing bit; the peer sees the stream break."""
        self._owner.connection.abort_stream(self.stream_id, "the sender aborted", self._owner.now())
        self._owner.unwatch(self.stream_id)
        await self._owner.flush()

    async def _wait_for_space(self) -> None:
        stall = _Stall(self._owner)
        while not self._owner.connection.can_write(self.stream_id):
            if stall.expired():
                await _stall_stream(self._owner, self.stream_id, "room in the stream window")
            else:
                await self._signal.wait(stall.deadline)


class HandlerContext:
    """`RequestContext` of one request being served."""

    def __init__(
        self,
        owner: StreamOwner,
        method: str,
        request_id: int,
        *,
        arrival: Mark,
        deliveries: DeliveryTracker | None = None,
    ) -> None:
        self.method = method
        self.producers: dict[str, Producer | None] = {}
        self.delivery_callbacks: list[OnDelivered] = []
        self._owner = owner
        self._request_id = request_id
        self._arrival = arrival
        self._deliveries = deliveries

    @property
    def arrival(self) -> Mark:
        return self._arrival

    def on_delivered(self, callback: OnDelivered) -> None:
        if self._deliveries is not None:
            self.delivery_callbacks.append(callback)

    def receive_stream(self, marker: StreamMarker) -> ByteSource:
        owner = self._owner
        owner.connection.receive_request_stream(self._request_id, marker.stream_id, owner.now())
        return Source(owner, marker.stream_id)

    def hold_stream(self, marker: StreamMarker) -> None:
        self._owner.connection.hold_request_stream(self._request_id, marker.stream_id)

    def open_send_stream(self, producer: Producer | None = None) -> tuple[StreamMarker, ByteSink]:
        stream_id = self._owner.connection.open_reply_stream(self._request_id, self._owner.now())
        self.producers[stream_id] = producer
        return marker_of(stream_id), Sink(self._owner, stream_id, acknowledged=False)


def marker_of(stream_id: str) -> StreamMarker:
    """The marker of stream `stream_id`, to put into a payload."""
    return StreamMarker(is_virtual_stream=True, stream_id=stream_id)
