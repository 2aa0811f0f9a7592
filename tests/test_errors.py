"""The error root: what each class says on the wire (the table atop agent/errors.py and
docs/isolated-restore.md, "Wire error codes", say the same), a bug not retryable, a call's
timeout no local deadline's; first_leaf, the error a failed TaskGroup stands for."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import agent.errors
from agent.errors import AgentError, CallTimeout, IntegrityError, StreamBroken, first_leaf
from tests.clock import ManualClock

_DOCS = Path(__file__).resolve().parents[1] / "docs" / "isolated-restore.md"


def _classes() -> dict[str, type[AgentError]]:
    """Every error class agent/errors.py exports, by name."""
    return {
        name: kind
        for name in agent.errors.__all__
        if isinstance(kind := getattr(agent.errors, name), type) and issubclass(kind, AgentError)
    }


def _module_table() -> dict[str, tuple[str, bool]]:
    """The module docstring's table: class name -> (code, retryable)."""
    rows = re.findall(
        r"^\W*(\(itself\)|\w+)\s+([a-z][a-z-]*)\s+(yes|no)\b",
        agent.errors.__doc__ or "",
        re.MULTILINE,
    )
    return {
        ("AgentError" if name == "(itself)" else name): (code, said == "yes")
        for name, code, said in rows
    }


def _docs_table() -> dict[str, str]:
    """docs/isolated-restore.md's "Wire error codes" table: code -> its retryable column."""
    rows = re.findall(r"^\| `([a-z-]+)` \|.*\| ([^|]+) \|$", _DOCS.read_text(), re.MULTILINE)
    return {code: retryable.strip() for code, retryable in rows}


def test_a_plain_agent_error_is_a_bug_and_not_retryable() -> None:
    """The root: `internal`, not retryable (the same request meets the same bug)."""
    error = AgentError("something went wrong")
    assert agent.errors.wire_error_data(error) == {"code": "internal", "retryable": False}


def test_every_retryable_class_says_so_itself() -> None:
    """No class inherits its retryability: each retryable one sets it in its own body."""
    inherited = [
        name
        for name, kind in _classes().items()
        if kind.retryable and "retryable" not in vars(kind)
    ]
    assert inherited == []


def test_the_module_table_gives_every_class_its_code_and_retryability() -> None:
    """One row per class, and each row says what the class sends."""
    table = _module_table()
    classes = _classes()
    assert sorted(table) == sorted(classes)
    assert {name: (kind.code, kind.retryable) for name, kind in classes.items()} == table


def test_the_docs_table_says_each_codes_retryability() -> None:
    """Every code a class sends has its row in the docs, whose retryable column begins with
    what the class sends (`internal` says both: its row names which)."""
    docs = _docs_table()
    said = {
        (kind.code, docs.get(kind.code, "(no row)").split(" ")[0])
        for kind in _classes().values()
        if kind.code != "internal"
    }
    sent = {
        (kind.code, "yes" if kind.retryable else "no")
        for kind in _classes().values()
        if kind.code != "internal"
    }
    assert said == sent
    assert docs["internal"].startswith("no for a bug")


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
