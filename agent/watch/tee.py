"""`Tee`: every observer hook (`agent/observe.py`) handed to several observers in turn.

The composition root gives the parts one observer; behind it the metrics and the status' own
hooks (`agent.watch.statushooks.StatusHooks`) each hear every call they implement.
"""

from __future__ import annotations

from agent.observe import Direction

__all__ = ["Tee"]


class Tee:
    """Every hook, handed to each of `parts` in order (each may implement only some hooks: a
    part without a hook is skipped)."""

    def __init__(self, *parts: object) -> None:
        self._parts = parts

    def _each(self, hook: str, **facts: object) -> None:
        for part in self._parts:
            method = getattr(part, hook, None)
            if method is not None:
                method(**facts)

    def session_connected(self, *, reconnect: bool) -> None:
        """To each part."""
        self._each("session_connected", reconnect=reconnect)

    def session_lost(self, *, cause: str, permanent: bool) -> None:
        """To each part."""
        self._each("session_lost", cause=cause, permanent=permanent)

    def request_handled(self, *, method: str, code: str, seconds: float) -> None:
        """To each part."""
        self._each("request_handled", method=method, code=code, seconds=seconds)

    def requests_seated(self, *, request_class: str, count: int) -> None:
        """To each part."""
        self._each("requests_seated", request_class=request_class, count=count)

    def requests_deferred(self, *, request_class: str, count: int) -> None:
        """To each part."""
        self._each("requests_deferred", request_class=request_class, count=count)

    def stream_bytes(self, *, direction: Direction, count: int) -> None:
        """To each part."""
        self._each("stream_bytes", direction=direction, count=count)

    def store_mutation(self, *, op: str, outcome: str, seconds: float) -> None:
        """To each part."""
        self._each("store_mutation", op=op, outcome=outcome, seconds=seconds)

    def chunk_recorded(self, *, length: int) -> None:
        """To each part."""
        self._each("chunk_recorded", length=length)

    def object_written(self, *, size: int) -> None:
        """To each part."""
        self._each("object_written", size=size)

    def retention_deleted(self, *, what: str, count: int) -> None:
        """To each part."""
        self._each("retention_deleted", what=what, count=count)

    def retention_freed(self, *, count: int) -> None:
        """To each part."""
        self._each("retention_freed", count=count)

    def retention_failed(self) -> None:
        """To each part."""
        self._each("retention_failed")

    def vacuum_failed(self, *, reason: str) -> None:
        """To each part."""
        self._each("vacuum_failed", reason=reason)

    def relay_answered(self, *, kind: str, answer: str, reason: str) -> None:
        """To each part."""
        self._each("relay_answered", kind=kind, answer=answer, reason=reason)

    def state_write_failed(self, *, cause: str) -> None:
        """To each part."""
        self._each("state_write_failed", cause=cause)

    def state_writable(self) -> None:
        """To each part."""
        self._each("state_writable")

    def corestore_answer(self, *, route: str, outcome: str, seconds: float) -> None:
        """To each part."""
        self._each("corestore_answer", route=route, outcome=outcome, seconds=seconds)

    def corestore_resend(self, *, route: str) -> None:
        """To each part."""
        self._each("corestore_resend", route=route)

    def credential_rejected(self) -> None:
        """To each part."""
        self._each("credential_rejected")

    def corestore_full(self, *, node: str, full: bool) -> None:
        """To each part."""
        self._each("corestore_full", node=node, full=full)

    def corestore_unavailable(self, *, node: str, since: float | None) -> None:
        """To each part."""
        self._each("corestore_unavailable", node=node, since=since)

    def loop_lag(self, *, seconds: float) -> None:
        """To each part."""
        self._each("loop_lag", seconds=seconds)

    def transfers_changed(self, *, node: str, moving: int, queued: int) -> None:
        """To each part."""
        self._each("transfers_changed", node=node, moving=moving, queued=queued)

    def transfer_waited(self, *, kind: str, seconds: float) -> None:
        """To each part."""
        self._each("transfer_waited", kind=kind, seconds=seconds)

    def state_recovered(self, *, how: str, at: float) -> None:
        """To each part."""
        self._each("state_recovered", how=how, at=at)

    def reconcile_pending(self, *, pending: bool) -> None:
        """To each part."""
        self._each("reconcile_pending", pending=pending)

    def orphans_adopted(self, *, what: str, count: int) -> None:
        """To each part."""
        self._each("orphans_adopted", what=what, count=count)

    def recipient_retired(self) -> None:
        """To each part."""
        self._each("recipient_retired")

    def duplicate_agent(self, *, text: str | None) -> None:
        """To each part."""
        self._each("duplicate_agent", text=text)
