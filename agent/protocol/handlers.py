"""Typed routes: which methods a peer serves, with which request model and handler.

A `Route` is `(method, request model, handler)`. The handler takes the parsed request model and
the request's `RequestContext` and returns the response model; it never sees a dict. The seam
that runs it (`agent.session.peer`) validates the body once (`Route.parse`: exact, camelCase;
a failure is `invalid-request` naming the first field path) and serialises the answer once
(`WireModel.to_wire()`). `Routes` is the immutable table a connection is built with: a method
is routed once.

Also here, because handlers and the session both name them: the handler's view of its request
(`RequestContext`: its streams, where it arrived, whether its answer was delivered), the
byte-stream faces (`ByteSource`, `ByteSink`, `Producer`) and the face that calls the peer
(`Caller`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, Generic, Protocol, TypeVar

from pydantic import ValidationError

from agent.contracts.base import StreamMarker, WireModel, first_problem
from agent.errors import InvalidRequest, InvalidState
from agent.protocol.admission import CONTROL, Admission
from agent.protocol.delivery import Mark

__all__ = [
    "ByteSink",
    "ByteSource",
    "Caller",
    "Handler",
    "Producer",
    "RequestContext",
    "Route",
    "Routes",
]

Req = TypeVar("Req", bound=WireModel)
Resp = TypeVar("Resp", bound=WireModel)


class ByteSource(Protocol):
    """Bytes arriving from the peer, in order."""

    def __aiter__(self) -> AsyncIterator[bytes]:
        """Chunks until the closing bit; raises `StreamBroken` if the stream dies first."""
        ...

    async def aclose(self) -> None:
        """Stop reading (what still arrives is discarded); nothing once the stream is over.
        Whoever reads a source closes it when it stops, on failure too."""
        ...


class ByteSink(Protocol):
    """Bytes we send to the peer."""

    async def write(self, data: bytes) -> None:
        """Queue `data`; waits while the window is full (backpressure)."""
        ...

    async def close(self) -> None:
        """Send the closing bit after the queued data."""
        ...

    async def abort(self) -> None:
        """Stop the stream without a closing bit (the peer sees it break)."""
        ...


Producer = Callable[[ByteSink], Awaitable[None]]


class Caller(Protocol):
    """What calls the peer: the session's connection (`agent.session.peer.Peer`), or the
    session itself once connected."""

    async def call(
        self,
        method: str,
        request: Mapping[str, Any],
        *,
        timeout: float | None,  # noqa: ASYNC109  # a protocol deadline, passed on
    ) -> dict[str, Any]:
        """Call `method`; raises `CallFailed`, `CallTimeout` or `SessionClosed`. `timeout`
        None: no deadline of its own (the caller bounds it, by a transfer's progress)."""
        ...


class RequestContext(Protocol):
    """What a handler may do beyond reading its request model."""

    @property
    def method(self) -> str:
        """The method being handled."""
        ...

    def receive_stream(self, marker: StreamMarker) -> ByteSource:
        """Read the stream `marker` (a field of this request); once per stream."""
        ...

    def hold_stream(self, marker: StreamMarker) -> None:
        """Hold the stream `marker` (a field of this request, not read yet) back until it is
        read: the peer is told `backpressure` meanwhile and sends nothing more (a handler that
        waits its turn before it reads)."""
        ...

    def open_send_stream(self, producer: Producer | None = None) -> tuple[StreamMarker, ByteSink]:
        """A new stream for the response: put the marker into it.

        The peer reads only after it got the response. Pass `producer` to write: it runs once
        the response is sent, the sink is closed after it (aborted if it raises).
        """
        ...

    @property
    def arrival(self) -> Mark:
        """Where this request arrived on the session (`agent.protocol.delivery`)."""
        ...

    def on_delivered(self, callback: Callable[[Mark], None]) -> None:
        """Call `callback` once a pong confirmed this request's answer (its response or its
        error) reached the peer's websocket, with where; never when that cannot be known (the
        connection ended first, or the session does not track deliveries)."""
        ...


Handler = Callable[[Req, RequestContext], Awaitable[Resp]]
AnswerNow = Callable[[Req], Resp | None]


@dataclass(frozen=True, slots=True)
class Route(Generic[Req, Resp]):
    """One method: the model its request body must satisfy, and the handler that answers it.

    `answer_now`, for a read whose answer may be in memory: called in the same turn that read
    the request, it answers it there (or raises its refusal), or returns None for `handler` to
    answer the usual way. A status call then waits for no task queued ahead of it.

    `admission`: the class of its requests (`agent.protocol.admission`): control unless it
    carries or waits for a stream (`stream_class(node_field)`)."""

    method: str
    request: type[Req]
    handler: Handler[Req, Resp]
    answer_now: AnswerNow[Req, Resp] | None = None
    admission: Admission = CONTROL

    def parse(self, body: Mapping[str, Any]) -> Req:
        """The request model of `body`; `InvalidRequest` naming the first bad field path."""
        try:
            return self.request.from_wire(body)
        except ValidationError as exc:
            path, reason = first_problem(exc)
            raise InvalidRequest(f"{path}: {reason}", field=path) from None


class Routes:
    """The route table of one peer: immutable, each method once."""

    def __init__(self, routes: Iterable[Route[Any, Any]] = ()) -> None:
        table: dict[str, Route[Any, Any]] = {}
        for route in routes:
            if route.method in table:
                raise InvalidState(f"method {route.method} is routed twice")
            table[route.method] = route
        self._table = table

    def __add__(self, other: Routes) -> Routes:
        return Routes([*self, *other])

    def __iter__(self) -> Iterator[Route[Any, Any]]:
        return iter(self._table.values())

    @property
    def methods(self) -> frozenset[str]:
        """Every routed method."""
        return frozenset(self._table)

    @property
    def admissions(self) -> dict[str, Admission]:
        """How each method's requests are admitted (a route that may answer from memory is
        let in without a seat: `answers_now`)."""
        return {
            route.method: replace(route.admission, answers_now=route.answer_now is not None)
            for route in self
        }

    def get(self, method: str) -> Route[Any, Any] | None:
        """The route of `method`, if any."""
        return self._table.get(method)
