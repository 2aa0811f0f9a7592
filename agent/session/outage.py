"""How loudly the session says it lost Cloudly: `Outage` decides, `log_failure()` says it.

A long outage must not be an endless identical warning: the first failure of an outage, and
each change of fault, is logged (`warning`, `error` when permanent); a repeat of the same cause
only at debug; and an error-level summary "Cloudly unreachable for N s: reason" comes after
`first_summary_after` seconds and then at doubling intervals up to `max_summary_interval`. The
connect that ends the outage says how long it lasted (`recovered()`). `Outage` is pure: times
are passed in.

The events: a permanent fault is an error, `cloudly_authentication_failed` (token refused),
`cloudly_answer_unusable`, `cloudly_enrollment_failed`, or else `cloudly_unreachable`, with the
cause's hint; a transient one is the warning `cloudly_session_lost`; a repeat is
`cloudly_attempt_failed` (debug) and a summary `cloudly_unreachable_summary` (error).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final

import structlog

from agent.session.faults import HINTS, Cause, Fault

__all__ = ["Outage", "Report", "ReportKind", "log_failure"]

log = structlog.get_logger("agent.session")

# The error-level event of a permanent cause, when it is not `cloudly_unreachable`.
_EVENTS: Final = {
    Cause.TOKEN_REFUSED: "cloudly_authentication_failed",
    Cause.ANSWER_UNUSABLE: "cloudly_answer_unusable",
    Cause.ENROLLMENT_FAILED: "cloudly_enrollment_failed",
}


class ReportKind(enum.Enum):
    """How a failure is logged."""

    FIRST = "first"  # the first failure of an outage: warning, or error when permanent
    CHANGED = "changed"  # another cause than the last failure's: logged like a first
    REPEAT = "repeat"  # the same cause again: debug only
    SUMMARY = "summary"  # the same cause, and a summary is due: error


@dataclass(frozen=True, slots=True)
class Report:
    """What to log for one failure."""

    kind: ReportKind
    fault: Fault
    down_s: float  # since the outage began
    attempts: int  # failures in this outage, this one included

    @property
    def summary(self) -> str:
        """The operator's sentence for a summary line."""
        return f"Cloudly unreachable for {self.down_s:.0f} s: {self.fault.reason}"


class Outage:
    """The failures since the session last served (or since start): one stretch of outage."""

    def __init__(
        self, *, first_summary_after: float = 60.0, max_summary_interval: float = 3600.0
    ) -> None:
        if not 0 < first_summary_after <= max_summary_interval:
            raise ValueError("need 0 < first_summary_after <= max_summary_interval")
        self._first_after = first_summary_after
        self._max_interval = max_summary_interval
        self._since: float | None = None
        self._last: Fault | None = None
        self._attempts = 0
        self._next_summary = 0.0
        self._interval = first_summary_after

    def failed(self, fault: Fault, now: float) -> Report:
        """Record one failure at `now` and say how to log it."""
        if self._since is None:
            self._since, self._attempts = now, 0
            self._interval = self._first_after
            self._next_summary = now + self._first_after
            kind = ReportKind.FIRST
        elif self._last is None or fault.cause != self._last.cause:
            kind = ReportKind.CHANGED
        elif now >= self._next_summary:
            kind = ReportKind.SUMMARY
            self._interval = min(self._interval * 2, self._max_interval)
            self._next_summary = now + self._interval
        else:
            kind = ReportKind.REPEAT
        self._last = fault
        self._attempts += 1
        return Report(kind, fault, now - self._since, self._attempts)

    def recovered(self, now: float) -> float | None:
        """The session serves again: the outage's length, or None if there was none."""
        since, self._since, self._last = self._since, None, None
        return None if since is None else now - since


def log_failure(report: Report, attempt: int) -> None:
    """Log one failure as `report` says (`attempt`: consecutive failures, this one included)."""
    fault = report.fault
    if report.kind is ReportKind.REPEAT:
        log.debug("cloudly_attempt_failed", cause=fault.cause, error=fault.reason, attempt=attempt)
        return
    if report.kind is ReportKind.SUMMARY:
        log.error(
            "cloudly_unreachable_summary",
            summary=report.summary,
            cause=fault.cause,
            permanent=fault.permanent,
            down_s=round(report.down_s),
            attempts=report.attempts,
            hint=HINTS.get(fault.cause, "retrying with backoff"),
        )
        return
    if not fault.permanent:
        log.warning("cloudly_session_lost", error=fault.reason, cause=fault.cause)
        return
    log.error(
        _EVENTS.get(fault.cause, "cloudly_unreachable"),
        error=fault.reason,
        cause=fault.cause,
        permanent=True,
        hint=f"{HINTS[fault.cause]}; retrying with backoff from its cap",
    )
