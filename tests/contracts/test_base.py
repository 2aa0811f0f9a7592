"""The conventions every contract model shares (agent/contracts/base.py)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from agent.contracts.base import PassThroughModel, WireModel, first_problem
from agent.secret import MASK, Secret


class _Grant(WireModel):
    restore_grant: Secret
    cluster_id: str


class _Document(PassThroughModel):
    id: str


def test_from_wire_refuses_snake_case_names() -> None:
    """The wire carries camelCase only: a snake_case key is an unknown field."""
    with pytest.raises(ValidationError):
        _Grant.from_wire({"restore_grant": "a.b.c", "cluster_id": "c"})


def test_from_wire_accepts_camel_case_names() -> None:
    """The seeds' names parse."""
    model = _Grant.from_wire({"restoreGrant": "a.b.c", "clusterId": "c"})
    assert model.cluster_id == "c"
    assert model.restore_grant.reveal() == "a.b.c"


def test_to_wire_masks_a_secret() -> None:
    """A Secret field never dumps its value."""
    model = _Grant.from_wire({"restoreGrant": "a.b.c", "clusterId": "c"})
    assert model.to_wire() == {"restoreGrant": MASK, "clusterId": "c"}


def test_pass_through_keeps_unknown_nulls() -> None:
    """An unknown field's explicit null is the sender's value and survives the round trip."""
    wire = {"id": "x", "note": None, "nested": {"keep": None}}
    assert _Document.from_wire(wire).to_wire() == wire


def test_first_problem_names_the_wire_field_without_schema_steps() -> None:
    """A wrong-typed Secret is reported at its field, not at pydantic's validator step."""
    with pytest.raises(ValidationError) as caught:
        _Grant.from_wire({"restoreGrant": 7, "clusterId": "c"})
    path, reason = first_problem(caught.value)
    assert path == "restoreGrant"
    assert "7" not in reason


def test_first_problem_falls_back_to_the_root_for_a_non_object() -> None:
    """A body that is not an object is reported at the root name."""
    with pytest.raises(ValidationError) as caught:
        _Grant.from_wire([])
    assert first_problem(caught.value, root="body")[0] == "body"
