"""Why the Cloudly session failed, and how loudly to say so: `classify()` and `Outage`.

`classify(error)` reads the failure (and the exceptions it was raised from) into a `Fault`:
its `Cause` (a short stable name), whether it is `permanent` and the one-line `reason`.
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

The session still retries a permanent fault (the operator may fix DNS, the certificate or the
token while it waits), but from the backoff's cap at once, and it says so at error level.

`Outage` decides what a failure is worth in the log, so a long outage is not an endless
identical warning: the first failure of an outage, and each change of fault, is logged
(`warning`, `error` when permanent); a repeat of the same cause only at debug; and an error-level
summary "Cloudly unreachable for N s: reason" comes after `first_summary_after` seconds and
then at doubling intervals up to `max_summary_interval`. Pure: times are passed in.
"""

from __future__ import annotations

import enum
import errno
import socket
import ssl
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Final

from agent.errors import (
    AuthenticationFailed,
    CallFailed,
    CallTimeout,
    EnrollmentFailed,
    RemoteProtocolError,
    SessionClosed,
    UpgradeRefused,
)

__all__ = ["HINTS", "Cause", "Fault", "Outage", "Report", "ReportKind", "classify"]


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


# getaddrinfo's "this name has no address" answers; EAI_AGAIN ("try again") is transient.
_NAME_NOT_FOUND: Final = frozenset(
    code for code in (getattr(socket, "EAI_NONAME", None), getattr(socket, "EAI_NODATA", None))
    if code is not None
)  # fmt: skip
_UNREACHABLE: Final = frozenset({errno.ENETUNREACH, errno.EHOSTUNREACH, errno.EHOSTDOWN})
_TRANSIENT_HTTP: Final = frozenset({408, 429})

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

    @property
    def since(self) -> float | None:
        """When the outage began (the caller's clock), None while there is none."""
        return self._since

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
