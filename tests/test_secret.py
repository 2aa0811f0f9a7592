"""`Secret` never shows its value by accident (agent/secret.py)."""

from __future__ import annotations

import copy
import json
import pickle

import pytest
from pydantic import BaseModel, ValidationError

from agent.secret import MASK, Secret

VALUE = "eyJhbGciOiJSUzI1NiJ9.eyJvcCI6InJlc3RvcmUifQ.c2lnbmF0dXJl"


class _Holder(BaseModel):
    grant: Secret


def test_str_repr_and_format_show_the_mask() -> None:
    """Every text conversion yields the mask, never the value."""
    secret = Secret(VALUE)
    for text in (str(secret), repr(secret), f"{secret}", f"{secret:>40}", "%s" % (secret,)):  # noqa: UP031
        assert VALUE not in text
        assert MASK in text


def test_reveal_returns_the_value() -> None:
    """`reveal()` is the one way out."""
    assert Secret(VALUE).reveal() == VALUE


def test_only_strings_are_wrapped() -> None:
    """A non-str value is a programming error, refused at once."""
    with pytest.raises(TypeError):
        Secret(b"bytes")  # type: ignore[arg-type]


def test_equal_values_compare_equal_and_are_unhashable() -> None:
    """Comparison works on the value; hashing is refused so it cannot leak through dict keys."""
    assert Secret(VALUE) == Secret(VALUE)
    assert Secret(VALUE) != Secret(VALUE + "x")
    assert Secret(VALUE) != VALUE  # never equal to its plain text
    with pytest.raises(TypeError):
        hash(Secret(VALUE))


def test_a_secret_cannot_be_pickled() -> None:
    """Pickling (a way to persist by accident) is refused."""
    with pytest.raises(TypeError):
        pickle.dumps(Secret(VALUE))


def test_copies_are_the_same_object() -> None:
    """Copying never duplicates the value into a new object."""
    secret = Secret(VALUE)
    assert copy.copy(secret) is secret
    assert copy.deepcopy(secret) is secret


def test_truthiness_and_length_follow_the_value() -> None:
    """An empty secret is falsy; `len` is the value's length (no content)."""
    assert not Secret("")
    assert len(Secret(VALUE)) == len(VALUE)


def test_pydantic_validates_from_str_and_dumps_the_mask() -> None:
    """In a model the value validates from a str and every dump shows the mask."""
    holder = _Holder.model_validate({"grant": VALUE})
    assert holder.grant.reveal() == VALUE
    assert holder.model_dump() == {"grant": MASK}
    assert json.loads(holder.model_dump_json()) == {"grant": MASK}
    assert VALUE not in repr(holder)


def test_pydantic_accepts_a_secret_and_refuses_other_types() -> None:
    """A Secret instance passes through; a number is a validation error."""
    assert _Holder(grant=Secret(VALUE)).grant.reveal() == VALUE
    with pytest.raises(ValidationError):
        _Holder.model_validate({"grant": 7})
