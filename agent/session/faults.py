"""A session loss, decided in one place: whether an exception is one, what kind, how long to wait.

`session_loss(exc)` says whether what ended a connection is a loss the session retries (a
`SessionError` or a `RemoteProtocolError`: the network, Cloudly's answers, a malformed reply;
of an exception group, only when every exception in it is one, and then its first) or not
(None: a bug or a cancellation, which must propagate). `Reconnects.lost(error)` decides the
rest: the `Fault` (`classify()`: a `Cause` read from the error and the exceptions it was raised
from, whether it is permanent, the one-line reason) and the wait before the next attempt.
Permanent faults are the ones waiting cannot fix, only an operator:

    cause               permanent  from
    tls-verification    yes        the certificate does not verify (name mismatch, unknown CA,
                                   expired)
    dns-not-found       yes        the host name does not exist (NXDOMAIN / no address)
    token-refused       yes        Cloudly refused the machine token (or issued an identity
                                   that had already expired: clocks out of sync)
    handshake-refused   yes        Cloudly answered the websocket upgrade with a 4xx (wrong URL
                                   path, forbidden), except 408 and 429
    answer-unusable     yes        Cloudly answered in a shape the agent cannot use
    enrollment-failed   yes        Cloudly refused to enroll the agent's recipient key
    dns                 no         a temporary resolver failure
    tls                 no         any other TLS failure (a reset during the handshake)
    refused, unreachable, timeout  no   the network
    handshake-failed    no         a 5xx, 408 or 429 upgrade answer
    closed              no         the websocket closed (keepalive timeout included)
    call-failed, call-timeout  no  a call of the authentication sequence failed or timed out
    other               no         anything else the session treats as a loss

The wait has the agent's one backoff shape (`agent.retry.Backoff`, full jitter) over the count
of consecutive failed attempts; a session that stayed up for `stable_after` seconds proves the
path works again, so the next loss starts from the base window instead of the grown one. A
permanent fault is still retried (the operator may fix DNS, the certificate or the token while
the session waits), but from the backoff's cap at once. How loudly a loss is logged is
`agent.session.outage`'s. Pure: the caller says how long the lost session lasted; the random
draw is injected so tests pin it.
"""

from __future__ import annotations

import enum
import errno
import random
import socket
import ssl
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Final

from agent.errors import (
    AgentError,
    AuthenticationFailed,
    CallFailed,
    CallTimeout,
    EnrollmentFailed,
    RemoteProtocolError,
    SessionClosed,
    SessionError,
    UpgradeRefused,
    first_leaf,
)
from agent.retry import Backoff

__all__ = ["HINTS", "Cause", "Fault", "Loss", "Reconnects", "classify", "session_loss"]


class Cause(enum.StrEnum):
    """Why a session attempt failed or a session was lost (the table above)."""

    TLS_VERIFICATION = "tls-verification"
    DNS_NOT_FOUND = "dns-not-found"
    TOKEN_REFUSED = "token-refused"  # noqa: S105 -- a cause, not a token
    HANDSHAKE_REFUSED = "handshake-refused"
    ANSWER_UNUSABLE = "answer-unusable"
    ENROLLMENT_FAILED = "enrollment-failed"
    DNS = "dns"
    TLS = "tls"
    REFUSED = "refused"
    UNREACHABLE = "unreachable"
    TIMEOUT = "timeout"
    HANDSHAKE_FAILED = "handshake-failed"
    CLOSED = "closed"
    CALL_FAILED = "call-failed"
    CALL_TIMEOUT = "call-timeout"
    OTHER = "other"

    @property
    def permanent(self) -> bool:
        """Only an operator can fix it: the causes with a hint."""
        return self in HINTS


# What the operator should look at, per permanent cause (the log's and the CLI's hint).
HINTS: Final[Mapping[Cause, str]] = {
    Cause.TLS_VERIFICATION: "check the host name in cloudly.url and cloudly.ca_file",
    Cause.DNS_NOT_FOUND: "check the host name in cloudly.url and the node's DNS",
    Cause.TOKEN_REFUSED: "check the machine token credential (cloudly.token_file)",
    Cause.HANDSHAKE_REFUSED: "check cloudly.url (scheme, host and path)",
    Cause.ANSWER_UNUSABLE: "Cloudly answered in a shape the agent cannot use",
    Cause.ENROLLMENT_FAILED: (
        "the agent's recipient key could not be enrolled (docs/credentials.md)"
    ),
}

# getaddrinfo's "this name has no address" answers; EAI_AGAIN ("try again") is transient.
_NAME_NOT_FOUND: Final = frozenset(
    code for code in (getattr(socket, "EAI_NONAME", None), getattr(socket, "EAI_NODATA", None))
    if code is not None
)  # fmt: skip
_UNREACHABLE: Final = frozenset({errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EHOSTDOWN})
_TRANSIENT_HTTP: Final = frozenset({408, 429})
_LOSSES: Final = (SessionError, RemoteProtocolError)


def session_loss(exc: BaseException) -> AgentError | None:
    """The loss `exc` is (of a group made of losses only, its first), or None: a bug or a
    cancellation, which ends the session's run."""
    if not isinstance(exc, BaseExceptionGroup):
        return exc if isinstance(exc, _LOSSES) else None
    losses, others = exc.split(_LOSSES)
    if others is not None or losses is None:
        return None
    return first_leaf(losses)


@dataclass(frozen=True, slots=True)
class Fault:
    """One classified failure of the session."""

    cause: Cause
    reason: str

    @property
    def permanent(self) -> bool:
        """Whether only an operator can fix it."""
        return self.cause.permanent


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and every exception it was raised from or during, nearest first."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _cause_of(exc: BaseException) -> Cause:
    chain = list(_chain(exc))
    for link in chain:
        if isinstance(link, AuthenticationFailed):
            return Cause.TOKEN_REFUSED
        if isinstance(link, RemoteProtocolError):
            return Cause.ANSWER_UNUSABLE
        if isinstance(link, EnrollmentFailed):
            return Cause.ENROLLMENT_FAILED
        if isinstance(link, ssl.SSLCertVerificationError):
            return Cause.TLS_VERIFICATION
        if isinstance(link, socket.gaierror):
            return Cause.DNS_NOT_FOUND if link.errno in _NAME_NOT_FOUND else Cause.DNS
        if isinstance(link, UpgradeRefused):
            status = link.http_status
            if 400 <= status < 500 and status not in _TRANSIENT_HTTP:
                return Cause.HANDSHAKE_REFUSED
            return Cause.HANDSHAKE_FAILED
    for link in chain:
        if isinstance(link, ssl.SSLError):
            return Cause.TLS
        if isinstance(link, ConnectionRefusedError):
            return Cause.REFUSED
        if isinstance(link, OSError) and link.errno in _UNREACHABLE:
            return Cause.UNREACHABLE
        if isinstance(link, CallTimeout):
            return Cause.CALL_TIMEOUT
        if isinstance(link, TimeoutError):
            return Cause.TIMEOUT
        if isinstance(link, CallFailed):
            return Cause.CALL_FAILED
        if isinstance(link, SessionClosed):
            return Cause.CLOSED
    return Cause.OTHER


def classify(error: BaseException, reason: str | None = None) -> Fault:
    """The fault `error` is; `reason` is its (already scrubbed) text, else `str(error)`."""
    return Fault(_cause_of(error), str(error) if reason is None else reason)


@dataclass(frozen=True, slots=True)
class Loss:
    """One failed attempt or lost session, decided."""

    fault: Fault
    delay: float  # seconds before the next attempt
    attempt: int  # consecutive failures, this one included


class Reconnects:
    """Consecutive failed attempts of the session, each turned into a fault and a wait."""

    def __init__(
        self,
        backoff: Backoff | None = None,
        *,
        stable_after: float = 60.0,
        rng: Callable[[], float] = random.random,
    ) -> None:
        if stable_after < 0:
            raise ValueError("backoff needs stable_after >= 0")
        self._backoff = backoff or Backoff()
        self._stable_after = stable_after
        self._rng = rng
        self._failures = 0

    def lost(self, error: AgentError, *, reason: str, session_lasted: float = 0.0) -> Loss:
        """Decide a loss: `error` ended a session that lasted `session_lasted` s (0 for an
        attempt that never connected; at least `stable_after` resets the count first).
        `reason` is the error's text as the operator may see it (scrubbed)."""
        fault = classify(error, reason)
        return Loss(fault, self._next_delay(session_lasted, fault.permanent), self._failures)

    def _next_delay(self, session_lasted: float, permanent: bool) -> float:
        if session_lasted >= self._stable_after:
            self._failures = 0
        self._failures += 1
        try:
            if permanent:  # trying again quickly cannot help: drawn from the cap's window
                return self._backoff.from_cap(self._rng())
            return self._backoff.delay(self._failures, self._rng())
        except ValueError:
            self._failures -= 1
            raise
