"""Sealed material opens only under its own binding: cluster, node and recipient (or, for a
challenge, cluster, enrollment and key); what opens must be a usable bearer."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from agent.contracts.credentials import SealedMaterial, b64url
from agent.credentials.binding import (
    challenge_info,
    credential_info,
    open_challenge,
    open_credential,
    seal_material,
)
from agent.credentials.hpke import Aead
from agent.errors import SealedMaterialRefused
from agent.secret import Secret

CLUSTER, NODE_A, NODE_B, RECIPIENT = "cluster-1", "node-a", "node-b", "recipient-1"
BEARER = b"bearer-for-node-a-SENTINEL-6d1f"


@pytest.fixture
def key() -> X25519PrivateKey:
    """The agent's recipient key."""
    return X25519PrivateKey.generate()


def test_the_credential_binding_has_its_documented_bytes() -> None:
    """docs/credentials.md's example: each field a 2-byte big-endian length and its UTF-8 bytes,
    after the versioned label."""
    info = credential_info("c1", "n1", "r1")
    label = b"serve.zone/corestore-control-credential/v1"
    assert info == (
        len(label).to_bytes(2, "big") + label + b"\x00\x02c1" + b"\x00\x02n1" + b"\x00\x02r1"
    )
    assert info.hex() == (
        "002a73657276652e7a6f6e652f636f726573746f72652d636f6e74726f6c2d63726564656e7469616c2f7631"
        "000263310002" + "6e31" + "0002" + "7231"
    )


def test_the_challenge_binding_has_its_documented_bytes() -> None:
    """The enrollment label, the cluster, the enrollment id and the 32 raw public key bytes."""
    info = challenge_info("c1", "e1", bytes(range(32)))
    label = b"serve.zone/secret-recipient-enrollment/v1"
    assert info == (
        len(label).to_bytes(2, "big") + label + b"\x00\x02c1\x00\x02e1\x00\x20" + bytes(range(32))
    )


def test_the_encoding_is_unambiguous() -> None:
    """Moving a character between adjacent fields changes the binding."""
    assert credential_info("ab", "c", "r") != credential_info("a", "bc", "r")
    assert credential_info("c", "n", "r") != credential_info("c", "nr", "")


@pytest.mark.parametrize("aead", list(Aead), ids=lambda aead: aead.name)
def test_a_credential_opens_under_its_own_binding(key: X25519PrivateKey, aead: Aead) -> None:
    """Sealed for (cluster, node A, recipient): opens to the bearer as a Secret."""
    info = credential_info(CLUSTER, NODE_A, RECIPIENT)
    material = seal_material(key.public_key(), info, BEARER, aead)
    assert material.aead_id == int(aead)
    assert open_credential(material, key, info) == Secret(BEARER.decode())


@pytest.mark.parametrize(
    ("cluster", "node", "recipient"),
    [
        (CLUSTER, NODE_B, RECIPIENT),
        ("cluster-2", NODE_A, RECIPIENT),
        (CLUSTER, NODE_A, "recipient-2"),
    ],
    ids=["node B", "another cluster", "another recipient"],
)
def test_material_sealed_for_node_a_never_opens_as_anything_else(
    key: X25519PrivateKey, cluster: str, node: str, recipient: str
) -> None:
    """Node A's material asked for as node B's (or another cluster's or recipient's) is refused;
    no bearer comes out."""
    material = seal_material(key.public_key(), credential_info(CLUSTER, NODE_A, RECIPIENT), BEARER)
    with pytest.raises(SealedMaterialRefused) as caught:
        open_credential(material, key, credential_info(cluster, node, recipient))
    assert BEARER.decode() not in str(caught.value)


def test_material_sealed_to_another_key_is_refused(key: X25519PrivateKey) -> None:
    """Sealed to someone else's key: refused."""
    other = X25519PrivateKey.generate()
    info = credential_info(CLUSTER, NODE_A, RECIPIENT)
    material = seal_material(other.public_key(), info, BEARER)
    with pytest.raises(SealedMaterialRefused):
        open_credential(material, key, info)


def test_tampered_material_is_refused(key: X25519PrivateKey) -> None:
    """One changed ciphertext byte: refused."""
    info = credential_info(CLUSTER, NODE_A, RECIPIENT)
    material = seal_material(key.public_key(), info, BEARER)
    raw = bytearray(material.ciphertext_bytes())
    raw[3] ^= 0x80
    tampered = material.model_copy(update={"ciphertext": b64url(bytes(raw))})
    with pytest.raises(SealedMaterialRefused):
        open_credential(tampered, key, info)


@pytest.mark.parametrize(
    "plaintext",
    [b"has space", b"line\nbreak", b"\x00binary", "caf\u00e9".encode()],
    ids=["space", "newline", "control", "non-ascii"],
)
def test_what_opens_must_be_a_bearer_and_is_not_quoted(
    key: X25519PrivateKey, plaintext: bytes
) -> None:
    """A plaintext that cannot be a bearer header value is refused, its text never quoted."""
    info = credential_info(CLUSTER, NODE_A, RECIPIENT)
    material = seal_material(key.public_key(), info, plaintext)
    with pytest.raises(SealedMaterialRefused, match="no bearer token") as caught:
        open_credential(material, key, info)
    assert plaintext[:8].decode("latin-1") not in str(caught.value)


def test_a_bearer_of_the_largest_size_opens_and_one_byte_more_cannot_be_sealed(
    key: X25519PrivateKey,
) -> None:
    """4096 bytes open; 4097 make a ciphertext the contract refuses before anything is opened."""
    info = credential_info(CLUSTER, NODE_A, RECIPIENT)
    largest = seal_material(key.public_key(), info, b"x" * 4096)
    assert len(open_credential(largest, key, info)) == 4096
    with pytest.raises(ValueError, match="must encode 17 to 4112 bytes"):
        seal_material(key.public_key(), info, b"x" * 4097)


def test_a_challenge_opens_under_its_binding_only(key: X25519PrivateKey) -> None:
    """The enrollment challenge opens for its enrollment id, not for another."""
    public = key.public_key().public_bytes_raw()
    info = challenge_info(CLUSTER, "enrollment-1", public)
    material = seal_material(key.public_key(), info, bytes(range(32)))
    assert open_challenge(material, key, info) == bytes(range(32))
    with pytest.raises(SealedMaterialRefused):
        open_challenge(material, key, challenge_info(CLUSTER, "enrollment-2", public))


def test_a_challenge_of_another_length_is_refused(key: X25519PrivateKey) -> None:
    """A challenge must be exactly 32 bytes."""
    info = challenge_info(CLUSTER, "enrollment-1", key.public_key().public_bytes_raw())
    material = seal_material(key.public_key(), info, bytes(31))
    with pytest.raises(SealedMaterialRefused, match="not 32 bytes"):
        open_challenge(material, key, info)


def test_a_field_too_long_to_bind_is_refused() -> None:
    """A field over 65535 bytes cannot be length-prefixed in two bytes: refused."""
    with pytest.raises(SealedMaterialRefused, match="longer than 65535"):
        credential_info(CLUSTER, "n" * 65536, RECIPIENT)


def test_sealed_material_names_its_suite(key: X25519PrivateKey) -> None:
    """kemId 0x20 (DHKEM(X25519, HKDF-SHA256)), kdfId 1 (HKDF-SHA256), the AEAD's id."""
    material = seal_material(key.public_key(), b"info", BEARER, Aead.AES_128_GCM)
    assert isinstance(material, SealedMaterial)
    wire = material.to_wire()
    assert (wire["kemId"], wire["kdfId"], wire["aeadId"]) == (0x20, 1, 1)
    assert set(wire) == {"kemId", "kdfId", "aeadId", "enc", "ciphertext"}
