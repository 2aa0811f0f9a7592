"""The one table type (`agent.table.TransitionTable`): what it refuses to be built from, how
it refuses a move, and how it renders."""

from __future__ import annotations

import enum

import pytest

from agent.errors import IllegalTransition, InvalidState
from agent.table import TransitionTable


class Light(enum.StrEnum):
    OFF = "off"
    ON = "on"


class Flip(enum.StrEnum):
    SWITCH = "switch"
    BREAK = "break"


def test_a_guard_on_a_move_the_table_lacks_is_refused() -> None:
    """A guard names a move of the table, or the table is not built."""
    with pytest.raises(ValueError, match="guarded moves missing"):
        TransitionTable[Light, Flip](
            {(Light.OFF, Flip.SWITCH): Light.ON}, guards={(Light.ON, Flip.SWITCH): "x"}
        )


def test_notes_cover_every_move_or_the_table_is_not_built() -> None:
    """A noted table says when each of its moves happens, and of no other."""
    with pytest.raises(ValueError, match="one note per move"):
        TransitionTable[Light, Flip](
            {(Light.OFF, Flip.SWITCH): Light.ON, (Light.ON, Flip.SWITCH): Light.OFF},
            notes={(Light.OFF, Flip.SWITCH): "dark"},
        )


def test_next_names_the_machine_the_event_and_the_state() -> None:
    """An illegal `next` is `InvalidState` saying whose move it was."""
    table = TransitionTable[Light, Flip]({(Light.OFF, Flip.SWITCH): Light.ON})
    with pytest.raises(InvalidState, match=r"^lamp 2: break is illegal in off$"):
        table.next(Light.OFF, Flip.BREAK, subject="lamp 2")


def test_an_unguarded_decide_of_a_guarded_move_is_refused_with_the_revision() -> None:
    """Without the caller's fact a guarded move is `illegal-transition`; with it, it moves."""
    table = TransitionTable[Light, Flip](
        {(Light.OFF, Flip.SWITCH): Light.ON}, guards={(Light.OFF, Flip.SWITCH): "powered"}
    )
    with pytest.raises(IllegalTransition) as refused:
        table.decide(Light.OFF, Flip.SWITCH, revision=4)
    assert refused.value.data == {"currentRevision": 4, "status": "off"}
    assert table.decide(Light.OFF, Flip.SWITCH, revision=4, guard=True) is Light.ON


def test_render_writes_absent_guards_and_notes() -> None:
    """No record is `(absent)`, a guard follows its event, a note is its own column."""
    guarded = TransitionTable[Light, Flip](
        {(None, Flip.SWITCH): Light.ON}, guards={(None, Flip.SWITCH): "powered"}, column="operation"
    )
    noted = TransitionTable[Light, Flip].noted(
        {(Light.ON, Flip.BREAK): (Light.OFF, "the bulb went")}
    )
    assert guarded.render() == (
        "| from | operation | to |\n|---|---|---|\n| (absent) | `switch` (powered) | on |"
    )
    assert noted.render() == (
        "| from | event | to | when |\n|---|---|---|---|\n| on | `break` | off | the bulb went |"
    )
