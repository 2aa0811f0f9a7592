"""Specification of how loudly the session logs an outage (`agent.session.outage`)."""

from __future__ import annotations

import structlog

from agent.session.faults import Cause, Fault
from agent.session.outage import Outage, ReportKind, log_failure

_TLS = Fault(Cause.TLS_VERIFICATION, "certificate verify failed")
_DOWN = Fault(Cause.REFUSED, "connection refused")


def test_an_outage_logs_its_first_failure_and_only_debugs_identical_repeats() -> None:
    """The first failure is reported; the same cause again shortly after is a repeat."""
    outage = Outage(first_summary_after=60.0)
    kinds = [outage.failed(_TLS, now).kind for now in (0.0, 1.0, 5.0, 30.0)]
    assert kinds == [ReportKind.FIRST, ReportKind.REPEAT, ReportKind.REPEAT, ReportKind.REPEAT]


def test_a_changed_cause_is_reported_again() -> None:
    """Another cause than the last failure's is logged like a first failure."""
    outage = Outage()
    outage.failed(_DOWN, 0.0)
    assert outage.failed(_TLS, 1.0).kind is ReportKind.CHANGED


def test_summaries_come_at_doubling_intervals_up_to_the_cap() -> None:
    """A persisting cause is summarised after 60 s, then 120 s, 240 s later, capped."""
    outage = Outage(first_summary_after=60.0, max_summary_interval=200.0)
    summaries = [
        now
        for now in range(0, 1000, 10)
        if outage.failed(_TLS, float(now)).kind is ReportKind.SUMMARY
    ]
    assert summaries == [60, 180, 380, 580, 780, 980]


def test_a_summary_says_how_long_cloudly_has_been_unreachable_and_why() -> None:
    """The summary sentence names the outage's length and the latest reason."""
    outage = Outage(first_summary_after=60.0)
    outage.failed(_TLS, 100.0)
    report = outage.failed(_TLS, 161.0)
    assert report.kind is ReportKind.SUMMARY
    assert report.attempts == 2
    assert report.summary == "Cloudly unreachable for 61 s: certificate verify failed"


def test_recovery_ends_the_outage_and_says_how_long_it_lasted() -> None:
    """Serving again returns the outage's length; the next failure starts a new outage."""
    outage = Outage()
    assert outage.recovered(5.0) is None
    outage.failed(_DOWN, 10.0)
    assert outage.recovered(25.0) == 15.0
    assert outage.failed(_DOWN, 30.0).kind is ReportKind.FIRST


def _logged(fault: Fault, kind_after: int = 0) -> list[dict[str, object]]:
    outage = Outage(first_summary_after=60.0)
    with structlog.testing.capture_logs() as logs:
        for now in range(kind_after + 1):
            log_failure(outage.failed(fault, float(now)), attempt=now + 1)
    return logs[-1:]


def test_a_permanent_fault_is_an_error_named_for_its_cause_with_the_hint() -> None:
    """A refused token is `cloudly_authentication_failed` at error, hinting at the token file;
    another permanent cause is `cloudly_unreachable`."""
    [refused] = _logged(Fault(Cause.TOKEN_REFUSED, "Cloudly refused the machine token: no"))
    [tls] = _logged(_TLS)
    assert (refused["event"], refused["log_level"], refused["cause"]) == (
        "cloudly_authentication_failed",
        "error",
        "token-refused",
    )
    assert refused["hint"] == (
        "check the machine token credential (cloudly.token_file); "
        "retrying with backoff from its cap"
    )
    assert (tls["event"], tls["log_level"], tls["permanent"]) == (
        "cloudly_unreachable",
        "error",
        True,
    )


def test_a_transient_fault_is_a_warning_and_its_repeat_a_debug_line() -> None:
    """A first transient loss warns `cloudly_session_lost`; the same again is debug only."""
    [first] = _logged(_DOWN)
    [repeat] = _logged(_DOWN, kind_after=1)
    assert (first["event"], first["log_level"], first["error"]) == (
        "cloudly_session_lost",
        "warning",
        "connection refused",
    )
    assert (repeat["event"], repeat["log_level"], repeat["attempt"]) == (
        "cloudly_attempt_failed",
        "debug",
        2,
    )
