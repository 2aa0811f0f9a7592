"""`RequestIntake`: which request frames become requests we handle, and the requests in flight
(sans I/O; no time, no bytes out).

The connection hands it each request frame; `admit` answers with a verdict, in the order of
the intake rules (`agent.protocol.connection`'s docstring, rules 1 to 4):

1. intake stopped: `Refused` (`shutting-down`, retryable);
2. a method nobody routes: `Refused` with typedrequest's own text, code `unknown-method`;
3. a `request` that is no JSON object: `Refused` (`invalid-request`);
4. its class full: the `Deferred` of the admission table (the connection answers `retry`);
5. otherwise `Admitted`: the request holds its seat (or none, if its route may answer from
   memory). The connection then registers the request's streams (rule 5, the stream
   registry's) and either `enter`s the request or, when a stream id is refused, `withdraw`s it.

A request stays in flight until the connection ends it (`end`, which gives its seat back) or
its class turns it away when it asks for a seat after all (`seat`). The streams of a request a
handler reads are its `opened` ones: each may be read once.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Final

from agent.errors import AgentError, InvalidRequest, LocalProtocolError, ShuttingDown
from agent.protocol.admission import (
    CONTROL,
    Admission,
    AdmissionBounds,
    AdmissionTable,
    AdmissionView,
    Deferred,
)
from agent.protocol.envelope import Envelope
from agent.protocol.stream_responder import ResponderStream

__all__ = [
    "UNKNOWN_METHOD_TEXT",
    "Admitted",
    "InFlight",
    "Refused",
    "RequestIntake",
    "UnknownMethod",
]

UNKNOWN_METHOD_TEXT: Final = "There is no available method for this call on the server side"
"""typedrequest's own text for a method no handler is registered for (wire.md, errors)."""


@dataclass(frozen=True, slots=True)
class Refused:
    """Answer the frame with `error` at once; nothing was let in."""

    error: AgentError


@dataclass(frozen=True, slots=True)
class UnknownMethod:
    """Answer the frame with typedrequest's text for a method nobody routes."""

    text: str = UNKNOWN_METHOD_TEXT
    data: Mapping[str, object] = field(
        default_factory=lambda: {"code": "unknown-method", "retryable": False}
    )


@dataclass(frozen=True, slots=True)
class Admitted:
    """Let in as request `request_id`, its seat held; `enter` or `withdraw` it next."""

    request_id: int


Verdict = Refused | UnknownMethod | Deferred | Admitted


@dataclass(slots=True)
class InFlight:
    """A request being handled: its envelope (echoed in the reply), the ids of its streams, the
    ones its handler reads, and the streams it opened for its response."""

    env: Envelope
    streams: tuple[str, ...]
    opened: set[str] = field(default_factory=set)
    reply_streams: list[ResponderStream] = field(default_factory=list)


class RequestIntake:
    """The intake rules and the requests in flight of one connection."""

    def __init__(
        self,
        methods: Collection[str],
        bounds: AdmissionBounds,
        admissions: Mapping[str, Admission] | None = None,
    ) -> None:
        self._methods = frozenset(methods)
        # How each method's requests are admitted (a method not named: control).
        self._admissions = dict(admissions or {})
        self._seats = AdmissionTable(bounds)
        self._requests: dict[int, InFlight] = {}
        self._last_id = 0
        self._open = True

    @property
    def seats(self) -> AdmissionView:
        """The request classes' seats held now and the requests each turned away."""
        return self._seats

    def __len__(self) -> int:
        return len(self._requests)

    def stop(self) -> None:
        """Every request from now on is refused `shutting-down` (those in flight go on)."""
        self._open = False

    def admit(self, env: Envelope) -> Verdict:
        """The verdict on request frame `env` (rules 1 to 4); an `Admitted` one holds its seat."""
        if not self._open:
            return Refused(ShuttingDown("the agent is shutting down and takes no new requests"))
        if env.method not in self._methods:
            return UnknownMethod()
        if not isinstance(env.request, dict):
            return Refused(InvalidRequest("request: the request is not a JSON object"))
        request_id = self._last_id + 1
        admission = self._admissions.get(env.method, CONTROL)
        deferred = self._seats.admit(request_id, admission, env.request)
        return deferred if deferred is not None else Admitted(request_id)

    def enter(self, admitted: Admitted, env: Envelope, streams: tuple[str, ...]) -> None:
        """The admitted request is in flight, with its registered streams."""
        self._last_id = admitted.request_id
        self._requests[admitted.request_id] = InFlight(env, streams)

    def withdraw(self, admitted: Admitted) -> None:
        """The admitted request is refused after all (a stream id was): its seat goes back."""
        self._seats.release(admitted.request_id)

    def get(self, request_id: int) -> InFlight | None:
        """Request `request_id` if it is in flight."""
        return self._requests.get(request_id)

    def unopened(self, request_id: int, stream_id: str) -> InFlight:
        """Request `request_id`, which has `stream_id` among its streams not read yet; anything
        else is the caller's bug (`LocalProtocolError`)."""
        request = self._requests.get(request_id)
        if request is None or stream_id not in request.streams or stream_id in request.opened:
            raise LocalProtocolError(
                f"stream {stream_id} is not an unopened stream of this request"
            )
        return request

    def end(self, request_id: int) -> InFlight | None:
        """Request `request_id` is over: it leaves, its seat goes back."""
        request = self._requests.pop(request_id, None)
        if request is not None:
            self._seats.release(request_id)
        return request

    def seat(self, request_id: int) -> Deferred | None:
        """Request `request_id`, let in without a seat, needs its handler after all: None once
        it holds a seat; its class's `Deferred` when full (the request has left then)."""
        deferred = self._seats.seat(request_id)
        if deferred is not None:
            self._requests.pop(request_id, None)
        return deferred

    def clear(self) -> None:
        """The connection is gone: no request is in flight, no seat held."""
        self._requests.clear()
        self._seats.clear()
