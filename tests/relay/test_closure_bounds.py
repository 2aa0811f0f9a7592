"""The closure backup's bounds: progress, never size (`closures.send_closure`, injected clock).

Cloudly is a fake `CloudlyCalls` that keeps the protocol's promises on the test's clock: a call
with a deadline fails `CallTimeout` once the clock passes it; its sink either drains (writes go
through) or never does, and then a write raises `StreamBroken` once the stall deadline passed,
as `agent.session.streams.Sink` does. Corestore is a fake export whose every read takes a
second of the clock. Nothing sleeps in real time.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Mapping
from typing import Any

import pytest

from agent.contracts.base import StreamMarker
from agent.contracts.relay import DatabaseClosureDescriptor
from agent.errors import CallTimeout, StreamBroken
from agent.relay.closures import send_closure
from tests.clock import ManualClock, advancing

CLOSURE = hashlib.shake_256(b"closure").digest(6 * 1000)
STALL = 300.0


class Export:
    """Corestore's export of `CLOSURE`: every ranged read takes one second of `clock`."""

    def __init__(self, clock: ManualClock) -> None:
        self._clock = clock

    async def closure_descriptor(self, service_id: str, backup_id: str) -> Any:
        return DatabaseClosureDescriptor.from_wire(
            {
                "size": len(CLOSURE),
                "sha256": hashlib.sha256(CLOSURE).hexdigest(),
                "receipt": {"issuer": "test"},
            }
        )

    async def read_closure(self, service_id: str, backup_id: str, offset: int, n: int) -> bytes:
        await self._clock.sleep(1.0)
        return CLOSURE[offset : offset + n]


class Sink:
    """The stream to Cloudly: drains, or never does (then a write stalls out)."""

    def __init__(self, clock: ManualClock, *, drains: bool) -> None:
        self._clock, self._drains = clock, drains
        self.received = bytearray()
        self.closed = self.aborted = False

    async def write(self, data: bytes) -> None:
        if not self._drains:
            try:
                async with self._clock.timeout(STALL):
                    await asyncio.Event().wait()
            except TimeoutError:
                raise StreamBroken("no room in the stream window within 300 s") from None
        self.received += data

    async def close(self) -> None:
        self.closed = True

    async def abort(self) -> None:
        self.aborted = True


class Cloudly:
    """Cloudly's side of `backupServiceDatabaseClosure`: answers once the stream is closed
    (`answers=True`), or never."""

    def __init__(self, clock: ManualClock, *, drains: bool = True, answers: bool = True) -> None:
        self._clock, self._answers = clock, answers
        self.sink = Sink(clock, drains=drains)
        self.timeouts: list[float | None] = []

    def open_send_stream(self) -> tuple[StreamMarker, Any]:
        return StreamMarker(is_virtual_stream=True, stream_id="s1"), self.sink

    def receive_stream(self, marker: StreamMarker) -> Any:
        raise AssertionError("the backup reads no stream")

    async def call(
        self,
        method: str,
        request: Mapping[str, Any],
        *,
        timeout: float | None,  # noqa: ASYNC109  # the protocol's deadline, kept here
    ) -> dict[str, Any]:
        self.timeouts.append(timeout)
        try:
            async with self._clock.timeout(timeout):
                while not (self.sink.closed and self._answers):
                    await self._clock.sleep(0.5)
        except TimeoutError:
            raise CallTimeout(method, timeout or 0.0) from None
        return {"accepted": True}


async def backup(cloudly: Cloudly, clock: ManualClock) -> DatabaseClosureDescriptor:
    return await send_closure(
        client=Export(clock),  # type: ignore[arg-type]  # the two export routes only
        cloudly=cloudly,
        service_id="svc",
        backup_id="bk",
        node_id="node",
        chunk_size=1000,
        answer_timeout=3.0,
        clock=clock,
        progress=lambda done, total: None,
    )


async def test_a_closure_slower_than_every_call_bound_is_backed_up() -> None:
    """Six reads of one second each take longer than the 3 s answer bound: the closure is
    backed up, because the call carries no deadline while its stream moves."""
    clock = ManualClock()
    cloudly = Cloudly(clock)
    async with advancing(clock), asyncio.timeout(10):
        descriptor = await backup(cloudly, clock)
    assert descriptor.size == len(CLOSURE)
    assert bytes(cloudly.sink.received) == CLOSURE
    assert cloudly.timeouts == [None]
    assert clock.monotonic() >= 7.0  # six reads and the probe at the end


async def test_a_cloudly_that_never_drains_the_closure_ends_transfer_interrupted() -> None:
    """Cloudly takes the call and never reads: the write stalls out after the stall deadline
    and the backup ends `transfer-interrupted` (retryable), not `internal`: no call deadline
    fires first (with the default 300 s both for the stall and the old call bound, it did)."""
    clock = ManualClock()
    cloudly = Cloudly(clock, drains=False)
    async with advancing(clock), asyncio.timeout(10):
        with pytest.raises(StreamBroken) as broken:
            await backup(cloudly, clock)
    assert (broken.value.code, broken.value.retryable) == ("transfer-interrupted", True)
    assert cloudly.sink.aborted


async def test_a_cloudly_that_never_answers_after_the_stream_ends_is_transfer_interrupted() -> None:
    """The closing bit is acknowledged but no answer comes: after the answer bound (3 s past
    the stream's end, not past its start) the backup ends `transfer-interrupted`."""
    clock = ManualClock()
    cloudly = Cloudly(clock, answers=False)
    async with advancing(clock), asyncio.timeout(10):
        with pytest.raises(StreamBroken, match="within 3 s after its stream ended") as broken:
            await backup(cloudly, clock)
    assert broken.value.code == "transfer-interrupted"
    assert 10.0 <= clock.monotonic() < 11.0  # seven seconds of reads, then the 3 s bound
