"""Where a restore run's answer went, from what the agent knows, and whether Cloudly holds it."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.domain.answer_fate import HELD, AnswerFate, answer_fate, render_fates

DOCS = Path(__file__).resolve().parents[2] / "docs" / "relay.md"


@pytest.mark.parametrize(
    ("confirmed", "given_on", "connection", "fate"),
    [
        (True, {1}, 2, AnswerFate.CONFIRMED),
        (True, None, 1, AnswerFate.CONFIRMED),  # recorded delivered by an earlier process
        (False, {1, 3}, 3, AnswerFate.ON_THIS_CONNECTION),
        (False, {1, 2}, 3, AnswerFate.LOST_WITH_CONNECTION),
        (False, set(), 3, AnswerFate.NEVER_GIVEN),
        (False, None, 1, AnswerFate.UNCONFIRMED_BEFORE_RESTART),
    ],
)
def test_the_fate_is_named_from_the_confirmation_then_the_connections(
    confirmed: bool, given_on: set[int] | None, connection: int, fate: AnswerFate
) -> None:
    """A confirmation decides first; then whether the answer went on this very connection."""
    assert answer_fate(confirmed=confirmed, given_on=given_on, connection=connection) is fate


def test_cloudly_holds_exactly_a_confirmed_answer_or_one_on_the_live_connection() -> None:
    """The only answers counted held are those a pong confirmed and those on the connection
    the request arrives on: nothing rests on when a pong came."""
    held = {fate for fate, holds in HELD.items() if holds}
    assert held == {AnswerFate.CONFIRMED, AnswerFate.ON_THIS_CONNECTION}
    assert set(HELD) == set(AnswerFate)


def test_docs_embed_the_rendered_fates() -> None:
    """docs/relay.md shows the fates exactly as the code renders them."""
    assert render_fates() in DOCS.read_text(encoding="utf-8")
