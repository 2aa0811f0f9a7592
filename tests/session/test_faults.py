"""Specification of the session's fault classification and its outage reporting policy."""

from __future__ import annotations

import socket
import ssl

import pytest

from agent.errors import (
    AuthenticationFailed,
    CallFailed,
    CallTimeout,
    EnrollmentFailed,
    RemoteProtocolError,
    SessionClosed,
    SessionError,
    UpgradeRefused,
)
from agent.session.faults import HINTS, Cause, Fault, Outage, ReportKind, classify


def _raised_from(cause: BaseException, text: str = "could not reach Cloudly") -> SessionError:
    error = SessionError(text)
    error.__cause__ = cause  # as `raise SessionError(...) from cause` leaves it
    return error


def _handshake(status: int) -> UpgradeRefused:
    return UpgradeRefused(f"Cloudly refused the websocket: HTTP {status}", http_status=status)


@pytest.mark.parametrize(
    ("error", "cause", "permanent"),
    [
        (_raised_from(ssl.SSLCertVerificationError(1, "mismatch")), Cause.TLS_VERIFICATION, True),
        (_raised_from(socket.gaierror(socket.EAI_NONAME, "not known")), Cause.DNS_NOT_FOUND, True),
        (_raised_from(socket.gaierror(socket.EAI_AGAIN, "Temporary failure")), Cause.DNS, False),
        (AuthenticationFailed("Cloudly refused the machine token: no"), Cause.TOKEN_REFUSED, True),
        (RemoteProtocolError("the answer is unusable"), Cause.ANSWER_UNUSABLE, True),
        (EnrollmentFailed("Cloudly refused the enrollment"), Cause.ENROLLMENT_FAILED, True),
        (_handshake(403), Cause.HANDSHAKE_REFUSED, True),
        (_handshake(404), Cause.HANDSHAKE_REFUSED, True),
        (_handshake(429), Cause.HANDSHAKE_FAILED, False),
        (_handshake(502), Cause.HANDSHAKE_FAILED, False),
        (_raised_from(ssl.SSLError(1, "EOF during handshake")), Cause.TLS, False),
        (_raised_from(ConnectionRefusedError(111, "refused")), Cause.REFUSED, False),
        (_raised_from(TimeoutError()), Cause.TIMEOUT, False),
        (CallTimeout("getIdentityByToken", 30.0), Cause.CALL_TIMEOUT, False),
        (CallFailed("getClusterConfig", "not now"), Cause.CALL_FAILED, False),
        (SessionClosed(1006), Cause.CLOSED, False),
        (SessionError("something else"), Cause.OTHER, False),
    ],
)  # fmt: skip
def test_each_failure_is_classified_by_what_caused_it(
    error: BaseException, cause: Cause, permanent: bool
) -> None:
    """The cause is read from the error and the exceptions it was raised from."""
    fault = classify(error)
    assert (fault.cause, fault.permanent) == (cause, permanent)
    assert fault.reason == str(error)


def test_the_given_reason_replaces_the_error_text() -> None:
    """The caller's scrubbed text is the reason (the error's own text may quote a secret)."""
    assert classify(SessionClosed(1006), "scrubbed").reason == "scrubbed"


def test_the_causes_are_the_stable_names_logs_metrics_and_the_cli_show() -> None:
    """Each cause reads as its kebab-case name (docs/operations.md lists them)."""
    assert [f"{cause}" for cause in Cause] == [
        "tls-verification",
        "dns-not-found",
        "token-refused",
        "handshake-refused",
        "answer-unusable",
        "enrollment-failed",
        "dns",
        "tls",
        "refused",
        "unreachable",
        "timeout",
        "handshake-failed",
        "closed",
        "call-failed",
        "call-timeout",
        "other",
    ]


def test_a_permanent_fault_names_what_the_operator_should_check() -> None:
    """The hint of a refused token points at the token file."""
    assert HINTS[classify(AuthenticationFailed("no")).cause] == (
        "check the machine token credential (cloudly.token_file)"
    )


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
    assert outage.since is None
    assert outage.failed(_DOWN, 30.0).kind is ReportKind.FIRST
