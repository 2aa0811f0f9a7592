"""The restore grant's shape check (pure): compact JWS or grant-invalid, never quoted."""

from __future__ import annotations

import pytest

from agent.errors import GrantInvalid
from agent.restore.grants import MAX_GRANT_LENGTH, check_grant
from agent.secret import Secret

GOOD = "eyJhbGciOiJSUzI1NiJ9.eyJvcCI6InN0YWdlIn0.c2lnbmF0dXJl"


def test_a_compact_jws_passes_unchanged() -> None:
    """Three non-empty base64url parts: the same Secret comes back."""
    grant = Secret(GOOD)
    assert check_grant(grant) is grant


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("", id="empty"),
        pytest.param("eyJhbGciOiJSUzI1NiJ9.eyJvcCI6InN0YWdlIn0", id="two-parts"),
        pytest.param(GOOD + ".ZXh0cmE", id="four-parts"),
        pytest.param("eyJhbGciOiJSUzI1NiJ9..c2lnbmF0dXJl", id="empty-payload"),
        pytest.param(GOOD + "=", id="padding"),
        pytest.param(GOOD.replace("c2ln", "c2+n"), id="not-base64url"),
        pytest.param(" " + GOOD, id="leading-space"),
        pytest.param(GOOD + "\n", id="trailing-newline"),
    ],
)
def test_a_value_that_is_no_compact_jws_is_grant_invalid(value: str) -> None:
    """Anything else is refused with grant-invalid (not retryable)."""
    with pytest.raises(GrantInvalid) as caught:
        check_grant(Secret(value))
    assert (caught.value.code, caught.value.retryable) == ("grant-invalid", False)


def test_a_grant_longer_than_the_bound_is_refused() -> None:
    """A grant Corestore's header could not carry is refused before it changes anything."""
    signature = "A" * (MAX_GRANT_LENGTH - len(GOOD) + 5)
    with pytest.raises(GrantInvalid, match="longer than"):
        check_grant(Secret(GOOD + signature))


def test_a_grant_at_the_bound_passes() -> None:
    """The bound is inclusive."""
    padded = GOOD + "A" * (MAX_GRANT_LENGTH - len(GOOD))
    assert len(padded) == MAX_GRANT_LENGTH
    check_grant(Secret(padded))


def test_the_refusal_never_quotes_the_grant() -> None:
    """The error text and data hold no part of the refused value."""
    value = "R1JBTlRTRU5USU5FTA.R1JBTlRTRU5USU5FTA"
    with pytest.raises(GrantInvalid) as caught:
        check_grant(Secret(value))
    assert "R1JBTlRTRU5USU5FTA" not in str(caught.value)
    assert "R1JBTlRTRU5USU5FTA" not in repr(caught.value.data)
