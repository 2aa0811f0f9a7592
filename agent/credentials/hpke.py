"""RFC 9180 HPKE, base mode, for DHKEM(X25519, HKDF-SHA256) with HKDF-SHA256 and three AEADs.

Pure: `cryptography`'s X25519 and AEAD primitives and the standard library's HMAC, nothing else.
It implements exactly what the agent needs of RFC 9180 (§4 LabeledExtract/LabeledExpand, §4.1
DHKEM with ExtractAndExpand, §7.1.3 DeriveKeyPair, §5.1 the key schedule, §5.2 Seal/Open with a
sequence number, §6.1 single-shot Seal/Open):

    kem  0x0020 DHKEM(X25519, HKDF-SHA256)
    kdf  0x0001 HKDF-SHA256
    aead 0x0001 AES-128-GCM | 0x0002 AES-256-GCM | 0x0003 ChaCha20Poly1305

Why not `cryptography.hazmat.primitives.hpke` (cryptography 50)? Its `Suite.encrypt/decrypt`
take `info` but no `aad` and draw the sender's ephemeral key themselves, so RFC 9180's published
test vectors (which fix the ephemeral key and use a non-empty `aad`) cannot be checked against
it. This module takes the ephemeral key as an optional argument (`seal(..., ephemeral=...)`, for
the vectors only) and is checked against the RFC's vectors, and against `cryptography`'s Suite
in both directions where both apply (empty `aad`), in `tests/credentials/test_hpke.py`.

Failures raise `SealedMaterialRefused` with a fixed text: which step failed is not said, so a
caller cannot learn from the error whether the key, the binding (`info`) or the bytes were wrong.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305

from agent.errors import SealedMaterialRefused

__all__ = [
    "KDF_HKDF_SHA256",
    "KEM_X25519_HKDF_SHA256",
    "NENC",
    "NPK",
    "NSK",
    "Aead",
    "Context",
    "derive_key_pair",
    "open_sealed",
    "seal",
    "setup_base_r",
    "setup_base_s",
]

KEM_X25519_HKDF_SHA256: Final = 0x0020
KDF_HKDF_SHA256: Final = 0x0001
MODE_BASE: Final = 0x00

NSECRET: Final = 32  # DHKEM(X25519, HKDF-SHA256): shared secret
NENC: Final = 32  # encapsulated key
NPK: Final = 32  # public key
NSK: Final = 32  # private key
_NH: Final = 32  # HKDF-SHA256 output
_NN: Final = 12  # every AEAD here: nonce
NT: Final = 16  # every AEAD here: tag

_VERSION: Final = b"HPKE-v1"
_KEM_SUITE_ID: Final = b"KEM" + KEM_X25519_HKDF_SHA256.to_bytes(2, "big")
_REFUSED: Final = "the sealed material does not open with this key and binding"


class Aead(IntEnum):
    """The AEAD identifiers of RFC 9180 §7.3 this module implements."""

    AES_128_GCM = 0x0001
    AES_256_GCM = 0x0002
    CHACHA20_POLY1305 = 0x0003

    @property
    def key_length(self) -> int:
        """Nk: the AEAD key length in bytes."""
        return 16 if self is Aead.AES_128_GCM else 32


def _i2osp(value: int, length: int) -> bytes:
    return value.to_bytes(length, "big")


def _extract(salt: bytes, ikm: bytes) -> bytes:
    # HKDF-Extract (RFC 5869): an empty salt is a string of Nh zeros.
    return hmac.new(salt or bytes(_NH), ikm, hashlib.sha256).digest()


def _expand(prk: bytes, info: bytes, length: int) -> bytes:
    # HKDF-Expand (RFC 5869 §2.3).
    if length > 255 * _NH:
        raise ValueError("HKDF-Expand cannot produce that many bytes")
    output, block, counter = b"", b"", 1
    while len(output) < length:
        block = hmac.new(prk, block + info + bytes([counter]), hashlib.sha256).digest()
        output += block
        counter += 1
    return output[:length]


def _labeled_extract(salt: bytes, label: bytes, ikm: bytes, suite_id: bytes) -> bytes:
    return _extract(salt, _VERSION + suite_id + label + ikm)


def _labeled_expand(prk: bytes, label: bytes, info: bytes, length: int, suite_id: bytes) -> bytes:
    labeled_info = _i2osp(length, 2) + _VERSION + suite_id + label + info
    return _expand(prk, labeled_info, length)


# --- the KEM: DHKEM(X25519, HKDF-SHA256) ------------------------------------------------------


def _public_bytes(key: X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes_raw()


def _dh(private: X25519PrivateKey, public: X25519PublicKey) -> bytes:
    try:
        shared = private.exchange(public)
    except ValueError as exc:  # a low-order point: the all-zero output (RFC 9180 §7.1.4)
        raise SealedMaterialRefused(_REFUSED) from exc
    if not any(shared):
        raise SealedMaterialRefused(_REFUSED)
    return shared


def _extract_and_expand(dh: bytes, kem_context: bytes) -> bytes:
    eae_prk = _labeled_extract(b"", b"eae_prk", dh, _KEM_SUITE_ID)
    return _labeled_expand(eae_prk, b"shared_secret", kem_context, NSECRET, _KEM_SUITE_ID)


def derive_key_pair(ikm: bytes) -> X25519PrivateKey:
    """RFC 9180 §7.1.3 DeriveKeyPair for X25519 (at least 32 bytes of input keying material)."""
    if len(ikm) < NSK:
        raise ValueError(f"DeriveKeyPair needs at least {NSK} bytes of input keying material")
    dkp_prk = _labeled_extract(b"", b"dkp_prk", ikm, _KEM_SUITE_ID)
    return X25519PrivateKey.from_private_bytes(
        _labeled_expand(dkp_prk, b"sk", b"", NSK, _KEM_SUITE_ID)
    )


def _encap(recipient: X25519PublicKey, ephemeral: X25519PrivateKey) -> tuple[bytes, bytes]:
    enc = _public_bytes(ephemeral)
    kem_context = enc + recipient.public_bytes_raw()
    return _extract_and_expand(_dh(ephemeral, recipient), kem_context), enc


def _decap(enc: bytes, recipient: X25519PrivateKey) -> bytes:
    if len(enc) != NENC:
        raise SealedMaterialRefused(_REFUSED)
    sender = X25519PublicKey.from_public_bytes(enc)
    kem_context = enc + _public_bytes(recipient)
    return _extract_and_expand(_dh(recipient, sender), kem_context)


# --- the key schedule and the encryption context -----------------------------------------------


def _suite_id(aead: Aead) -> bytes:
    return (
        b"HPKE"
        + _i2osp(KEM_X25519_HKDF_SHA256, 2)
        + _i2osp(KDF_HKDF_SHA256, 2)
        + _i2osp(int(aead), 2)
    )


@dataclass(slots=True)
class Context:
    """An HPKE encryption context (RFC 9180 §5.2): one key, one base nonce, a sequence number.

    Its `repr` shows the suite and the sequence number only.
    """

    aead: Aead
    key: bytes = field(repr=False)
    base_nonce: bytes = field(repr=False)
    exporter_secret: bytes = field(repr=False)
    seq: int = 0

    def _nonce(self) -> bytes:
        if self.seq >= (1 << (8 * _NN)) - 1:
            raise SealedMaterialRefused("the HPKE context's sequence number is exhausted")
        return bytes(a ^ b for a, b in zip(self.base_nonce, _i2osp(self.seq, _NN), strict=True))

    def _cipher(self) -> AESGCM | ChaCha20Poly1305:
        if self.aead is Aead.CHACHA20_POLY1305:
            return ChaCha20Poly1305(self.key)
        return AESGCM(self.key)

    def seal(self, aad: bytes, plaintext: bytes) -> bytes:
        """Encrypt `plaintext` with `aad` at the current sequence number, then advance it."""
        ciphertext = self._cipher().encrypt(self._nonce(), plaintext, aad)
        self.seq += 1
        return ciphertext

    def open(self, aad: bytes, ciphertext: bytes) -> bytes:
        """Decrypt `ciphertext` with `aad` at the current sequence number, then advance it.

        A failure raises `SealedMaterialRefused` and leaves the sequence number unchanged.
        """
        try:
            plaintext = self._cipher().decrypt(self._nonce(), ciphertext, aad)
        except InvalidTag as exc:
            raise SealedMaterialRefused(_REFUSED) from exc
        self.seq += 1
        return plaintext


def _key_schedule(aead: Aead, shared_secret: bytes, info: bytes) -> Context:
    suite_id = _suite_id(aead)
    psk_id_hash = _labeled_extract(b"", b"psk_id_hash", b"", suite_id)
    info_hash = _labeled_extract(b"", b"info_hash", info, suite_id)
    context = _i2osp(MODE_BASE, 1) + psk_id_hash + info_hash
    secret = _labeled_extract(shared_secret, b"secret", b"", suite_id)
    return Context(
        aead=aead,
        key=_labeled_expand(secret, b"key", context, aead.key_length, suite_id),
        base_nonce=_labeled_expand(secret, b"base_nonce", context, _NN, suite_id),
        exporter_secret=_labeled_expand(secret, b"exp", context, _NH, suite_id),
    )


def setup_base_s(
    recipient: X25519PublicKey,
    info: bytes,
    aead: Aead,
    *,
    ephemeral: X25519PrivateKey | None = None,
) -> tuple[bytes, Context]:
    """SetupBaseS: (enc, the sender's context). `ephemeral` fixes skE (test vectors only)."""
    shared_secret, enc = _encap(recipient, ephemeral or X25519PrivateKey.generate())
    return enc, _key_schedule(aead, shared_secret, info)


def setup_base_r(enc: bytes, recipient: X25519PrivateKey, info: bytes, aead: Aead) -> Context:
    """SetupBaseR: the recipient's context for `enc`."""
    return _key_schedule(aead, _decap(enc, recipient), info)


def seal(
    recipient: X25519PublicKey,
    info: bytes,
    aad: bytes,
    plaintext: bytes,
    aead: Aead,
    *,
    ephemeral: X25519PrivateKey | None = None,
) -> tuple[bytes, bytes]:
    """Single-shot Seal (RFC 9180 §6.1): (enc, ciphertext)."""
    enc, context = setup_base_s(recipient, info, aead, ephemeral=ephemeral)
    return enc, context.seal(aad, plaintext)


def open_sealed(
    enc: bytes,
    recipient: X25519PrivateKey,
    info: bytes,
    aad: bytes,
    ciphertext: bytes,
    aead: Aead,
) -> bytes:
    """Single-shot Open (RFC 9180 §6.1); `SealedMaterialRefused` if it does not open."""
    return setup_base_r(enc, recipient, info, aead).open(aad, ciphertext)
