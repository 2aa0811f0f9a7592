"""The credential bodies (our product decision, docs/credentials.md): exact requests, answers read
for what the agent uses, strict base64url, bounded sizes, never quoting a value."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from hypothesis import given, strategies as st
from pydantic import ValidationError

from agent.contracts.base import first_problem
from agent.contracts.credentials import (
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

KEY = b64url(bytes(range(32)))
MATERIAL = {
    "kemId": 32,
    "kdfId": 1,
    "aeadId": 3,
    "enc": b64url(bytes(32)),
    "ciphertext": b64url(bytes(48)),
}


def _problem(model: Any, data: Any) -> tuple[str, str]:
    with pytest.raises(ValidationError) as caught:
        model.from_wire(data)
    return first_problem(caught.value)


@given(st.binary(max_size=200))
def test_base64url_round_trips_any_bytes(data: bytes) -> None:
    """Encoding then decoding gives the same bytes, without padding."""
    text = b64url(data)
    assert "=" not in text
    assert b64url_bytes(text) == data


@pytest.mark.parametrize(
    "text",
    ["AA==", "AB+/", "A", "AB", "AB C", "ABC\n"],
    ids=["padding", "standard alphabet", "one char", "trailing bits", "space", "newline"],
)
def test_base64url_is_decoded_strictly(text: str) -> None:
    """Padding, the standard alphabet, impossible lengths and non-canonical trailing bits are
    refused: one text per value."""
    with pytest.raises(ValueError, match="base64url"):
        b64url_bytes(text)


def test_the_begin_request_is_exact() -> None:
    """`{kemId: 32, publicKey}`; nothing else, no other KEM, exactly 32 key bytes."""
    request = BeginEnrollmentRequest.from_wire({"kemId": 32, "publicKey": KEY})
    assert request.to_wire() == {"kemId": 32, "publicKey": KEY}
    assert _problem(BeginEnrollmentRequest, {"kemId": 32, "publicKey": KEY, "x": 1})[0] == "x"
    assert _problem(BeginEnrollmentRequest, {"kemId": 16, "publicKey": KEY})[0] == "kemId"
    short = b64url(bytes(31))
    assert _problem(BeginEnrollmentRequest, {"kemId": 32, "publicKey": short}) == (
        "publicKey",
        "Value error, must encode 32 bytes",
    )


def test_a_refusal_never_quotes_the_value() -> None:
    """The reason names the rule, not the offending text (it may be key material)."""
    secret_looking = b64url(b"k" * 33)
    path, reason = _problem(BeginEnrollmentRequest, {"kemId": 32, "publicKey": secret_looking})
    assert secret_looking not in reason
    assert path == "publicKey"


def test_the_complete_request_carries_the_opened_challenge() -> None:
    """`{enrollmentId, challenge}`: a path-segment id and exactly 32 bytes."""
    body = {"enrollmentId": "enrollment-1", "challenge": b64url(bytes(32))}
    assert CompleteEnrollmentRequest.from_wire(body).to_wire() == body
    wrong_size = {**body, "challenge": b64url(bytes(16))}
    assert _problem(CompleteEnrollmentRequest, wrong_size)[0] == "challenge"
    bad_id = {**body, "enrollmentId": "../enrollment"}
    assert _problem(CompleteEnrollmentRequest, bad_id)[0] == "enrollmentId"


def test_the_material_request_names_the_node_and_the_recipient() -> None:
    """`{nodeId, recipientId}`; an empty node id names nothing."""
    body = {"nodeId": "node-1", "recipientId": "recipient-1"}
    assert GetCredentialMaterialRequest.from_wire(body).to_wire() == body
    assert _problem(GetCredentialMaterialRequest, {**body, "nodeId": ""})[0] == "nodeId"


def test_answers_ignore_fields_the_agent_does_not_use() -> None:
    """Cloudly may add fields to an answer (or to the material); the used ones stay typed."""
    answer = GetCredentialMaterialResponse.from_wire(
        {"material": {**MATERIAL, "note": "new"}, "issuedAt": 1}
    )
    assert answer.material.aead_id == 3
    assert answer.material.enc_bytes() == bytes(32)
    assert answer.material.ciphertext_bytes() == bytes(48)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"kemId": 16}, "material.kemId"),
        ({"kdfId": 2}, "material.kdfId"),
        ({"aeadId": 0xFFFF}, "material.aeadId"),
        ({"enc": b64url(bytes(33))}, "material.enc"),
        ({"ciphertext": b64url(bytes(16))}, "material.ciphertext"),
        ({"ciphertext": b64url(bytes(16 + 4097))}, "material.ciphertext"),
        ({"ciphertext": "A" * 8193}, "material.ciphertext"),
    ],
    ids=["kem", "kdf", "export-only aead", "enc size", "empty", "too long", "unbounded text"],
)
def test_material_of_another_suite_or_size_is_unusable(change: dict[str, Any], field: str) -> None:
    """Only DHKEM(X25519, HKDF-SHA256)/HKDF-SHA256 with one of the three AEADs, a 32-byte enc and
    a ciphertext of 1 to 4096 bytes plus the tag."""
    assert _problem(GetCredentialMaterialResponse, {"material": {**MATERIAL, **change}})[0] == field


def test_the_begin_answer_needs_its_challenge_and_expiry() -> None:
    """`{enrollmentId, challenge, expiresAt}`, expiresAt a safe non-negative integer."""
    good = {"enrollmentId": "enrollment-1", "challenge": MATERIAL, "expiresAt": 1_700_000_000_000}
    answer = BeginEnrollmentResponse.from_wire(good)
    assert isinstance(answer.challenge, SealedMaterial)
    assert _problem(BeginEnrollmentResponse, {**good, "expiresAt": -1})[0] == "expiresAt"
    missing = {key: value for key, value in good.items() if key != "challenge"}
    assert _problem(BeginEnrollmentResponse, missing)[0] == "challenge"


def test_the_complete_answer_may_leave_the_expiry_out() -> None:
    """No `expiresAt`: the recipient does not expire; a recipient id follows the id rule."""
    assert CompleteEnrollmentResponse.from_wire({"recipientId": "r-1"}).expires_at is None
    dated = CompleteEnrollmentResponse.from_wire({"recipientId": "r-1", "expiresAt": 5})
    assert dated.expires_at == 5
    assert _problem(CompleteEnrollmentResponse, {"recipientId": "r/1"})[0] == "recipientId"


def test_the_standard_base64_of_a_key_is_not_accepted() -> None:
    """A key sent in standard base64 (with '+', '/' or padding) is refused, not guessed at."""
    standard = base64.b64encode(bytes([0xFB] * 32)).decode()
    assert _problem(BeginEnrollmentRequest, {"kemId": 32, "publicKey": standard})[0] == (
        "publicKey"
    )
