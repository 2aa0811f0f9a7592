"""The isolated-restore transition table: every status (and absent) against every operation."""

from __future__ import annotations

import itertools
import re
from collections import deque
from pathlib import Path

import pytest

from agent.domain import restore_machine as machine
from agent.domain.restore_machine import (
    IN_FLIGHT,
    NODE_STATUSES,
    RESTORE_TABLE,
    TERMINAL,
    NodeStatus,
    Op,
)
from agent.errors import IllegalTransition

TRANSITIONS = RESTORE_TABLE.moves
decide = RESTORE_TABLE.decide
sources = RESTORE_TABLE.sources

DOCS = Path(__file__).resolve().parents[2] / "docs" / "isolated-restore.md"

ALL_STATUSES: tuple[NodeStatus | None, ...] = (None, *NODE_STATUSES)
EVERY_PAIR = list(itertools.product(ALL_STATUSES, Op))
LEGAL = [pair for pair in EVERY_PAIR if pair in TRANSITIONS]
ILLEGAL = [pair for pair in EVERY_PAIR if pair not in TRANSITIONS]


def _id(pair: tuple[NodeStatus | None, Op]) -> str:
    return f"{pair[0] or 'absent'}-{pair[1].value}"


@pytest.mark.parametrize("pair", LEGAL, ids=_id)
def test_legal_move_answers_the_tables_status(pair: tuple[NodeStatus | None, Op]) -> None:
    """A move in the table yields exactly the table's next status."""
    status, op = pair
    assert decide(status, op, revision=7, guard=True) == TRANSITIONS[pair]


@pytest.mark.parametrize("pair", ILLEGAL, ids=_id)
def test_illegal_move_raises_with_operation_status_and_revision(
    pair: tuple[NodeStatus | None, Op],
) -> None:
    """A move missing from the table raises IllegalTransition carrying status and revision."""
    status, op = pair
    before = dict(TRANSITIONS)
    with pytest.raises(IllegalTransition) as raised:
        decide(status, op, revision=7, guard=True)
    assert raised.value.code == "illegal-transition"
    assert raised.value.data == {"currentRevision": 7, "status": status}
    assert op.value in str(raised.value)
    assert dict(TRANSITIONS) == before


def test_the_table_covers_statuses_and_operations_exactly() -> None:
    """Every status appears in the table and every key uses a known status and operation."""
    mentioned = {s for s, _ in TRANSITIONS} | set(TRANSITIONS.values())
    assert mentioned == set(ALL_STATUSES)
    assert {op for _, op in TRANSITIONS} == set(Op)


def test_the_table_is_read_only() -> None:
    """Nobody can change the table at run time."""
    with pytest.raises(TypeError):
        TRANSITIONS[(None, Op.EXECUTE)] = "ready"  # type: ignore[index]


def test_prepare_and_adopt_are_the_only_moves_from_absent() -> None:
    """A state comes into existence by Cloudly's prepare, as preparing, or by reconciliation
    adopting what Corestore holds of a restore a salvaged or reset state forgot, as
    cleanup-failed (so only a cleanup leaves it)."""
    assert sources(Op.PREPARE) == {None: "preparing"}
    assert sources(Op.ADOPT) == {None: "cleanup-failed"}
    assert [op for status, op in TRANSITIONS if status is None] == [Op.PREPARE, Op.ADOPT]


def test_preparing_settles_to_prepared_or_failed() -> None:
    """Corestore's answer decides where preparing goes."""
    assert decide("preparing", Op.PREPARE_SUCCEEDED, revision=1) == "prepared"
    assert decide("preparing", Op.PREPARE_FAILED, revision=1) == "failed"


def test_stage_is_allowed_again_while_staging() -> None:
    """Further objects may be staged while staging."""
    assert decide("staging", Op.STAGE, revision=3) == "staging"


@pytest.mark.parametrize("status", ["prepared", "staging"])
def test_execute_before_staging_completes_is_illegal(status: NodeStatus) -> None:
    """Execute needs every manifest object written (from prepared: an empty manifest)."""
    with pytest.raises(IllegalTransition) as raised:
        decide(status, Op.EXECUTE, revision=4, guard=False)
    assert raised.value.data == {"currentRevision": 4, "status": status}


@pytest.mark.parametrize("status", ["prepared", "staging"])
def test_execute_once_staging_is_complete_starts_restoring(status: NodeStatus) -> None:
    """With every object written, execute moves to restoring."""
    assert decide(status, Op.EXECUTE, revision=4, guard=True) == "restoring"


def test_only_execute_and_the_resumes_are_guarded() -> None:
    """The staging guard applies to the two execute moves, the retryable-failure guard to the
    two resumes, and nothing else is guarded."""
    assert RESTORE_TABLE.guarded == {
        ("prepared", Op.EXECUTE),
        ("staging", Op.EXECUTE),
        ("failed", Op.RESUME_PREPARE),
        ("failed", Op.RESUME_EXECUTE),
    }


def test_a_failed_restore_resumes_only_when_its_failure_may_pass() -> None:
    """`resume-execute` moves `failed` back to `restoring` with the guard, and is illegal
    without it (a failure that will not pass stays `failed`)."""
    assert RESTORE_TABLE.decide("failed", Op.RESUME_EXECUTE, revision=7, guard=True) == (
        "restoring"
    )
    assert RESTORE_TABLE.decide("failed", Op.RESUME_PREPARE, revision=2, guard=True) == (
        "preparing"
    )
    with pytest.raises(IllegalTransition):
        RESTORE_TABLE.decide("failed", Op.RESUME_EXECUTE, revision=7, guard=False)


def test_cleanup_is_allowed_exactly_from_the_settled_statuses() -> None:
    """Cleanup starts from prepared, staging, ready, failed and cleanup-failed (a retry)."""
    assert sources(Op.CLEANUP) == dict.fromkeys(
        ["prepared", "staging", "ready", "failed", "cleanup-failed"], "cleaning"
    )


def test_cleaned_is_the_only_terminal_status() -> None:
    """No operation leaves cleaned, and every other status has a way out."""
    assert frozenset({"cleaned"}) == TERMINAL


def test_every_status_can_still_reach_cleaned() -> None:
    """Whatever happens, a state can always be cleaned up (no dead ends)."""
    for start in ALL_STATUSES:
        seen: set[NodeStatus | None] = {start}
        queue: deque[NodeStatus | None] = deque([start])
        while queue:
            current = queue.popleft()
            for (status, _), to in TRANSITIONS.items():
                if status == current and to not in seen:
                    seen.add(to)
                    queue.append(to)
        assert "cleaned" in seen, start


def test_in_flight_statuses_are_those_only_the_engine_leaves() -> None:
    """IN_FLIGHT statuses are left by no Cloudly request, and each can be settled."""
    requests = {Op.PREPARE, Op.STAGE, Op.EXECUTE, Op.CLEANUP}
    for status in IN_FLIGHT:
        assert not any(s == status and op in requests for s, op in TRANSITIONS)
        assert any(s == status and op.value.endswith("-failed") for s, op in TRANSITIONS)
    assert frozenset({"preparing", "restoring", "verifying", "cleaning"}) == IN_FLIGHT


def test_progress_never_changes_the_status() -> None:
    """Progress writes are self-loops (they exist to advance the revision)."""
    assert all(source == to for source, to in sources(Op.PROGRESS).items())


def test_module_docstring_lists_every_move_of_the_table() -> None:
    """The table in the module docstring is the table in the code."""
    doc = machine.__doc__ or ""
    rows = re.findall(r"^    (\S+)\s+([a-z-]+)\s+([a-z-]+)\b", doc, flags=re.MULTILINE)
    documented = {
        (None if source == "(absent)" else source, Op(op), to)
        for source, op, to in rows
        if op in {o.value for o in Op}
    }
    assert documented == {(s, op, to) for (s, op), to in TRANSITIONS.items()}


def test_docs_embed_the_rendered_table() -> None:
    """docs/isolated-restore.md shows the table exactly as the code renders it."""
    assert RESTORE_TABLE.render() in DOCS.read_text(encoding="utf-8")
