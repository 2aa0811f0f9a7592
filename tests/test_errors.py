"""The error root: a call's timeout is no local deadline's; first_leaf, the error a failed
TaskGroup stands for."""

from __future__ import annotations

import pytest

from agent.errors import AgentError, CallTimeout, IntegrityError, StreamBroken, first_leaf
from tests.clock import ManualClock


async def _bounded(error: Exception) -> str:
    """What an `except TimeoutError` around a bounded block takes `error` for."""
    try:
        async with ManualClock().timeout(5):
            raise error
    except TimeoutError:
        return "the deadline"
    except CallTimeout:
        return "the call's timeout"


async def test_a_call_timeout_is_not_taken_for_a_local_deadline() -> None:
    """A call's timeout raised inside a block a deadline bounds is not that deadline's
    `TimeoutError`: `except TimeoutError` around an awaited call catches only its own bound."""
    assert await _bounded(CallTimeout("getClusterConfig", 30.0)) == "the call's timeout"


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
