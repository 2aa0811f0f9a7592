"""The authentication sequence on one connection, sans I/O: `Handshake` says which call is due,
reads each answer, and says what it means.

    connect   getIdentityByToken -> __typedsocket_setTag -> getClusterConfig
    probe     getIdentityByToken -> getClusterConfig          (check-config --connect)
    renewal   getIdentityByToken                              (on the live connection)

`next_call()` is the `Call` due now (method and body), None once the sequence is over.
`receive(answer, now=...)` takes what came back, the answer object or Cloudly's `CallFailed`
refusal, and returns one frozen outcome: `Authenticated(identity)`, `Tagged()`,
`ClusterRead(view)`, or `StepFailed(error)`, the session error the answer means (the token
refused, an identity expired on arrival, the tag not accepted, an answer the agent cannot use,
a refusal of the tag or cluster call as it came). Each outcome carries the answer's tolerated
`Deviation` from the seed's exact shape, if any (a field path and reason, never the value).
After `StepFailed` or the plan's last answer nothing is due; another answer is an
`InvalidState` that changes nothing. Nothing Cloudly answers raises out of `receive`.

The machine token is revealed only into the getIdentityByToken body and the JWT only into the
getClusterConfig body (`Call.body`, which no repr shows); a refusal's text comes back with the
token masked. Pure: no asyncio, no socket; time only as `now`, wall-clock seconds (an identity's
expiry is a wall-clock time). `renew_delay()` says when to renew an identity. The session drives
a handshake over its connection (`agent.session.client`); the tests drive one by hand.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from pydantic import ValidationError

from agent.contracts.base import WireModel, first_problem
from agent.contracts.cluster import (
    METHOD_GET_CLUSTER_CONFIG,
    METHOD_GET_IDENTITY_BY_TOKEN,
    METHOD_SET_TAG,
    ClusterConfigAnswer,
    ClusterView,
    GetClusterConfigRequest,
    GetClusterConfigResponse,
    GetIdentityByTokenRequest,
    GetIdentityByTokenResponse,
    SetTagRequest,
    TagAnswer,
    TokenAnswer,
    UsedIdentity,
    contract_deviation,
    read_cluster_view,
)
from agent.errors import (
    AuthenticationFailed,
    CallFailed,
    InvalidState,
    RemoteProtocolError,
    SessionError,
)
from agent.secret import MASK, Secret

__all__ = [
    "CONNECT",
    "PROBE",
    "RENEWAL",
    "Authenticated",
    "Call",
    "ClusterRead",
    "Deviation",
    "Handshake",
    "Outcome",
    "Stage",
    "StepFailed",
    "Tagged",
    "masked",
    "renew_delay",
]

_Model = TypeVar("_Model", bound=WireModel)


class Stage(enum.Enum):
    """Where a handshake is: the call it waits for, or its end."""

    IDENTITY = METHOD_GET_IDENTITY_BY_TOKEN
    TAG = METHOD_SET_TAG
    CLUSTER = METHOD_GET_CLUSTER_CONFIG
    DONE = "done"
    FAILED = "failed"


# The plans: the calls each kind of handshake makes, in order.
CONNECT: Final = (Stage.IDENTITY, Stage.TAG, Stage.CLUSTER)
PROBE: Final = (Stage.IDENTITY, Stage.CLUSTER)
RENEWAL: Final = (Stage.IDENTITY,)


@dataclass(frozen=True, slots=True)
class Call:
    """The call due: `method` with `body`, which may hold the token or the JWT revealed."""

    method: str
    body: Mapping[str, Any] = field(repr=False)


@dataclass(frozen=True, slots=True)
class Deviation:
    """How an answer deviates from the seed's exact shape, tolerated (the agent does not use
    that field): the field path and why, never the value."""

    method: str
    field: str
    reason: str


@dataclass(frozen=True, slots=True)
class Authenticated:
    """Cloudly issued an identity (its JWT goes into the cluster call)."""

    identity: UsedIdentity
    deviation: Deviation | None = None


@dataclass(frozen=True, slots=True)
class Tagged:
    """Cloudly accepted the connection's tag."""

    deviation: Deviation | None = None


@dataclass(frozen=True, slots=True)
class ClusterRead:
    """The cluster document, read into the routing view."""

    view: ClusterView
    deviation: Deviation | None = None


@dataclass(frozen=True, slots=True)
class StepFailed:
    """A step of the sequence failed and the sequence ends: `error` is what its answer means
    (raise it)."""

    error: SessionError | RemoteProtocolError
    deviation: Deviation | None = None


Outcome = Authenticated | Tagged | ClusterRead | StepFailed


class Handshake:
    """One run of the authentication sequence: `plan`'s calls, in order."""

    def __init__(
        self, plan: tuple[Stage, ...], token: Secret, *, tag: SetTagRequest | None = None
    ) -> None:
        if not plan or plan[0] is not Stage.IDENTITY or not set(plan) <= set(CONNECT):
            raise InvalidState("a handshake's plan starts with the identity and makes calls only")
        if Stage.TAG in plan and tag is None:
            raise InvalidState("a handshake that tags the connection needs the tag")
        self._plan = (*plan, Stage.DONE)
        self._next = 0
        self._failed = False
        self._token = token
        self._tag = tag
        self._identity: UsedIdentity | None = None

    @classmethod
    def connect(cls, token: Secret, tag: SetTagRequest) -> Handshake:
        """Authenticate, tag the connection, read the cluster document."""
        return cls(CONNECT, token, tag=tag)

    @classmethod
    def probe(cls, token: Secret) -> Handshake:
        """Authenticate and read the cluster document, untagged: the check of check-config."""
        return cls(PROBE, token)

    @classmethod
    def renewal(cls, token: Secret) -> Handshake:
        """Authenticate again on a live connection."""
        return cls(RENEWAL, token)

    @property
    def stage(self) -> Stage:
        """The call the handshake waits for, else DONE or FAILED."""
        return Stage.FAILED if self._failed else self._plan[self._next]

    @property
    def identity(self) -> UsedIdentity | None:
        """The identity Cloudly issued, None before it did."""
        return self._identity

    def next_call(self) -> Call | None:
        """The call to make now; None once the sequence is over."""
        stage = self.stage
        if stage is Stage.IDENTITY:
            return Call(stage.value, GetIdentityByTokenRequest(token=self._token).revealed_wire())
        if stage is Stage.TAG:
            assert self._tag is not None  # the constructor's rule
            # By name, null included: the configured payload goes as it is.
            return Call(stage.value, self._tag.model_dump(mode="json"))
        if stage is Stage.CLUSTER:
            assert self._identity is not None  # every plan authenticates first
            request = GetClusterConfigRequest(identity=self._identity.credential())
            return Call(stage.value, request.revealed_wire())
        return None

    def receive(self, answer: Mapping[str, Any] | CallFailed, *, now: float) -> Outcome:
        """Read the answer to `next_call()` (the object, or Cloudly's refusal) at wall time
        `now`; `InvalidState` when no call is due."""
        stage = self.stage
        if stage in (Stage.DONE, Stage.FAILED):
            raise InvalidState(f"the handshake is {stage.value}: no answer is due")
        if stage is Stage.IDENTITY:
            outcome = self._authenticated(answer, now)
        elif stage is Stage.TAG:
            outcome = self._tagged(answer)
        else:
            outcome = self._cluster_read(answer)
        if isinstance(outcome, StepFailed):
            self._failed = True
        else:
            self._next += 1
        return outcome

    def _authenticated(self, answer: Mapping[str, Any] | CallFailed, now: float) -> Outcome:
        if isinstance(answer, CallFailed):
            text = masked(answer.text, self._token)
            error = AuthenticationFailed(f"Cloudly refused the machine token: {text}")
            return StepFailed(_chained(error, answer))
        read = _read(METHOD_GET_IDENTITY_BY_TOKEN, answer, TokenAnswer, GetIdentityByTokenResponse)
        if isinstance(read, StepFailed):
            return read
        model, deviation = read
        if _remaining_life(model.identity.expires_at, now) <= 0:
            return StepFailed(_already_expired(), deviation)
        self._identity = model.identity
        return Authenticated(model.identity, deviation)

    def _tagged(self, answer: Mapping[str, Any] | CallFailed) -> Outcome:
        if isinstance(answer, CallFailed):
            return StepFailed(answer)
        read = _read(METHOD_SET_TAG, answer, TagAnswer, TagAnswer)
        if isinstance(read, StepFailed):
            return read
        model, deviation = read
        if not model.success:
            assert self._tag is not None
            error = SessionError(f"Cloudly did not accept the connection tag {self._tag.name}")
            return StepFailed(error, deviation)
        return Tagged(deviation)

    def _cluster_read(self, answer: Mapping[str, Any] | CallFailed) -> Outcome:
        if isinstance(answer, CallFailed):
            return StepFailed(answer)
        read = _read(
            METHOD_GET_CLUSTER_CONFIG, answer, ClusterConfigAnswer, GetClusterConfigResponse
        )
        if isinstance(read, StepFailed):
            return read
        model, deviation = read
        return ClusterRead(read_cluster_view(model.config_data), deviation)


def masked(text: str, secret: Secret) -> str:
    """`text` with every occurrence of `secret` masked: for foreign texts that may echo it."""
    value = secret.reveal()
    return text.replace(value, MASK) if value else text


def _read(
    method: str, data: Mapping[str, Any], used: type[_Model], contract: type[WireModel]
) -> tuple[_Model, Deviation | None] | StepFailed:
    """What the agent uses of `data`, and how `data` deviates from `contract` elsewhere."""
    try:
        model = used.from_wire(data)
    except ValidationError as exc:
        # The validation error quotes the answer, which may hold secrets: not chained.
        path, reason = first_problem(exc, root="answer")
        return StepFailed(
            RemoteProtocolError(f"the {method} answer is unusable: {path}: {reason}", field=path)
        )
    found = contract_deviation(contract, data)
    return model, None if found is None else Deviation(method, *found)


def _chained(error: AuthenticationFailed, cause: CallFailed) -> AuthenticationFailed:
    # As `raise error from cause` leaves it, for whoever raises the outcome's error.
    error.__cause__ = cause
    return error


def _already_expired() -> AuthenticationFailed:
    return AuthenticationFailed(
        "Cloudly issued an identity that has already expired (are the clocks in sync?)"
    )


def _remaining_life(expires_at_ms: int, now: float) -> float:
    return expires_at_ms / 1000.0 - now


def renew_delay(expires_at_ms: int, now: float, margin_s: float) -> float:
    """Seconds to wait before renewing an identity that expires at `expires_at_ms`.

    `margin_s` before expiry; an identity living shorter than the margin is renewed at half of
    its remaining life instead, so a short-lived identity cannot make the session spin. One
    already expired raises `AuthenticationFailed`.
    """
    remaining = _remaining_life(expires_at_ms, now)
    if remaining <= 0:
        raise _already_expired()
    return max(remaining - margin_s, remaining / 2.0)
