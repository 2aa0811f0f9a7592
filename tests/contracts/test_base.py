"""The conventions every contract model shares (agent/contracts/base.py)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from agent.contracts.base import (
    PassThroughModel,
    PathSegmentId,
    WireModel,
    first_problem,
    path_segment_id_problem,
)
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


# --- the path-segment id rule -------------------------------------------------------------------


class _Named(WireModel):
    restore_id: PathSegmentId


REFUSED_IDS = [
    pytest.param("", id="empty"),
    pytest.param("../../x", id="parent-traversal"),
    pytest.param("a/b", id="slash"),
    pytest.param("a\\b", id="backslash"),
    pytest.param(".", id="dot"),
    pytest.param("..", id="dot-dot"),
    pytest.param(".hidden", id="leading-dot"),
    pytest.param("-x", id="leading-dash"),
    pytest.param("_x", id="leading-underscore"),
    pytest.param("x\u0000", id="nul"),
    pytest.param("x\n", id="trailing-newline"),
    pytest.param("a b", id="space"),
    pytest.param("\tx", id="tab"),
    pytest.param("é", id="non-ascii"),
    pytest.param("a%2Fb", id="percent"),
    pytest.param("x" * 257, id="257-characters"),
]
ACCEPTED_IDS = [
    pytest.param("uni_0a1b2c3d4e5f60718293a4b5", id="correlation-style"),
    pytest.param("3f2504e0-4f89-11d3-9a0c-0305e82c3301", id="uuid"),
    pytest.param("rst-1.2:a", id="every-separator"),
    pytest.param("A", id="one-letter"),
    pytest.param("7", id="one-digit"),
    pytest.param("x" * 256, id="256-characters"),
]


@pytest.mark.parametrize("value", REFUSED_IDS)
def test_a_path_segment_id_outside_the_rule_is_refused(value: str) -> None:
    """The rule names why, and the model refuses the value without quoting it."""
    assert path_segment_id_problem(value) is not None
    with pytest.raises(ValidationError) as caught:
        _Named.from_wire({"restoreId": value})
    field, reason = first_problem(caught.value)
    assert field == "restoreId"
    if len(value) > 1:
        assert value not in reason


@pytest.mark.parametrize("value", ACCEPTED_IDS)
def test_a_path_segment_id_inside_the_rule_is_accepted(value: str) -> None:
    """Letters, digits and `._:-` after a letter or digit, 1 to 256 characters, pass as given."""
    assert path_segment_id_problem(value) is None
    assert _Named.from_wire({"restoreId": value}).restore_id == value


def test_a_path_segment_id_must_be_a_string() -> None:
    """Strict: a number is not an id."""
    with pytest.raises(ValidationError):
        _Named.from_wire({"restoreId": 7})
