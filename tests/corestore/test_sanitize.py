"""sanitize.py: Corestore's error text made safe for an exception message (pure)."""

from __future__ import annotations

import pytest

from agent.corestore.sanitize import MAX_TEXT_LENGTH, sanitize_code, sanitize_text
from agent.secret import MASK, Secret

BEARER = Secret("opaque-control-credential-42")
GRANT = "eyJhbGciOiJSUzI1NiJ9.eyJvcCI6IngifQ.c2lnbmF0dXJl"


def test_known_secrets_are_masked() -> None:
    """A bearer the server echoes back does not reach the message."""
    text = sanitize_text(f"token {BEARER.reveal()} is not valid", [BEARER])
    assert BEARER.reveal() not in text
    assert MASK in text


def test_jws_shaped_values_are_masked_even_if_unknown() -> None:
    """A grant (or any JWT) is masked without the client knowing it."""
    assert GRANT not in sanitize_text(f"grant {GRANT} expired")


def test_bearer_values_are_masked_after_their_scheme() -> None:
    """An echoed Authorization value is masked."""
    assert sanitize_text("got Authorization: Bearer abc123") == f"got Authorization: Bearer {MASK}"


def test_control_characters_and_newlines_become_single_spaces() -> None:
    """The message stays one line and carries no terminal escapes."""
    assert sanitize_text("bad\r\n\x1b[31mthing\x00 here") == "bad [31mthing here"


def test_long_text_is_bounded() -> None:
    """At most MAX_TEXT_LENGTH characters, ending in an ellipsis."""
    text = sanitize_text("word " * 500)
    assert len(text) <= MAX_TEXT_LENGTH
    assert text.endswith("…")


@pytest.mark.parametrize(
    ("code", "kept"),
    [
        ("offset-gap", "offset-gap"),
        ("Offset-Gap", "unknown"),
        ("x" * 65, "unknown"),
        ("a b", "unknown"),
        (None, "unknown"),
        (GRANT, "unknown"),
    ],
)
def test_only_plain_kebab_case_codes_are_kept(code: str | None, kept: str) -> None:
    """A code is a kebab-case word of at most 64 characters, else `unknown`."""
    assert sanitize_code(code) == kept
