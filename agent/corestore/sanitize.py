"""Making Corestore's own error text safe to put into an exception message.

Pure. Corestore's `error.message` is foreign text: it may echo a header, a token or a grant, carry
control characters or be arbitrarily long. `sanitize_text` masks the secrets the client knows,
anything shaped like a JWS/JWT or a bearer value, strips control characters and bounds the length;
`sanitize_code` keeps an error code only if it is a plain kebab-case word.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

from agent.secret import MASK, Secret

__all__ = ["MAX_TEXT_LENGTH", "sanitize_code", "sanitize_text"]

MAX_TEXT_LENGTH: Final = 200

_CODE: Final = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
_JWS_LIKE: Final = re.compile(r"[A-Za-z0-9_-]{8,}(?:\.[A-Za-z0-9_-]*){2,4}")
_SCHEME_VALUE: Final = re.compile(r"(?i)\b(bearer|basic)\s+\S+")
_CONTROL: Final = re.compile(r"[\x00-\x1f\x7f-\x9f]+")
_SPACES: Final = re.compile(r"\s+")


def sanitize_text(text: str, secrets: Iterable[Secret] = (), limit: int = MAX_TEXT_LENGTH) -> str:
    """`text` with known secrets and secret-shaped values masked, one line, at most `limit`."""
    # Longest first, so a secret containing another is masked whole.
    for value in sorted((s.reveal() for s in secrets if s), key=len, reverse=True):
        text = text.replace(value, MASK)
    text = _JWS_LIKE.sub(MASK, text)
    text = _SCHEME_VALUE.sub(lambda match: f"{match.group(1)} {MASK}", text)
    text = _SPACES.sub(" ", _CONTROL.sub(" ", text)).strip()
    if len(text) > limit:
        text = text[: limit - 1].rstrip() + "…"
    return text


def sanitize_code(code: str | None) -> str:
    """`code` if it is a kebab-case word of at most 64 characters, else `unknown`."""
    if code is not None and _CODE.fullmatch(code):
        return code
    return "unknown"
