"""The agent's one exception root, split by who is at fault.

Every failure the agent raises on purpose is an `AgentError`. Each class carries the stable
kebab-case `code` and the `retryable` flag that travel on the wire (`error.data`; every code the
agent sends is listed in docs/isolated-restore.md, "Wire error codes"), so translating an
exception into an error envelope is one function (`wire_error_data`) and nothing else
re-decides it.

The root is not retryable: a plain `AgentError` (and anything else the peer answers `internal`)
is a bug, and the same request meets the same bug. Every class that is retryable says so itself
(`retryable = True` in its own body), so a class inherits no retryability it did not mean.

    AgentError                       code            retryable   at fault
    (itself)                         internal        no          us: a bug (the peer answers
                                                                 any other exception so too)
    ├── ConfigError                  internal        no          operator (bad config file)
    ├── StartupBlocked               internal        yes         the node, for now (the health
    │                                                            address in use, the state
    │                                                            directory held by another agent)
    ├── ProtocolError                internal        yes         the protocol
    │   ├── LocalProtocolError       internal        yes         us (we misused the protocol)
    │   └── RemoteProtocolError      internal        no          peer (malformed frame)
    ├── InvalidState                 internal        yes         us (illegal state-machine move)
    ├── StoreError                   internal        yes         disk / SQLite
    │   ├── OutcomeUnrecorded        internal        yes         (a relay job ran, the store
    │   │                                                          refused its outcome: the
    │   │                                                          identical request settles it)
    │   ├── StoreCorrupt             internal        no          disk (integrity_check failed;
    │   │                                                          start-up refused, exit 65)
    │   ├── StoreNewer               internal        no          a newer agent migrated the
    │   │                                                          database (start-up refused,
    │   │                                                          exit 2)
    │   └── StateUnwritable          state-unwritable yes        the node's state disk (full,
    │                                                            read-only, I/O error): `cause`
    ├── SessionError                 internal        yes         network / Cloudly
    │   ├── SessionClosed            internal        yes         (websocket closed: code, reason)
    │   ├── CallTimeout              internal        yes         (no reply before the call's own
    │   │                                                          deadline; no `TimeoutError`)
    │   ├── CallFailed               internal        yes         (Cloudly answered with `error`)
    │   ├── AuthenticationFailed     internal        no          (machine token refused)
    │   ├── EnrollmentFailed         internal        yes         (the X25519 recipient was not
    │   │                                                          enrolled: docs/credentials.md)
    │   └── UpgradeRefused           internal        yes         (the websocket upgrade was
    │                                                              answered with `http_status`)
    ├── TransferError                internal        yes         bytes in flight
    │   ├── StreamBroken             transfer-interrupted yes    (VirtualStream died or went
    │   │   │                                                      silent mid-way: resend it)
    │   │   ├── StreamNotServed      stream-not-served   no      (the peer cannot serve `read`)
    │   │   └── StreamMalformed      invalid-request     no      (a chunk that is no chunk: the
    │   │                                                          same bytes fail again)
    │   ├── ClosureNotAccepted       closure-not-accepted yes    (Cloudly answered accepted: false)
    │   └── IntegrityError           integrity-mismatch  yes     sender or storage (size/sha256)
    ├── CorestoreError               internal        yes         the node's Corestore
    │   ├── CorestoreUnavailable     corestore-unavailable yes   (unreachable, timeout, 5xx)
    │   ├── CorestoreFull            corestore-full      yes     (507 / `storage-full`: its disk
    │   │                                                          is full; not resent)
    │   ├── CorestoreRefused         corestore-refused   no      (4xx, its text sanitised)
    │   └── CredentialError          internal        yes         its control credential
    │       ├── CredentialUnavailable  credential-unavailable yes  (Cloudly could not give it now)
    │       ├── SealedMaterialRefused  sealed-material-refused no  (does not open: another key,
    │       │                                                        binding or tampered bytes)
    │       └── CorestoreCredentialRejected corestore-credential-rejected yes
    │                                                            (refused again after one refetch)
    └── Refusal                      internal        no          the caller (Cloudly's request)
        ├── InvalidRequest           invalid-request     no
        ├── MisroutedCluster         misrouted-cluster   no
        ├── UnknownNode              unknown-node        no
        ├── NodeWithoutCorestore     node-without-corestore yes
        ├── RestoreNotFound          restore-not-found   no
        ├── RevisionConflict         revision-conflict   no   (+ currentRevision, status)
        ├── IllegalTransition        illegal-transition  no   (+ currentRevision, status)
        ├── ObjectNotInManifest      object-not-in-manifest no
        ├── GrantInvalid             grant-invalid       no
        ├── PartialRestoreRefused    partial-restore-refused no
        ├── JobConflict              job-conflict        no   (same backup key, another body)
        ├── RestoreInProgress        restore-in-progress yes  (another restore of the service runs)
        ├── NotReady                 not-ready           yes  (the session is not set up yet)
        └── ShuttingDown             shutting-down       yes

Messages are one sentence naming what failed and why. They never quote a grant, token, JWT,
credential or payload bytes: constructors take the facts, not the request.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

__all__ = [
    "AgentError",
    "AuthenticationFailed",
    "CallFailed",
    "CallTimeout",
    "ClosureNotAccepted",
    "ConfigError",
    "CorestoreCredentialRejected",
    "CorestoreError",
    "CorestoreFull",
    "CorestoreRefused",
    "CorestoreUnavailable",
    "CredentialError",
    "CredentialUnavailable",
    "EnrollmentFailed",
    "GrantInvalid",
    "IllegalTransition",
    "IntegrityError",
    "InvalidRequest",
    "InvalidState",
    "JobConflict",
    "LocalProtocolError",
    "MisroutedCluster",
    "NodeWithoutCorestore",
    "NotReady",
    "ObjectNotInManifest",
    "OutcomeUnrecorded",
    "PartialRestoreRefused",
    "ProtocolError",
    "Refusal",
    "RemoteProtocolError",
    "RestoreInProgress",
    "RestoreNotFound",
    "RevisionConflict",
    "SealedMaterialRefused",
    "SessionClosed",
    "SessionError",
    "ShuttingDown",
    "StartupBlocked",
    "StateUnwritable",
    "StoreCorrupt",
    "StoreError",
    "StoreNewer",
    "StreamBroken",
    "StreamMalformed",
    "StreamNotServed",
    "TransferError",
    "UnknownNode",
    "UpgradeRefused",
    "first_leaf",
    "wire_error_data",
]


class AgentError(Exception):
    """Root of every error the agent raises on purpose.

    `data` holds extra machine-readable facts for the wire (camelCase keys); it must never hold a
    secret.
    """

    code: ClassVar[str] = "internal"
    # Not retryable unless a class says so: an error raised as a plain `AgentError` (or any
    # exception the peer answers `internal`) is a bug, and the same request meets the same bug.
    retryable: ClassVar[bool] = False

    def __init__(self, message: str, **data: Any) -> None:
        super().__init__(message)
        self.message = message
        self.data: dict[str, Any] = data

    def __str__(self) -> str:
        return self.message


# --- the operator's fault ---------------------------------------------------------------------


class ConfigError(AgentError):
    """The configuration file is missing, unreadable or invalid. Start-up stops with exit code 2."""

    retryable = False

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"config {key}: {reason}" if key else f"config: {reason}")
        self.key = key
        self.reason = reason


class StartupBlocked(AgentError):
    """Start-up cannot go on now for a reason that usually passes: the health address is in use,
    another agent holds the state directory. Exit code 75 (EX_TEMPFAIL), which the unit's
    `Restart=on-failure` restarts, unlike a configuration error's 2."""

    retryable = True

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key}: {reason}")
        self.key = key
        self.reason = reason


# --- protocol -----------------------------------------------------------------------------------


class ProtocolError(AgentError):
    """The TypedRequest/VirtualStream protocol was violated."""

    retryable = True


class LocalProtocolError(ProtocolError):
    """We tried to do something the protocol forbids: a bug on our side."""

    retryable = True


class RemoteProtocolError(ProtocolError):
    """The peer sent something the protocol forbids (malformed frame, unknown stream...)."""

    retryable = False


class InvalidState(AgentError, AssertionError):
    """An illegal move was asked of an internal state machine; nothing changed."""

    retryable = True


# --- persistence --------------------------------------------------------------------------------


class StoreError(AgentError):
    """SQLite failed (I/O, locking); the operation did not happen."""

    retryable = True


class OutcomeUnrecorded(StoreError):
    """A relay job's work ended, but the state database refused the write of its outcome: the
    job's row stays `running` and its callers get this instead of the outcome.

    Retryable on purpose: the fault is the store's (logged `relay_job_unrecorded` with its
    code), not the request's, and the identical request is what settles the row (a backup
    resumes; a restore run is first reconciled with Corestore by its keys, and recorded done
    when every effect was applied). `internal` on the wire, as every store fault without a
    named cause is."""

    retryable = True


class StoreCorrupt(StoreError):
    """The state database failed its integrity check (or a damaged one was moved aside by an
    earlier agent and nothing replaced it on purpose). Start-up is refused (exit 65, not
    restarted) until an operator salvages or resets the state (`restore-agent state`): the
    agent never starts on an empty state because the old one was damaged."""

    retryable = False

    def __init__(self, message: str, *, path: str, problem: str, **data: Any) -> None:
        super().__init__(message, **data)
        self.path = path
        self.problem = problem


class StoreNewer(StoreError):
    """The state database has a schema version newer than this agent knows: a newer agent
    migrated it. Start-up is refused (exit 2, not restarted); the way back is that newer agent."""

    retryable = False

    def __init__(self, message: str, *, found: int, known: int) -> None:
        super().__init__(message, schemaVersion=found, knownVersion=known)
        self.found = found
        self.known = known


class StateUnwritable(StoreError):
    """The node's state cannot be written: its disk is full, read-only, or failing (`cause`:
    `disk-full`, `read-only`, `io-error`). Nothing was written; the same request succeeds once
    the disk takes writes again, so it is retryable and never `internal`."""

    code = "state-unwritable"
    retryable = True

    def __init__(self, message: str, *, cause: str) -> None:
        super().__init__(message, cause=cause)
        self.cause = cause


# --- the Cloudly session ------------------------------------------------------------------------


class SessionError(AgentError):
    """The Cloudly session failed or a call on it did."""

    retryable = True


class SessionClosed(SessionError):
    """The websocket closed."""

    retryable = True

    def __init__(self, code: int | None, reason: str = "") -> None:
        super().__init__(
            f"session closed with code {code}" + (f": {reason}" if reason else ""),
        )
        self.close_code = code
        self.reason = reason


class CallTimeout(SessionError):
    """An outgoing call got no reply before its deadline (the call's own, which the connection
    enforces).

    No `TimeoutError`: that one is a local deadline's (`asyncio.timeout`, `Clock.timeout`)
    ending the block it bounds, and an `except TimeoutError` around an awaited call must not
    take the call's timeout for its own deadline."""

    retryable = True

    def __init__(self, method: str, timeout: float) -> None:
        super().__init__(f"{method} got no reply within {timeout:g} s")
        self.method = method
        self.timeout = timeout


class CallFailed(SessionError):
    """The peer answered an outgoing call with an `error`."""

    retryable = True

    def __init__(self, method: str, text: str, error_data: Mapping[str, Any] | None = None) -> None:
        super().__init__(f"{method} failed: {text}")
        self.method = method
        self.text = text
        self.error_data: dict[str, Any] = dict(error_data or {})


class AuthenticationFailed(SessionError):
    """Cloudly refused the machine token or the identity it issued."""

    retryable = False


class EnrollmentFailed(SessionError):
    """The agent's X25519 recipient could not be enrolled with Cloudly (begin or complete was
    refused, the challenge did not open, or the answer was unusable). The session reconnects with
    backoff and enrolls again; nothing was persisted."""

    retryable = True


class UpgradeRefused(SessionError):
    """Cloudly answered the websocket upgrade with an HTTP status instead of switching
    protocols; `http_status` says which (the session's fault classification reads it)."""

    retryable = True

    def __init__(self, message: str, *, http_status: int) -> None:
        super().__init__(message)
        self.http_status = http_status


# --- bytes in flight ----------------------------------------------------------------------------


class TransferError(AgentError):
    """Moving bytes failed."""

    retryable = True


class StreamBroken(TransferError):
    """A VirtualStream ended before its closing marker (keep-alive timeout, session lost).

    Not a bug of the agent: the bytes stopped coming. Cloudly resends the same request on a
    fresh stream; a stage resumes after the chunks Corestore already verified.
    """

    code = "transfer-interrupted"
    retryable = True


class StreamNotServed(StreamBroken):
    """The peer answered our `read` by echoing it: it cannot serve a stream in its response.

    A typedrequest 3.3.0 responder has no `read` branch (docs/wire-notes.md, case 4). Sending the
    same request to the same peer fails the same way, so it is not retryable.
    """

    code = "stream-not-served"
    retryable = False


class StreamMalformed(StreamBroken):
    """The peer sent a chunk that does not decode (no binary form, a value past 255): the
    stream broke there. Sent again, the same bytes fail the same way, so the request it carried
    is refused `invalid-request`, not retryable, rather than `transfer-interrupted`."""

    code = "invalid-request"
    retryable = False


class ClosureNotAccepted(TransferError):
    """Cloudly answered `backupServiceDatabaseClosure` with `accepted: false`: no byte counts."""

    code = "closure-not-accepted"
    retryable = True


class IntegrityError(TransferError):
    """Bytes do not match their declared size or sha256."""

    code = "integrity-mismatch"
    retryable = True


# --- the node's Corestore -----------------------------------------------------------------------


class CorestoreError(AgentError):
    """Corestore could not do what we asked."""

    retryable = True


class CorestoreUnavailable(CorestoreError, ConnectionError):
    """Corestore is unreachable, timed out or answered 5xx."""

    code = "corestore-unavailable"
    retryable = True


class CorestoreFull(CorestoreError):
    """Corestore answered that its disk is full (507, or a 5xx with the code `storage-full`).
    Not resent by the client (a full disk does not empty in a second); retryable for Cloudly
    once the node's operator made room."""

    code = "corestore-full"
    retryable = True


class CorestoreRefused(CorestoreError):
    """Corestore answered 4xx; the message carries its sanitised text."""

    code = "corestore-refused"
    retryable = False


class CredentialError(CorestoreError):
    """The node's Corestore control credential could not be had or was not accepted: Corestore
    could not be asked with authority. A `CorestoreError`, so work that needed it ends the way
    every other Corestore failure ends it (docs/credentials.md, "Failure behaviour")."""

    retryable = True


class CredentialUnavailable(CredentialError):
    """Cloudly could not provide the node's credential now (not connected, no answer in time,
    or it answered `getCorestoreControlCredentialMaterial` with an error)."""

    code = "credential-unavailable"
    retryable = True


class SealedMaterialRefused(CredentialError):
    """Sealed material does not open: sealed to another key, bound to another cluster, node or
    recipient, or its bytes were changed; or what opened is no usable credential. Nothing of it
    is kept."""

    code = "sealed-material-refused"
    retryable = False


class CorestoreCredentialRejected(CredentialError):
    """Corestore refused the node's credential (401, or 403 without a grant code) and refused
    the one fetched again from Cloudly right after: Cloudly and Corestore disagree about it."""

    code = "corestore-credential-rejected"
    retryable = True


# --- the caller's fault (answers to Cloudly's requests) -----------------------------------------


class Refusal(AgentError):
    """A request is refused; nothing changed."""

    retryable = False


class InvalidRequest(Refusal):
    """The request body fails the contract; the message names the first offending field path."""

    code = "invalid-request"


class MisroutedCluster(Refusal):
    """`clusterId` is not the session's cluster."""

    code = "misrouted-cluster"


class UnknownNode(Refusal):
    """The cluster document lists no such node."""

    code = "unknown-node"


class NodeWithoutCorestore(Refusal):
    """The node has no valid Corestore endpoint (retry after a cluster update)."""

    code = "node-without-corestore"
    retryable = True


class RestoreNotFound(Refusal):
    """No state exists for this cluster/node/restore key."""

    code = "restore-not-found"


class RevisionConflict(Refusal):
    """`expectedRevision` is not current and the request is no exact replay."""

    code = "revision-conflict"

    def __init__(self, *, expected: int, current: int, status: str | None) -> None:
        super().__init__(
            f"expectedRevision {expected} is not the current revision {current}",
            currentRevision=current,
            status=status,
        )


class IllegalTransition(Refusal):
    """The request is not allowed in the current status."""

    code = "illegal-transition"

    def __init__(self, *, operation: str, status: str | None, current: int) -> None:
        where = f"status {status}" if status is not None else "a restore that does not exist"
        super().__init__(
            f"{operation} is not allowed in {where}",
            currentRevision=current,
            status=status,
        )


class ObjectNotInManifest(Refusal):
    """The staged object differs from every manifest entry."""

    code = "object-not-in-manifest"


class GrantInvalid(Refusal):
    """`restoreGrant` is malformed."""

    code = "grant-invalid"


class PartialRestoreRefused(Refusal):
    """A partial restore names a resource type it may not."""

    code = "partial-restore-refused"


class JobConflict(Refusal):
    """A relay backup with this exact key exists for another request body.

    The key is (cluster, node, backupId, serviceId): one backupId is one backup, and a retry
    must repeat the body exactly. (Restores have no such key: docs/relay.md.)
    """

    code = "job-conflict"

    def __init__(self, *, kind: str, backup_id: str, service_id: str, node_id: str) -> None:
        super().__init__(
            f"a {kind} of service {service_id} for backup {backup_id} on node {node_id} "
            "exists for another request body",
            kind=kind,
        )


class RestoreInProgress(Refusal):
    """Another restore of the service on that node is running; it may be sent again once that
    one ended (a service is restored by one request at a time: docs/relay.md)."""

    code = "restore-in-progress"
    retryable = True

    def __init__(self, *, service_id: str, node_id: str, backup_id: str, run: int) -> None:
        super().__init__(
            f"restore {run} of service {service_id} on node {node_id} (backup {backup_id}) is "
            "running for another request body; send this one again once it ended",
            run=run,
        )


class NotReady(Refusal):
    """The session is still being set up (authentication, cluster document, the recipient's
    enrollment): the agent serves Cloudly only once it is connected (docs/credentials.md)."""

    code = "not-ready"
    retryable = True


class ShuttingDown(Refusal):
    """The agent is draining and takes no new work."""

    code = "shutting-down"
    retryable = True


def wire_error_data(exc: AgentError) -> dict[str, Any]:
    """The `error.data` object for an agent error: `code`, `retryable`, then its own facts."""
    return {"code": exc.code, "retryable": exc.retryable, **exc.data}


def first_leaf(group: BaseExceptionGroup[AgentError]) -> AgentError:
    """The first agent error in `group`, nested groups opened (a TaskGroup whose tasks failed
    raises their errors grouped; the first one says why)."""
    first: BaseException = group
    while isinstance(first, BaseExceptionGroup):
        first = first.exceptions[0]
    if not isinstance(first, AgentError):  # a caller that typed its group wrongly
        raise TypeError(f"not an agent error: {type(first).__name__}") from first
    return first
