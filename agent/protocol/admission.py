"""Which requests a connection takes on now: one seat table per class (pure, no time).

A request from Cloudly is of one of two classes, by its method (`Admission`, data on its
`Route`):

- **stream**: it carries a stream or waits for one (an isolated restore's stage, a relay
  backup or restore). It may hold its seat for minutes: while its bytes move, and while it
  waits its turn behind its node's earlier transfers (`[corestore] max_transfers_per_node`).
  Its bytes are bounded elsewhere (the per-node transfer places, the byte budget); its seat
  bounds what a waiting one costs (a handler, its request, its held stream).
- **control**: everything else (prepare, execute, cleanup, status, prune, a cluster
  document). It is answered in milliseconds, and it is how Cloudly sees and steers the nodes.

Each class has its own bound (`AdmissionBounds`), so a flood of one never takes the other's
seats: every stream seat taken leaves every control seat free, and the reverse. Within the
stream class each node has a share (`stream_per_node`), so one node's flood (a restore staging
its whole manifest at once) leaves the other nodes' stages their seats. A request whose route
can answer it from memory (`answers_now`: a status read) takes no seat at all when it is so
answered; only when it falls through to its handler does it ask for a control seat (`seat`).

This is Kubernetes' API Priority and Fairness reduced to what this protocol allows: priority
levels with their own concurrency shares (the classes), and a flow (a node) that cannot starve
its level's other flows. There are no queues here: the protocol's `retry` answer makes the
caller send the request again after `busy_retry_ms`, so a refused request costs one small
answer, never a handler. `Deferred` says which class was full, for the refusal's text and the
per-class count of refusals.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol

from agent.errors import InvalidState

__all__ = [
    "CONTROL",
    "REQUEST_CLASSES",
    "Admission",
    "AdmissionBounds",
    "AdmissionTable",
    "AdmissionView",
    "Deferred",
    "RequestClass",
    "stream_class",
]

RequestClass = Literal["control", "stream"]
REQUEST_CLASSES: Final[tuple[RequestClass, ...]] = ("control", "stream")


@dataclass(frozen=True, slots=True)
class Admission:
    """How a method's requests are admitted: their class, the request field naming the node
    they are for (stream requests share their class per node; None: no node), and whether the
    route may answer them from memory before any handler runs (`answers_now`)."""

    request_class: RequestClass = "control"
    node_field: str | None = None
    answers_now: bool = False


CONTROL: Final = Admission()
"""A control request (the default of every route)."""


def stream_class(node_field: str) -> Admission:
    """A request that carries or waits for a stream of the node named by `node_field`."""
    return Admission("stream", node_field)


@dataclass(frozen=True, slots=True)
class AdmissionBounds:
    """Seats per class: `control` requests handled at once, `stream` requests at once, and of
    those at most `stream_per_node` for one node."""

    control: int = 64
    stream: int = 512
    stream_per_node: int = 64

    def __post_init__(self) -> None:
        if min(self.control, self.stream, self.stream_per_node) < 1:
            raise InvalidState("every request class needs at least one seat")


@dataclass(frozen=True, slots=True)
class Deferred:
    """A request turned away for now: its class (or its node's share of it) is full."""

    request_class: RequestClass
    reason: str


class AdmissionView(Protocol):
    """What a driver reads of a connection's seats: held now, and turned away so far."""

    def in_flight(self, request_class: RequestClass) -> int:
        """Requests of `request_class` holding a seat now."""
        ...

    @property
    def refused(self) -> Mapping[RequestClass, int]:
        """Requests each class turned away (`retry`) on this connection so far."""
        ...


@dataclass(frozen=True, slots=True)
class _Seat:
    request_class: RequestClass
    node: str | None


class AdmissionTable:
    """The seats of one connection, by request id. `admit` at intake, `seat` for a request
    that was let in without one (`answers_now`) and needs its handler after all, `release` when
    the request ends (however it ends). Counts only: nothing here knows time or I/O."""

    def __init__(self, bounds: AdmissionBounds | None = None) -> None:
        self.bounds = bounds or AdmissionBounds()
        self._seated: dict[int, _Seat] = {}
        self._unseated: dict[int, _Seat] = {}  # let in to be answered from memory
        self._in_flight: dict[RequestClass, int] = dict.fromkeys(REQUEST_CLASSES, 0)
        self._per_node: dict[str, int] = {}
        self._refused: dict[RequestClass, int] = dict.fromkeys(REQUEST_CLASSES, 0)

    @property
    def refused(self) -> Mapping[RequestClass, int]:
        """Requests each class turned away so far."""
        return self._refused

    def in_flight(self, request_class: RequestClass) -> int:
        """Requests of `request_class` holding a seat now."""
        return self._in_flight[request_class]

    def node_in_flight(self, node: str) -> int:
        """Stream requests of `node` holding a seat now."""
        return self._per_node.get(node, 0)

    def admit(
        self, request_id: int, admission: Admission, request: Mapping[str, Any]
    ) -> Deferred | None:
        """Let request `request_id` in (None) or turn it away (`Deferred`). One its route may
        answer from memory is let in without a seat."""
        node = request.get(admission.node_field) if admission.node_field is not None else None
        seat = _Seat(admission.request_class, node if isinstance(node, str) else None)
        if admission.answers_now:
            self._unseated[request_id] = seat
            return None
        return self._take(request_id, seat)

    def seat(self, request_id: int) -> Deferred | None:
        """A request let in without a seat needs one now (its handler runs): take it, or turn
        the request away. A request already seated, or unknown, is left as it is."""
        seat = self._unseated.pop(request_id, None)
        if seat is None:
            return None
        return self._take(request_id, seat)

    def release(self, request_id: int) -> RequestClass | None:
        """Request `request_id` ended: its seat is free again; the class it held (None: none)."""
        self._unseated.pop(request_id, None)
        seat = self._seated.pop(request_id, None)
        if seat is None:
            return None
        self._in_flight[seat.request_class] -= 1
        if seat.request_class == "stream" and seat.node is not None:
            left = self._per_node[seat.node] - 1
            if left:
                self._per_node[seat.node] = left
            else:
                del self._per_node[seat.node]
        return seat.request_class

    def clear(self) -> None:
        """Every request ended at once (the connection is gone); the refusals stay counted."""
        self._seated.clear()
        self._unseated.clear()
        self._per_node.clear()
        self._in_flight = dict.fromkeys(REQUEST_CLASSES, 0)

    def _take(self, request_id: int, seat: _Seat) -> Deferred | None:
        bounds, cls = self.bounds, seat.request_class
        deferred: Deferred | None = None
        if cls == "control" and self._in_flight["control"] >= bounds.control:
            deferred = Deferred(
                cls, f"the agent is busy with {bounds.control} control requests; send it again"
            )
        elif cls == "stream" and self._in_flight["stream"] >= bounds.stream:
            deferred = Deferred(
                cls, f"the agent is busy with {bounds.stream} stream requests; send it again"
            )
        elif (
            cls == "stream"
            and seat.node is not None
            and self._per_node.get(seat.node, 0) >= bounds.stream_per_node
        ):
            deferred = Deferred(
                cls,
                # Not the node's name: no answer carries the peer's payload back.
                f"the agent is busy with {bounds.stream_per_node} stream requests for this "
                "request's node; send it again",
            )
        if deferred is not None:
            self._refused[cls] += 1
            return deferred
        self._seated[request_id] = seat
        self._in_flight[cls] += 1
        if cls == "stream" and seat.node is not None:
            self._per_node[seat.node] = self._per_node.get(seat.node, 0) + 1
        return None
