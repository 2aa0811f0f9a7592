"""Outgoing calls: fresh correlation ids, absolute deadlines, `retry` bookkeeping (wire.md §1.4).

Pure: the connection passes `now` and acts on the returned outcomes. A call is encoded once
(`PendingCall.wire`), sent, then either answered (`Completed`, or `CallErrored`: an error
reply), asked to wait and send the IDENTICAL bytes again, same correlation id (`Resend`;
`due_resends(now)` hands them out when their time comes, at most `max_attempts` sends in all),
or expires (`expire(now)`, `CallErrored` too). Replies for ids we do not know are reported as
`Unmatched` and dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.errors import CallFailed, CallTimeout, InvalidState, SessionClosed
from agent.protocol.envelope import Correlation, Envelope, encode_envelope

__all__ = ["CallErrored", "CallTable", "Completed", "Outcome", "PendingCall", "Resend", "Unmatched"]


@dataclass(slots=True)
class PendingCall:
    """One call awaiting its reply."""

    call_id: str
    method: str
    frame: Envelope
    wire: bytes  # the frame encoded once: every resend is byte-identical
    timeout: float | None
    deadline: float | None  # None: the caller bounds the call itself (a transfer, by progress)
    sends: int = 1
    resend_at: float | None = None
    sent_at: float = 0.0  # when it was first sent


@dataclass(frozen=True, slots=True)
class Completed:
    """The peer answered with a response object."""

    call_id: str
    response: dict[str, Any]


@dataclass(frozen=True, slots=True)
class CallErrored:
    """The call is over without a response: `error` reply, retry limit, deadline, or the
    session closed (`error` says which; the peer raises it to the caller)."""

    call_id: str
    error: CallFailed | CallTimeout | SessionClosed


@dataclass(frozen=True, slots=True)
class Resend:
    """Send `frame` again (byte-identical payload) at `at`."""

    call_id: str
    frame: Envelope
    at: float


@dataclass(frozen=True, slots=True)
class Unmatched:
    """A response for no pending call (late, duplicate or foreign): drop it."""

    call_id: str


Outcome = Completed | CallErrored | Resend | Unmatched


@dataclass(slots=True)
class CallTable:
    """Pending outgoing calls by correlation id."""

    new_id: Callable[[], str]
    max_attempts: int = 5
    _calls: dict[str, PendingCall] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self._calls)

    def start(
        self, method: str, request: Mapping[str, Any], *, now: float, timeout: float | None
    ) -> PendingCall:
        """Register a call; the returned `wire` is what to send. `timeout` None: the call has
        no deadline here (its caller bounds it, as a closure call is bounded by its stream's
        progress).

        Raises `TypeError` when `request` holds something JSON cannot carry (a `Secret`).
        """
        if timeout is not None and timeout <= 0:
            raise InvalidState(f"call timeout must be positive, got {timeout!r}")
        call_id = self.new_id()
        if call_id in self._calls:
            raise InvalidState("the id factory returned an id already in use")
        frame = Envelope(
            method=method,
            request=dict(request),
            response=None,
            correlation=Correlation(call_id, "request"),
        )
        deadline = None if timeout is None else now + timeout
        call = PendingCall(
            call_id, method, frame, encode_envelope(frame), timeout, deadline, sent_at=now
        )
        self._calls[call_id] = call
        return call

    def on_response(self, env: Envelope, *, now: float) -> Outcome:
        """Account a `phase: "response"` frame."""
        assert env.correlation is not None
        call = self._calls.get(env.correlation.id)
        if call is None or env.method != call.method:
            return Unmatched(env.correlation.id)
        if env.error is not None:  # error wins over retry: TS callers fail there too
            del self._calls[call.call_id]
            error = CallFailed(call.method, env.error.text, _as_dict(env.error.data))
            return CallErrored(call.call_id, error)
        if env.retry is not None:
            if call.sends >= self.max_attempts:
                del self._calls[call.call_id]
                text = f"gave up after {call.sends} attempts, last retry reason: {env.retry.reason}"
                data = {"code": "retry-exhausted", "retryable": True}
                return CallErrored(call.call_id, CallFailed(call.method, text, data))
            call.sends += 1
            call.resend_at = now + env.retry.wait_for_ms / 1000.0
            return Resend(call.call_id, call.frame, call.resend_at)
        del self._calls[call.call_id]
        response = env.response
        if not isinstance(response, dict):
            # TS handlers that crash answer `response: null` without `error` (wire.md §1.3).
            text = "the peer answered without a response object"
            data = {"code": "no-response", "retryable": True}
            return CallErrored(call.call_id, CallFailed(call.method, text, data))
        return Completed(call.call_id, response)

    def expire(self, now: float) -> list[CallErrored]:
        """Calls whose deadline has passed, removed."""
        expired = [
            call
            for call in self._calls.values()
            if call.deadline is not None and now >= call.deadline
        ]
        for call in expired:
            del self._calls[call.call_id]
        return [
            CallErrored(call.call_id, CallTimeout(call.method, call.timeout or 0.0))
            for call in expired
        ]

    def due_resends(self, now: float) -> list[PendingCall]:
        """Calls whose advised resend time has come (each is handed out once per `retry`)."""
        due = [
            call
            for call in self._calls.values()
            if call.resend_at is not None and now >= call.resend_at
        ]
        for call in due:
            call.resend_at = None
        return due

    def next_deadline(self) -> float | None:
        """The earliest deadline or advised resend time, if any call is pending."""
        times = [call.deadline for call in self._calls.values() if call.deadline is not None]
        times += [call.resend_at for call in self._calls.values() if call.resend_at is not None]
        return min(times, default=None)

    def method_of(self, call_id: str) -> str | None:
        """The method of pending call `call_id` (None: no such call)."""
        call = self._calls.get(call_id)
        return None if call is None else call.method

    def round_trip(self, call_id: str, now: float) -> float | None:
        """Seconds since call `call_id` was sent, if it is pending and was sent once (a resent
        call's answer says nothing of the link)."""
        call = self._calls.get(call_id)
        if call is None or call.sends != 1:
            return None
        return now - call.sent_at

    def cancel(self, call_id: str) -> None:
        """Forget a call (its caller gave up); a later reply is `Unmatched`."""
        self._calls.pop(call_id, None)

    def clear(self) -> list[str]:
        """Forget every call (the session closed); returns their ids."""
        ids = list(self._calls)
        self._calls.clear()
        return ids


def _as_dict(data: Any) -> dict[str, Any]:
    if isinstance(data, dict):
        return data
    return {} if data is None else {"value": data}
