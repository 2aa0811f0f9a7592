"""The relay job transition table: every status (and absent) against every operation."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from agent.errors import IllegalTransition
from agent.relay.machine import JOB_STATUSES, TRANSITIONS, JobOp, JobStatus, decide, render_table

DOCS = Path(__file__).resolve().parents[2] / "docs" / "relay.md"
EVERY_PAIR = list(itertools.product((None, *JOB_STATUSES), JobOp))


def _id(pair: tuple[JobStatus | None, JobOp]) -> str:
    return f"{pair[0] or 'absent'}-{pair[1].value}"


@pytest.mark.parametrize("pair", [p for p in EVERY_PAIR if p in TRANSITIONS], ids=_id)
def test_a_legal_move_answers_the_tables_status(pair: tuple[JobStatus | None, JobOp]) -> None:
    """`decide` answers the status the table names."""
    status, op = pair
    assert decide(status, op, revision=3) == TRANSITIONS[pair]


@pytest.mark.parametrize("pair", [p for p in EVERY_PAIR if p not in TRANSITIONS], ids=_id)
def test_an_illegal_move_raises_with_the_current_revision(
    pair: tuple[JobStatus | None, JobOp],
) -> None:
    """Every move the table does not list is `illegal-transition`, naming status and revision."""
    status, op = pair
    with pytest.raises(IllegalTransition) as raised:
        decide(status, op, revision=3)
    assert raised.value.data == {"currentRevision": 3, "status": status}


def test_succeeded_is_the_only_terminal_status() -> None:
    """No operation leaves `succeeded`; `failed` and `running` can be re-run."""
    leaving = {source for source, _ in TRANSITIONS}
    assert set(JOB_STATUSES) - leaving == {"succeeded"}


def test_docs_embed_the_rendered_table() -> None:
    """docs/relay.md shows the table exactly as the code renders it."""
    assert render_table() in DOCS.read_text(encoding="utf-8")
