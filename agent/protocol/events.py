"""What a `Connection` hands out (`events_received()`): plain values, in the order things
happened. A driver acts on each; none of them gives access to the connection's internals.

- `RequestReceived`: the peer asks us to handle a request; end it with `respond` or `refuse`.
- `Completed` / `CallErrored` (from `calls`): one of our calls is over.
- `StreamChanged`: a stream moved (data arrived, room was freed, a frame of it was handled):
  whoever waits on it asks again (`take`, `can_write`). Two in a row for one stream are one.
- `StreamEnded` / `StreamBroke`: a stream is over, through its closing bit or broken (and
  why); once per stream. `Connection.stream_outcome()` answers the same afterwards.
- `ChunkToDecode`: a received chunk was queued undecoded; decode its `token` (`decode_quick()`
  on the spot, else `decode()`, pure, best in a worker thread) and hand the bytes or the
  `RemoteProtocolError` back with `Connection.settle_chunk`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from agent.errors import StreamBroken, StreamMalformed, StreamNotServed
from agent.protocol.calls import CallErrored, Completed

__all__ = [
    "CallErrored",
    "ChunkToDecode",
    "ChunkToken",
    "Completed",
    "Event",
    "RequestReceived",
    "StreamBroke",
    "StreamChanged",
    "StreamEnded",
    "broken_error",
]


@dataclass(frozen=True, slots=True)
class RequestReceived:
    """The peer asks us to handle `method`; end it with `respond()` or `refuse()`."""

    request_id: int
    method: str
    request: dict[str, Any]
    stream_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class StreamChanged:
    """Stream `stream_id` moved: its waiters ask again."""

    stream_id: str


@dataclass(frozen=True, slots=True)
class StreamEnded:
    """Stream `stream_id` is over through its closing bit (what it queued may still be read)."""

    stream_id: str


@dataclass(frozen=True, slots=True)
class StreamBroke:
    """Stream `stream_id` is over without its end, for `reason`; `not_served` when the peer
    answered our `read` by echoing it (it cannot serve a stream in a response), `malformed`
    when it broke at a chunk that does not decode (the same bytes would fail again)."""

    stream_id: str
    reason: str
    not_served: bool = False
    malformed: bool = False

    def error(self) -> StreamBroken:
        """The error a reader or writer of the stream gets: `StreamNotServed`,
        `StreamMalformed` or `StreamBroken`."""
        return broken_error(self.stream_id, self.reason, self.not_served, self.malformed)


def broken_error(stream_id: str, reason: str, not_served: bool, malformed: bool) -> StreamBroken:
    """The error of a stream that broke for `reason`, typed by what its peer did."""
    kind = StreamNotServed if not_served else StreamMalformed if malformed else StreamBroken
    return kind(f"stream {stream_id} broke: {reason}")


class ChunkToken(Protocol):
    """An undecoded received chunk, opaque but for `decode()`."""

    def decode(self) -> bytes:
        """The chunk's bytes (pure, safe in a worker thread); `RemoteProtocolError` when it is
        no chunk."""
        ...

    def decode_quick(self) -> bytes | None:
        """The chunk's bytes when a quick decoder takes them at once (cheap enough for the
        event loop), else None: `decode()` decides."""
        ...


@dataclass(frozen=True, slots=True)
class ChunkToDecode:
    """A chunk of stream `stream_id` waits to be decoded: `token.decode()`, then
    `settle_chunk(stream_id, token, bytes or error, now)` before the stream's next frame."""

    stream_id: str
    token: ChunkToken


Event = (
    RequestReceived
    | Completed
    | CallErrored
    | StreamChanged
    | StreamEnded
    | StreamBroke
    | ChunkToDecode
)
