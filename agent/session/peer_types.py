"""The public types of the Peer seam (re-exported by `agent.session.peer`).

Transport and stream protocols, `PeerSettings`, the `Router`, and how a handler's failure
becomes an `error {text, data}` (`refusal_data`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from pydantic import ValidationError

from agent.contracts.base import first_problem
from agent.errors import InvalidRequest, InvalidState

if TYPE_CHECKING:
    from agent.session.peer import RequestContext

__all__ = [
    "UNKNOWN_METHOD_TEXT",
    "ByteSink",
    "ByteSource",
    "FrameTransport",
    "Handler",
    "PeerSettings",
    "Producer",
    "Router",
    "invalid_request",
    "response_dict",
]

UNKNOWN_METHOD_TEXT = "There is no available method for this call on the server side"


class FrameTransport(Protocol):
    """An adapter over one websocket connection carrying one JSON text frame per message."""

    async def send(self, frame: bytes) -> None:
        """Send ONE text frame (`frame` is UTF-8 JSON)."""
        ...

    async def recv(self) -> bytes:
        """The next text frame; raises `SessionClosed` when the connection is closed."""
        ...


class ByteSource(Protocol):
    """Bytes arriving from the peer, in order."""

    stream_id: str

    def __aiter__(self) -> AsyncIterator[bytes]:
        """Chunks until the closing bit; raises `StreamBroken` if the stream dies first."""
        ...


class ByteSink(Protocol):
    """Bytes we send to the peer."""

    stream_id: str

    async def write(self, data: bytes) -> None:
        """Queue `data`; waits while the window is full (backpressure)."""
        ...

    async def close(self) -> None:
        """Send the closing bit after the queued data."""
        ...

    async def abort(self) -> None:
        """Stop the stream without a closing bit (the peer sees it break)."""
        ...


@dataclass(frozen=True, slots=True)
class PeerSettings:
    """Tunables of one `Peer` (`chunk_form`: "buffer" or "base64", see agent/protocol/chunks)."""

    stream_window: int = 16
    keepalive_interval: float = 1.0
    keepalive_timeout: float = 10.0
    backpressure_probe: float = 0.05
    default_call_timeout: float = 30.0
    max_retry_attempts: int = 5
    chunk_form: str = "buffer"


Handler = Callable[[Mapping[str, Any], "RequestContext"], Awaitable[Mapping[str, Any]]]
Producer = Callable[[ByteSink], Awaitable[None]]


class Router:
    """Handlers by method name."""

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}

    def register(self, method: str, handler: Handler) -> None:
        """Route `method` to `handler`; a method is registered once."""
        if method in self._handlers:
            raise InvalidState(f"a handler for {method} is already registered")
        self._handlers[method] = handler

    def get(self, method: str) -> Handler | None:
        """The handler for `method`, if any."""
        return self._handlers.get(method)


def response_dict(method: str, result: object) -> dict[str, Any]:
    if not isinstance(result, Mapping):
        raise TypeError(f"the {method} handler returned {type(result).__name__}, not a mapping")
    return dict(result)


def invalid_request(exc: ValidationError) -> InvalidRequest:
    """`invalid-request` naming the first offending field path (camelCase, dotted)."""
    path, reason = first_problem(exc)
    return InvalidRequest(f"{path}: {reason}", field=path)
