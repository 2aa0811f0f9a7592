"""RFC 9180 base mode for DHKEM(X25519, HKDF-SHA256), HKDF-SHA256 and the three AEADs.

Checked against the published vectors (fixtures/hpke_rfc9180_base_x25519.json: RFC 9180
Appendix A.1.1 and A.2.1, and the CFRG vector for AES-256-GCM, which the RFC does not print;
make_hpke_vectors.py says where each comes from) and against `cryptography`'s own HPKE in both
directions.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import hpke as cryptography_hpke
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from hypothesis import given, settings, strategies as st

from agent.credentials import hpke
from agent.credentials.hpke import Aead
from agent.errors import SealedMaterialRefused

VECTORS: list[dict[str, Any]] = json.loads(
    (Path(__file__).parent / "fixtures" / "hpke_rfc9180_base_x25519.json").read_text()
)
FULL = [vector for vector in VECTORS if "skRm" in vector]
CRYPTOGRAPHY_AEAD = {
    Aead.AES_128_GCM: cryptography_hpke.AEAD.AES_128_GCM,
    Aead.AES_256_GCM: cryptography_hpke.AEAD.AES_256_GCM,
    Aead.CHACHA20_POLY1305: cryptography_hpke.AEAD.CHACHA20_POLY1305,
}


def _id(vector: dict[str, Any]) -> str:
    return f"{Aead(vector['aead_id']).name} ({vector['source'].split(' (')[0][:28]})"


def _h(text: str) -> bytes:
    return bytes.fromhex(text)


def _suite(aead: Aead) -> cryptography_hpke.Suite:
    return cryptography_hpke.Suite(
        cryptography_hpke.KEM.X25519, cryptography_hpke.KDF.HKDF_SHA256, CRYPTOGRAPHY_AEAD[aead]
    )


def test_the_vectors_cover_every_aead_in_base_mode_for_x25519() -> None:
    """The fixture holds base-mode DHKEM(X25519, HKDF-SHA256)/HKDF-SHA256 vectors for all three
    AEADs (so no suite goes unchecked)."""
    assert sorted(v["aead_id"] for v in VECTORS) == [1, 2, 3]
    assert {(v["mode"], v["kem_id"], v["kdf_id"]) for v in VECTORS} == {(0, 0x20, 1)}


@pytest.mark.parametrize("vector", VECTORS, ids=_id)
def test_seal_with_the_vectors_ephemeral_key_gives_its_ciphertexts(vector: dict[str, Any]) -> None:
    """With skEm fixed, SetupBaseS and Seal at each listed sequence number reproduce `ct`."""
    ephemeral = X25519PrivateKey.from_private_bytes(_h(vector["skEm"]))
    recipient = X25519PublicKey.from_public_bytes(_h(vector["pkRm"]))
    enc, context = hpke.setup_base_s(
        recipient, _h(vector["info"]), Aead(vector["aead_id"]), ephemeral=ephemeral
    )
    assert enc == ephemeral.public_key().public_bytes_raw()
    for encryption in vector["encryptions"]:
        context.seq = encryption["sequence_number"]
        assert context.seal(_h(encryption["aad"]), _h(encryption["pt"])).hex() == encryption["ct"]


@pytest.mark.parametrize("vector", FULL, ids=_id)
def test_the_key_schedule_matches_the_vector(vector: dict[str, Any]) -> None:
    """DeriveKeyPair, Encap and the key schedule give the vector's keys, enc, key, base_nonce
    and exporter_secret."""
    assert hpke.derive_key_pair(_h(vector["ikmR"])).private_bytes_raw().hex() == vector["skRm"]
    ephemeral = hpke.derive_key_pair(_h(vector["ikmE"]))
    assert ephemeral.private_bytes_raw().hex() == vector["skEm"]
    recipient = X25519PublicKey.from_public_bytes(_h(vector["pkRm"]))
    enc, context = hpke.setup_base_s(
        recipient, _h(vector["info"]), Aead(vector["aead_id"]), ephemeral=ephemeral
    )
    assert enc.hex() == vector["enc"]
    assert (context.key.hex(), context.base_nonce.hex()) == (vector["key"], vector["base_nonce"])
    assert context.exporter_secret.hex() == vector["exporter_secret"]


@pytest.mark.parametrize("vector", FULL, ids=_id)
def test_open_with_the_recipient_key_gives_the_vectors_plaintexts(vector: dict[str, Any]) -> None:
    """SetupBaseR with skRm and Open at each listed sequence number give `pt`."""
    recipient = X25519PrivateKey.from_private_bytes(_h(vector["skRm"]))
    context = hpke.setup_base_r(
        _h(vector["enc"]), recipient, _h(vector["info"]), Aead(vector["aead_id"])
    )
    for encryption in vector["encryptions"]:
        context.seq = encryption["sequence_number"]
        assert context.open(_h(encryption["aad"]), _h(encryption["ct"])).hex() == encryption["pt"]


@pytest.mark.parametrize("aead", list(Aead), ids=lambda aead: aead.name)
def test_cryptography_opens_what_we_seal(aead: Aead) -> None:
    """Our single-shot Seal (empty aad) is opened by cryptography's Suite.decrypt."""
    recipient = X25519PrivateKey.generate()
    enc, ciphertext = hpke.seal(recipient.public_key(), b"info", b"", b"a bearer token", aead)
    opened = _suite(aead).decrypt(enc + ciphertext, recipient, info=b"info")
    assert opened == b"a bearer token"


@pytest.mark.parametrize("aead", list(Aead), ids=lambda aead: aead.name)
def test_we_open_what_cryptography_seals(aead: Aead) -> None:
    """cryptography's Suite.encrypt output (enc || ct) opens with our single-shot Open."""
    recipient = X25519PrivateKey.generate()
    sealed = _suite(aead).encrypt(b"a bearer token", recipient.public_key(), info=b"info")
    enc, ciphertext = sealed[: hpke.NENC], sealed[hpke.NENC :]
    assert hpke.open_sealed(enc, recipient, b"info", b"", ciphertext, aead) == b"a bearer token"


@settings(max_examples=50, deadline=None)
@given(
    plaintext=st.binary(max_size=512),
    info=st.binary(max_size=300),
    aad=st.binary(max_size=64),
    aead=st.sampled_from(list(Aead)),
)
def test_what_is_sealed_opens_to_the_same_bytes(
    plaintext: bytes, info: bytes, aad: bytes, aead: Aead
) -> None:
    """Seal then Open round-trips any plaintext, info and aad."""
    recipient = X25519PrivateKey.generate()
    enc, ciphertext = hpke.seal(recipient.public_key(), info, aad, plaintext, aead)
    assert hpke.open_sealed(enc, recipient, info, aad, ciphertext, aead) == plaintext


def _sealed(aead: Aead = Aead.AES_256_GCM) -> tuple[X25519PrivateKey, bytes, bytes]:
    recipient = X25519PrivateKey.generate()
    enc, ciphertext = hpke.seal(recipient.public_key(), b"info", b"aad", b"secret", aead)
    return recipient, enc, ciphertext


def _flip(data: bytes, index: int) -> bytes:
    return data[:index] + bytes([data[index] ^ 0x01]) + data[index + 1 :]


REFUSED = "the sealed material does not open with this key and binding"


@pytest.mark.parametrize(
    "change",
    [
        "another key",
        "another info",
        "another aad",
        "another aead",
        "ciphertext first byte",
        "ciphertext tag",
        "enc",
        "truncated",
        "short enc",
    ],
)
def test_anything_but_the_exact_key_binding_and_bytes_is_refused_the_same_way(
    change: str,
) -> None:
    """A wrong key, info, aad or suite, or one changed byte: `SealedMaterialRefused` with one
    fixed text (the caller cannot tell which part was wrong)."""
    recipient, enc, ciphertext = _sealed()
    key, info, aad, aead = recipient, b"info", b"aad", Aead.AES_256_GCM
    if change == "another key":
        key = X25519PrivateKey.generate()
    elif change == "another info":
        info = b"infO"
    elif change == "another aad":
        aad = b"aaD"
    elif change == "another aead":
        aead = Aead.CHACHA20_POLY1305
    elif change == "ciphertext first byte":
        ciphertext = _flip(ciphertext, 0)
    elif change == "ciphertext tag":
        ciphertext = _flip(ciphertext, len(ciphertext) - 1)
    elif change == "enc":
        enc = _flip(enc, 5)
    elif change == "truncated":
        ciphertext = ciphertext[:-1]
    else:
        enc = enc[:-1]
    with pytest.raises(SealedMaterialRefused) as caught:
        hpke.open_sealed(enc, key, info, aad, ciphertext, aead)
    assert str(caught.value) == REFUSED


def test_a_low_order_encapsulated_key_is_refused() -> None:
    """An all-zero enc (a low-order point, DH output all zeros) is refused (RFC 9180 §7.1.4)."""
    recipient, _, ciphertext = _sealed()
    with pytest.raises(SealedMaterialRefused, match=REFUSED):
        hpke.open_sealed(bytes(32), recipient, b"info", b"aad", ciphertext, Aead.AES_256_GCM)


def test_a_failed_open_leaves_the_sequence_number_where_it_was() -> None:
    """A refused message does not advance the context: the next good one still opens."""
    recipient = X25519PrivateKey.generate()
    enc, sender = hpke.setup_base_s(recipient.public_key(), b"info", Aead.CHACHA20_POLY1305)
    first = sender.seal(b"", b"one")
    receiver = hpke.setup_base_r(enc, recipient, b"info", Aead.CHACHA20_POLY1305)
    with pytest.raises(SealedMaterialRefused):
        receiver.open(b"", _flip(first, 0))
    assert receiver.seq == 0
    assert receiver.open(b"", first) == b"one"
    assert receiver.seq == 1


def test_a_context_prints_no_key_material() -> None:
    """The repr of a context names the suite and sequence number, never key or nonce."""
    recipient = X25519PrivateKey.generate()
    _, context = hpke.setup_base_s(recipient.public_key(), b"info", Aead.AES_128_GCM)
    shown = repr(context)
    assert context.key.hex() not in shown
    assert repr(context.key) not in shown
    assert repr(context.base_nonce) not in shown
    assert shown == "Context(aead=<Aead.AES_128_GCM: 1>, seq=0)"


def test_derive_key_pair_needs_enough_input_keying_material() -> None:
    """Fewer than 32 bytes of ikm is a programming error, refused."""
    with pytest.raises(ValueError, match="at least 32 bytes"):
        hpke.derive_key_pair(bytes(31))
