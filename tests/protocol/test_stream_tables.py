"""The stream machines' tables: what they allow, and the copies docs/wire-notes.md shows."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.errors import InvalidState
from agent.protocol.stream_initiator import INITIATOR_TABLE, InitiatorEvent, InitiatorState
from agent.protocol.stream_responder import RESPONDER_TABLE, ResponderEvent, StreamState

DOCS = Path(__file__).resolve().parents[2] / "docs" / "wire-notes.md"


def test_the_docs_show_both_tables_as_the_code_has_them() -> None:
    """docs/wire-notes.md embeds each table exactly as `render()` writes it."""
    text = DOCS.read_text(encoding="utf-8")
    assert INITIATOR_TABLE.render() in text
    assert RESPONDER_TABLE.render() in text


def test_a_move_the_table_does_not_list_raises() -> None:
    """An illegal move raises `InvalidState`; `allows` says so without raising."""
    assert not INITIATOR_TABLE.allows(InitiatorState.OVER, InitiatorEvent.ARM)
    with pytest.raises(InvalidState, match="stream s1: arm is illegal in over"):
        INITIATOR_TABLE.next(InitiatorState.OVER, InitiatorEvent.ARM, subject="stream s1")


def test_only_over_is_final_for_a_stream_we_drive() -> None:
    """Every stream we drive ends OVER: the farewell is always said."""
    assert INITIATOR_TABLE.terminal(InitiatorState) == {InitiatorState.OVER}


def test_ended_and_broken_are_final_for_a_stream_we_answer_for() -> None:
    """A stream we answer for stays ENDED or BROKEN once there."""
    assert RESPONDER_TABLE.terminal(StreamState) == {StreamState.ENDED, StreamState.BROKEN}


def test_every_live_responder_state_can_break() -> None:
    """Whatever a live stream we answer for is doing, a break is legal."""
    live = set(StreamState) - {StreamState.ENDED, StreamState.BROKEN}
    assert all(RESPONDER_TABLE.allows(state, ResponderEvent.BREAK) for state in live)
