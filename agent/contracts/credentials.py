"""The three credential methods seed 001 names: recipient enrollment and sealed credential material.

Seed 001 (`IClusterNodeCorestore`) says a node's Corestore bearer "is obtained from Cloudly
through `getCorestoreControlCredentialMaterial`, sealed to the X25519 recipient the relay
enrolled with `beginSecretRecipientEnrollment` and `completeSecretRecipientEnrollment`" but
defines none of their bodies. These are OUR PRODUCT DECISION, documented with the suite, the
bindings and the failure behaviour in docs/credentials.md:

    beginSecretRecipientEnrollment      {kemId: 32, publicKey}
        -> {enrollmentId, challenge: ISealedSecretMaterial, expiresAt}
    completeSecretRecipientEnrollment   {enrollmentId, challenge}      (the opened challenge)
        -> {recipientId, expiresAt?}
    getCorestoreControlCredentialMaterial {nodeId, recipientId}
        -> {material: ISealedSecretMaterial}

    ISealedSecretMaterial = {kemId: 32, kdfId: 1, aeadId: 1 | 2 | 3, enc, ciphertext}

Binary values are base64url without padding (RFC 4648 §5), decoded strictly: only the URL-safe
alphabet, no `=`, no non-zero trailing bits (one text per value). No request carries an
identity: the cluster is the one the session's verified machine identity names, as in the
relay methods of seed 001.

Requests are exact (`WireModel`: Cloudly refuses a field it does not know). Answers are read for
what the agent uses: unknown fields are ignored (Cloudly may add some), every used field is
typed and bounded.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Annotated, Final, Literal

from pydantic import AfterValidator, ConfigDict, StringConstraints

from agent.contracts.backup import Identifier
from agent.contracts.base import NonNegativeSafeInt, PathSegmentId, WireModel

__all__ = [
    "CHALLENGE_BYTES",
    "MAX_CREDENTIAL_BYTES",
    "METHOD_BEGIN_ENROLLMENT",
    "METHOD_COMPLETE_ENROLLMENT",
    "METHOD_GET_CREDENTIAL_MATERIAL",
    "UNKNOWN_RECIPIENT",
    "BeginEnrollmentRequest",
    "BeginEnrollmentResponse",
    "CompleteEnrollmentRequest",
    "CompleteEnrollmentResponse",
    "GetCredentialMaterialRequest",
    "GetCredentialMaterialResponse",
    "SealedMaterial",
    "b64url",
    "b64url_bytes",
]

METHOD_BEGIN_ENROLLMENT: Final = "beginSecretRecipientEnrollment"
METHOD_COMPLETE_ENROLLMENT: Final = "completeSecretRecipientEnrollment"
METHOD_GET_CREDENTIAL_MATERIAL: Final = "getCorestoreControlCredentialMaterial"

# `error.data.code` with which Cloudly says it does not know (or no longer accepts) a recipient:
# the agent enrolls again, once, and asks again, once.
UNKNOWN_RECIPIENT: Final = "unknown-recipient"

CHALLENGE_BYTES: Final = 32
# A bearer is a header value: 4 KiB is far beyond any real token and bounds what we decrypt.
MAX_CREDENTIAL_BYTES: Final = 4096
_X25519_BYTES: Final = 32
_TAG_BYTES: Final = 16

_B64URL: Final = re.compile(r"[A-Za-z0-9_-]*")


def b64url(data: bytes) -> str:
    """`data` as base64url without padding."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_bytes(text: str) -> bytes:
    """The bytes of a strict base64url text (no padding); ValueError if it is not one."""
    if _B64URL.fullmatch(text) is None or len(text) % 4 == 1:
        raise ValueError("must be base64url without padding")
    try:
        data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except binascii.Error as exc:  # pragma: no cover - the pattern and length exclude it
        raise ValueError("must be base64url without padding") from exc
    if b64url(data) != text:
        raise ValueError("must be canonical base64url (no non-zero trailing bits)")
    return data


def _sized(low: int, high: int) -> AfterValidator:
    def check(text: str) -> str:
        size = len(b64url_bytes(text))
        if not low <= size <= high:
            exact = f"{low}" if low == high else f"{low} to {high}"
            raise ValueError(f"must encode {exact} bytes")  # never quotes the value
        return text

    return AfterValidator(check)


# Bounded before decoding: a peer cannot make us decode megabytes to learn they are too many.
_B64 = StringConstraints(max_length=8192)
X25519Key = Annotated[str, _B64, _sized(_X25519_BYTES, _X25519_BYTES)]
SealedBytes = Annotated[str, _B64, _sized(_TAG_BYTES + 1, _TAG_BYTES + MAX_CREDENTIAL_BYTES)]
Challenge = Annotated[str, _B64, _sized(CHALLENGE_BYTES, CHALLENGE_BYTES)]


class _Answer(WireModel):
    """An answer from Cloudly: the used fields exact, unknown ones ignored."""

    model_config = ConfigDict(extra="ignore")


class SealedMaterial(_Answer):
    """`ISealedSecretMaterial`: one HPKE base-mode single-shot seal (RFC 9180 §6.1).

    The suite is named by RFC 9180's identifiers; `info` is the binding of docs/credentials.md
    (never sent: both sides compute it), `aad` is empty.
    """

    kem_id: Literal[0x0020]
    kdf_id: Literal[0x0001]
    aead_id: Literal[0x0001, 0x0002, 0x0003]
    enc: X25519Key
    ciphertext: SealedBytes

    def enc_bytes(self) -> bytes:
        """The encapsulated key."""
        return b64url_bytes(self.enc)

    def ciphertext_bytes(self) -> bytes:
        """The AEAD ciphertext with its tag."""
        return b64url_bytes(self.ciphertext)


class BeginEnrollmentRequest(WireModel):
    """`beginSecretRecipientEnrollment` request: the public key the agent offers."""

    kem_id: Literal[0x0020]
    public_key: X25519Key


class BeginEnrollmentResponse(_Answer):
    """`beginSecretRecipientEnrollment` response: a fresh challenge sealed to the offered key."""

    enrollment_id: PathSegmentId
    challenge: SealedMaterial
    expires_at: NonNegativeSafeInt


class CompleteEnrollmentRequest(WireModel):
    """`completeSecretRecipientEnrollment` request: the challenge, opened (the proof that the
    agent holds the private key)."""

    enrollment_id: PathSegmentId
    challenge: Challenge


class CompleteEnrollmentResponse(_Answer):
    """`completeSecretRecipientEnrollment` response: the enrolled recipient; `expiresAt`
    (epoch ms) when Cloudly limits its life, absent when it does not."""

    recipient_id: PathSegmentId
    expires_at: NonNegativeSafeInt | None = None


class GetCredentialMaterialRequest(WireModel):
    """`getCorestoreControlCredentialMaterial` request: one node's bearer, for one recipient."""

    node_id: Identifier
    recipient_id: PathSegmentId


class GetCredentialMaterialResponse(_Answer):
    """`getCorestoreControlCredentialMaterial` response: the bearer, sealed to the recipient."""

    material: SealedMaterial
