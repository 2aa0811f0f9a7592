"""first_leaf: the error a failed TaskGroup stands for."""

from __future__ import annotations

import pytest

from agent.errors import AgentError, IntegrityError, StreamBroken, first_leaf


def test_the_first_leaf_of_nested_groups_is_found() -> None:
    """Groups inside groups are opened; the first error of the first is the answer."""
    first = IntegrityError("the bytes differ")
    group = BaseExceptionGroup(
        "outer", [BaseExceptionGroup("inner", [first, StreamBroken("later")]), AgentError("x")]
    )
    assert first_leaf(group) is first


def test_a_leaf_that_is_no_agent_error_is_refused() -> None:
    """A group whose first leaf is something else is a caller's bug: `TypeError`, chained."""
    group = BaseExceptionGroup("mixed", [ValueError("not ours"), AgentError("ours")])
    with pytest.raises(TypeError, match="ValueError") as caught:
        first_leaf(group)  # type: ignore[arg-type]
    assert isinstance(caught.value.__cause__, ValueError)
