"""What sealed material is bound to, and opening it: the two uses of HPKE the agent has.

Both sides compute the HPKE `info` from what they know; it is never sent. A material opens only
under exactly the `info` it was sealed with, so material for node A never opens as node B's, for
another cluster or for another recipient (docs/credentials.md, "Bindings"). The canonical
encoding is a sequence of fields, each a 2-byte big-endian length and its bytes (UTF-8 for
text), starting with a versioned label:

    credential info = lp("serve.zone/corestore-control-credential/v1")
                      || lp(clusterId) || lp(nodeId) || lp(recipientId)
    challenge  info = lp("serve.zone/secret-recipient-enrollment/v1")
                      || lp(clusterId) || lp(enrollmentId) || lp(publicKey: the 32 raw bytes)

`aad` is empty for both: the binding changes the derived key itself, which a mismatch turns into
a failed AEAD open exactly as an `aad` would, and a Cloudly can then seal with any single-shot
HPKE API (`cryptography`'s `Suite.encrypt` takes `info` only).

Pure. `seal_material()` is Cloudly's half (the stand-in and the tests use it); the agent only
opens. What opens as a credential must be a usable bearer (printable ASCII without spaces,
1 to 4096 bytes); anything else is `SealedMaterialRefused` and nothing of it is kept.
"""

from __future__ import annotations

from typing import Final

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from agent.contracts.credentials import (
    CHALLENGE_BYTES,
    MAX_CREDENTIAL_BYTES,
    SealedMaterial,
    b64url,
)
from agent.credentials import hpke
from agent.errors import SealedMaterialRefused
from agent.secret import Secret

__all__ = [
    "CREDENTIAL_LABEL",
    "ENROLLMENT_LABEL",
    "challenge_info",
    "credential_info",
    "open_challenge",
    "open_credential",
    "seal_material",
]

CREDENTIAL_LABEL: Final = "serve.zone/corestore-control-credential/v1"
ENROLLMENT_LABEL: Final = "serve.zone/secret-recipient-enrollment/v1"
_MAX_FIELD: Final = 0xFFFF


def _field(value: str | bytes) -> bytes:
    data = value.encode("utf-8") if isinstance(value, str) else value
    if len(data) > _MAX_FIELD:
        raise SealedMaterialRefused("a binding field is longer than 65535 bytes")
    return len(data).to_bytes(2, "big") + data


def credential_info(cluster_id: str, node_id: str, recipient_id: str) -> bytes:
    """The `info` that binds a node's credential to its cluster, node and recipient."""
    return b"".join(_field(part) for part in (CREDENTIAL_LABEL, cluster_id, node_id, recipient_id))


def challenge_info(cluster_id: str, enrollment_id: str, public_key: bytes) -> bytes:
    """The `info` that binds an enrollment challenge to its cluster, enrollment and key."""
    return b"".join(
        _field(part) for part in (ENROLLMENT_LABEL, cluster_id, enrollment_id, public_key)
    )


def seal_material(
    recipient: X25519PublicKey,
    info: bytes,
    plaintext: bytes,
    aead: hpke.Aead = hpke.Aead.CHACHA20_POLY1305,
) -> SealedMaterial:
    """Cloudly's side: `plaintext` sealed to `recipient` under `info` (empty `aad`)."""
    enc, ciphertext = hpke.seal(recipient, info, b"", plaintext, aead)
    return SealedMaterial.from_wire(
        {
            "kemId": hpke.KEM_X25519_HKDF_SHA256,
            "kdfId": hpke.KDF_HKDF_SHA256,
            "aeadId": int(aead),
            "enc": b64url(enc),
            "ciphertext": b64url(ciphertext),
        }
    )


def _open(material: SealedMaterial, key: X25519PrivateKey, info: bytes) -> bytes:
    return hpke.open_sealed(
        material.enc_bytes(),
        key,
        info,
        b"",
        material.ciphertext_bytes(),
        hpke.Aead(material.aead_id),
    )


def open_credential(material: SealedMaterial, key: X25519PrivateKey, info: bytes) -> Secret:
    """The bearer sealed in `material`; `SealedMaterialRefused` if it does not open under
    `info` or is no usable bearer."""
    plaintext = _open(material, key, info)
    if not 0 < len(plaintext) <= MAX_CREDENTIAL_BYTES or not all(
        0x21 <= byte <= 0x7E for byte in plaintext
    ):
        # Not quoted, not kept: it may be a credential all the same.
        raise SealedMaterialRefused(
            "the sealed credential opened but is no bearer token "
            "(printable ASCII without spaces, 1 to 4096 bytes)"
        )
    return Secret(plaintext.decode("ascii"))


def open_challenge(material: SealedMaterial, key: X25519PrivateKey, info: bytes) -> bytes:
    """The enrollment challenge sealed in `material` (exactly 32 bytes)."""
    plaintext = _open(material, key, info)
    if len(plaintext) != CHALLENGE_BYTES:
        raise SealedMaterialRefused(f"the enrollment challenge is not {CHALLENGE_BYTES} bytes")
    return plaintext
