"""`CredentialAuthority`: Cloudly's side of docs/credentials.md, for the stand-in Cloudly.

It serves the three methods over the stand-in's typed routes, for one cluster:

- `beginSecretRecipientEnrollment {kemId, publicKey}`: a fresh 32-byte challenge sealed to the
  offered key under the enrollment binding, pending under a new `enrollmentId` for
  `enrollment_lifetime_s`.
- `completeSecretRecipientEnrollment {enrollmentId, challenge}`: the opened challenge proves the
  key; the recipient is enrolled (the cluster's previous recipients are retired: one relay per
  cluster) and the answer is kept, so a replay of the same request gets the same recipient. A
  wrong challenge burns the enrollment (`enrollment-proof-invalid`); an unknown or expired one is
  `enrollment-not-found` / `enrollment-expired`.
- `getCorestoreControlCredentialMaterial {nodeId, recipientId}`: the node's bearer sealed to the
  recipient under the credential binding; `unknown-recipient` for a recipient it does not know
  (never enrolled, retired, expired or forgotten), `unknown-node` for a node without a bearer.

It seals with `cryptography`'s own HPKE (`Suite.encrypt`, base mode, empty `aad`), not with the
agent's `agent.credentials.hpke`, so every end-to-end run cross-checks the agent's RFC 9180
implementation against an independent one. A test rotates a node's bearer (`set_bearer`), makes
Cloudly forget every recipient (`forget_recipients`) or answer with material bound to another
node (`seal_for_node`) or sealed to another key (`seal_to_key`), or holds completions
(`hold_completions`: a slow `completeSecretRecipientEnrollment`, answered once the test calls
`release_completions`). What it does is recorded through the stand-in's events; no secret is.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives import hpke as cryptography_hpke
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

from agent.clock import SYSTEM_CLOCK, Clock
from agent.contracts.credentials import (
    CHALLENGE_BYTES,
    METHOD_BEGIN_ENROLLMENT,
    METHOD_COMPLETE_ENROLLMENT,
    METHOD_GET_CREDENTIAL_MATERIAL,
    UNKNOWN_RECIPIENT,
    BeginEnrollmentRequest,
    BeginEnrollmentResponse,
    CompleteEnrollmentRequest,
    CompleteEnrollmentResponse,
    GetCredentialMaterialRequest,
    GetCredentialMaterialResponse,
    SealedMaterial,
    b64url,
    b64url_bytes,
)
from agent.credentials.binding import challenge_info, credential_info
from agent.credentials.hpke import KDF_HKDF_SHA256, KEM_X25519_HKDF_SHA256, NENC, Aead
from agent.errors import Refusal
from agent.protocol.handlers import RequestContext, Route, Routes
from agent.secret import Secret

__all__ = ["CredentialAuthority", "EnrollmentRefused", "UnknownRecipient"]

Record = Callable[..., None]

_SUITES = {
    Aead.AES_128_GCM: cryptography_hpke.AEAD.AES_128_GCM,
    Aead.AES_256_GCM: cryptography_hpke.AEAD.AES_256_GCM,
    Aead.CHACHA20_POLY1305: cryptography_hpke.AEAD.CHACHA20_POLY1305,
}


class UnknownRecipient(Refusal):
    """Cloudly does not know (or no longer accepts) the recipient."""

    code = UNKNOWN_RECIPIENT


class UnknownCredentialNode(Refusal):
    """Cloudly holds no Corestore credential for the node."""

    code = "unknown-node"


class EnrollmentRefused(Refusal):
    """A completion that is not accepted (its code says why)."""

    code = "enrollment-proof-invalid"


class EnrollmentNotFound(EnrollmentRefused):
    """No pending enrollment has this id."""

    code = "enrollment-not-found"


class EnrollmentExpired(EnrollmentRefused):
    """The enrollment's challenge expired before it was answered."""

    code = "enrollment-expired"


@dataclass(slots=True)
class _Pending:
    public_key: bytes
    challenge: bytes
    expires_at: int  # epoch ms
    recipient_id: str | None = None  # set once completed: a replay gets the same answer
    answer: dict[str, Any] | None = None


@dataclass(slots=True)
class _Recipient:
    public_key: bytes
    expires_at: int | None


def _seal(public_key: bytes, info: bytes, plaintext: bytes, aead: Aead) -> SealedMaterial:
    """Seal with cryptography's HPKE (its output is enc || ciphertext)."""
    suite = cryptography_hpke.Suite(
        cryptography_hpke.KEM.X25519, cryptography_hpke.KDF.HKDF_SHA256, _SUITES[aead]
    )
    sealed = suite.encrypt(plaintext, X25519PublicKey.from_public_bytes(public_key), info=info)
    return SealedMaterial.from_wire(
        {
            "kemId": KEM_X25519_HKDF_SHA256,
            "kdfId": KDF_HKDF_SHA256,
            "aeadId": int(aead),
            "enc": b64url(sealed[:NENC]),
            "ciphertext": b64url(sealed[NENC:]),
        }
    )


class CredentialAuthority:
    """Enrollment and per-node sealed bearers for one cluster."""

    def __init__(
        self,
        cluster_id: str,
        bearers: Mapping[str, str | Secret],
        *,
        aead: Aead = Aead.CHACHA20_POLY1305,
        enrollment_lifetime_s: float = 300.0,
        recipient_lifetime_s: float | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.cluster_id = cluster_id
        self.aead = aead
        self.enrollment_lifetime_s = enrollment_lifetime_s
        self.recipient_lifetime_s = recipient_lifetime_s
        self._clock = clock
        self._bearers = {
            node: value if isinstance(value, Secret) else Secret(value)
            for node, value in bearers.items()
        }
        self._pending: dict[str, _Pending] = {}
        self._recipients: dict[str, _Recipient] = {}
        self._numbers = itertools.count(1)
        # A test's override of the binding a node's material is sealed under (node -> node).
        self.seal_for_node: dict[str, str] = {}
        # A test's override of the key material is sealed to (a Cloudly holding a stale key).
        self.seal_to_key: bytes | None = None
        # Every sealed text sent (enc and ciphertext, challenges included): for leak tests.
        self.sealed_texts: list[str] = []
        self._completions = asyncio.Event()
        self._completions.set()

    # --- what a test does as Cloudly ------------------------------------------------------

    def set_bearer(self, node_id: str, value: str | Secret) -> None:
        """Rotate `node_id`'s bearer: material fetched from now on carries `value`."""
        self._bearers[node_id] = value if isinstance(value, Secret) else Secret(value)

    def hold_completions(self) -> None:
        """Answer `completeSecretRecipientEnrollment` only after `release_completions()` (it is
        recorded `enrollment-completion-held` when it arrives)."""
        self._completions.clear()

    def release_completions(self) -> None:
        """Answer the held completions (and every later one at once)."""
        self._completions.set()

    def forget_recipients(self) -> None:
        """Forget every enrolled recipient (the next material request is `unknown-recipient`)."""
        self._recipients.clear()

    @property
    def recipients(self) -> tuple[str, ...]:
        """The recipients that are enrolled now."""
        return tuple(self._recipients)

    def recipient_key(self, recipient_id: str) -> bytes:
        """The public key a recipient was enrolled with."""
        return self._recipients[recipient_id].public_key

    # --- the three methods ----------------------------------------------------------------

    def routes(self, record: Record) -> Routes:
        """The three methods, recording what happens with `record(kind, **detail)`."""

        async def begin(
            request: BeginEnrollmentRequest, ctx: RequestContext
        ) -> BeginEnrollmentResponse:
            del ctx
            public_key = b64url_bytes(request.public_key)
            enrollment_id = f"enrollment-{next(self._numbers)}-{secrets.token_hex(4)}"
            challenge = secrets.token_bytes(CHALLENGE_BYTES)
            expires_at = self._now_ms() + int(self.enrollment_lifetime_s * 1000)
            self._pending[enrollment_id] = _Pending(public_key, challenge, expires_at)
            info = challenge_info(self.cluster_id, enrollment_id, public_key)
            record("enrollment-begun", enrollment_id=enrollment_id, public_key=request.public_key)
            sealed = _seal(public_key, info, challenge, self.aead)
            self.sealed_texts += [sealed.enc, sealed.ciphertext]
            return BeginEnrollmentResponse(
                enrollment_id=enrollment_id, challenge=sealed, expires_at=expires_at
            )

        async def complete(
            request: CompleteEnrollmentRequest, ctx: RequestContext
        ) -> CompleteEnrollmentResponse:
            del ctx
            if not self._completions.is_set():
                record("enrollment-completion-held", enrollment_id=request.enrollment_id)
                await self._completions.wait()
            return self._complete(request, record)

        async def material(
            request: GetCredentialMaterialRequest, ctx: RequestContext
        ) -> GetCredentialMaterialResponse:
            del ctx
            return self._material(request, record)

        return Routes(
            [
                Route(METHOD_BEGIN_ENROLLMENT, BeginEnrollmentRequest, begin),
                Route(METHOD_COMPLETE_ENROLLMENT, CompleteEnrollmentRequest, complete),
                Route(METHOD_GET_CREDENTIAL_MATERIAL, GetCredentialMaterialRequest, material),
            ]
        )

    def _complete(
        self, request: CompleteEnrollmentRequest, record: Record
    ) -> CompleteEnrollmentResponse:
        pending = self._pending.get(request.enrollment_id)
        if pending is None:
            record("enrollment-refused", code=EnrollmentNotFound.code)
            raise EnrollmentNotFound(f"no pending enrollment {request.enrollment_id}")
        proof = b64url_bytes(request.challenge)
        if not hmac.compare_digest(proof, pending.challenge):
            del self._pending[request.enrollment_id]  # one guess per challenge
            record("enrollment-refused", code=EnrollmentRefused.code)
            raise EnrollmentRefused("the challenge was not opened with the offered key")
        if pending.answer is not None:  # an exact replay: the same recipient again
            record("enrollment-replayed", recipient_id=pending.recipient_id)
            return CompleteEnrollmentResponse.from_wire(pending.answer)
        if pending.expires_at <= self._now_ms():
            del self._pending[request.enrollment_id]
            record("enrollment-refused", code=EnrollmentExpired.code)
            raise EnrollmentExpired(f"enrollment {request.enrollment_id} expired")
        recipient_id = f"recipient-{next(self._numbers)}-{secrets.token_hex(4)}"
        expires_at = (
            None
            if self.recipient_lifetime_s is None
            else self._now_ms() + int(self.recipient_lifetime_s * 1000)
        )
        self._recipients.clear()  # one relay per cluster: the new key retires the old one
        self._recipients[recipient_id] = _Recipient(pending.public_key, expires_at)
        answer = CompleteEnrollmentResponse(recipient_id=recipient_id, expires_at=expires_at)
        pending.recipient_id, pending.answer = recipient_id, answer.to_wire()
        record(
            "recipient-enrolled", recipient_id=recipient_id, public_key=b64url(pending.public_key)
        )
        return answer

    def _material(
        self, request: GetCredentialMaterialRequest, record: Record
    ) -> GetCredentialMaterialResponse:
        recipient = self._recipients.get(request.recipient_id)
        if recipient is None or (
            recipient.expires_at is not None and recipient.expires_at <= self._now_ms()
        ):
            record("credential-refused", node_id=request.node_id, code=UnknownRecipient.code)
            raise UnknownRecipient(f"recipient {request.recipient_id} is not enrolled")
        bearer = self._bearers.get(request.node_id)
        if bearer is None:
            record("credential-refused", node_id=request.node_id, code=UnknownCredentialNode.code)
            raise UnknownCredentialNode(f"no Corestore credential for node {request.node_id}")
        bound_node = self.seal_for_node.get(request.node_id, request.node_id)
        info = credential_info(self.cluster_id, bound_node, request.recipient_id)
        public_key = self.seal_to_key or recipient.public_key
        sealed = _seal(public_key, info, bearer.reveal().encode(), self.aead)
        self.sealed_texts += [sealed.enc, sealed.ciphertext]
        record("credential-sealed", node_id=request.node_id, recipient_id=request.recipient_id)
        return GetCredentialMaterialResponse(material=sealed)

    def _now_ms(self) -> int:
        return int(self._clock.time() * 1000)
