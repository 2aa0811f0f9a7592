"""Specification of what a session loss is and what caused it (`agent.session.faults`)."""

from __future__ import annotations

import asyncio
import socket
import ssl

import pytest

from agent.errors import (
    AuthenticationFailed,
    CallFailed,
    CallTimeout,
    EnrollmentFailed,
    InvalidState,
    RemoteProtocolError,
    SessionClosed,
    SessionError,
    UpgradeRefused,
)
from agent.session.faults import HINTS, Cause, classify, session_loss


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


def test_a_session_error_is_a_loss() -> None:
    """A session error or a malformed reply ends the connection and is retried."""
    for error in (SessionClosed(1006), RemoteProtocolError("bad frame")):
        assert session_loss(error) is error


@pytest.mark.parametrize(
    "error", [ValueError("a bug"), InvalidState("an illegal move"), asyncio.CancelledError()]
)
def test_a_bug_or_a_cancellation_is_no_loss(error: BaseException) -> None:
    """Anything else must end the session's run, not be retried."""
    assert session_loss(error) is None


def test_a_group_of_losses_is_its_first_loss() -> None:
    """Of a task group's failures, all of them losses, the first (however nested) is the loss."""
    first = SessionClosed(1006)
    group = ExceptionGroup("session", [ExceptionGroup("inner", [first]), CallTimeout("x", 1.0)])
    assert session_loss(group) is first


def test_a_group_with_a_bug_in_it_is_no_loss() -> None:
    """One failure that is no loss makes the whole group a bug."""
    group = ExceptionGroup("session", [SessionClosed(1006), ValueError("a bug")])
    assert session_loss(group) is None
