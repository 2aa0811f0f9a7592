"""What the connection's request classes tell the peer's observer (`agent.protocol.admission`):
the seats each class holds now, and the requests each turned away (`retry`).

The connection only counts; `AdmissionReport` reads its counts after every turn that handed
out events (a request came in, one ended: each ends in a flush) and reports what changed, so
the protocol hands out no event for it and a turn that changed nothing reports nothing."""

from __future__ import annotations

from agent.observe import PeerObserver
from agent.protocol.admission import REQUEST_CLASSES, AdmissionView

__all__ = ["AdmissionReport"]


class AdmissionReport:
    """The last counts told to `observer`, per class."""

    def __init__(self, observer: PeerObserver) -> None:
        self._observer = observer
        self._seated = dict.fromkeys(REQUEST_CLASSES, 0)
        self._refused = dict.fromkeys(REQUEST_CLASSES, 0)

    def report(self, seats: AdmissionView) -> None:
        """Tell the observer each class whose seats or refusals changed since the last report."""
        for request_class in REQUEST_CLASSES:
            held, refused = seats.in_flight(request_class), seats.refused[request_class]
            if held != self._seated[request_class]:
                self._seated[request_class] = held
                self._observer.requests_seated(request_class=request_class, count=held)
            if refused != self._refused[request_class]:
                more, self._refused[request_class] = refused - self._refused[request_class], refused
                self._observer.requests_deferred(request_class=request_class, count=more)
