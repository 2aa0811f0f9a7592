"""Correlation, stream and cycle ids in the format typedrequest's `isounique.uni()` produces."""

from __future__ import annotations

import secrets

__all__ = ["new_uni_id"]


def new_uni_id() -> str:
    """A fresh `"uni_" + 24 lower-case hex` id (96 random bits)."""
    return "uni_" + secrets.token_hex(12)
