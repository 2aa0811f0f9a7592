"""`TransitionTable`: one state machine as data, the one table type every machine of the agent uses.

A table maps `(state, event)` to the next state, in the order written; anything it does not
list is illegal, and asking for it raises and changes nothing (the table is read-only and the
machine moves only to what the table answers). Its users:

- the domain's machines (`agent.domain.restore_machine.RESTORE_TABLE`,
  `agent.domain.job_machine.JOB_TABLE`): `None` as the state is "no record yet" (revision 0);
  `decide` refuses a request with `IllegalTransition` (its wire code, the current revision);
  some moves are *guarded*, legal only when a fact only the caller knows holds, passed in as
  `guard`; `sources` is what the store builds its compare-and-swap SQL from;
- the protocol's stream machines (`INITIATOR_TABLE`, `RESPONDER_TABLE`) and the session's
  lifecycle (`agent.session.lifecycle.LIFECYCLE_TABLE`): `next` moves them, an illegal move is
  a bug of the agent's own (`InvalidState`); each move carries a note saying when it happens;
- the session state the status shows (`agent.watch.sessionstate.STATE_TABLE`, whose events are
  the states entered).

The tables the docs show render as Markdown (`render`), embedded there and checked by tests.
The type sits on the ground floor (it imports only the errors) so that the domain, the
protocol, the session and the status share it without importing each other.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Iterable, Mapping
from types import MappingProxyType
from typing import Generic, TypeVar

from agent.errors import IllegalTransition, InvalidState

__all__ = ["TransitionTable"]

S = TypeVar("S", bound=Hashable)  # a state (an enum, or a status string)
E = TypeVar("E", bound=enum.Enum)  # an event (an operation)


def _cell(value: object) -> str:
    """How a state or an event is written in the rendered table."""
    if value is None:
        return "(absent)"
    return str(value.value) if isinstance(value, enum.Enum) else str(value)


def _refused(status: object, op: enum.Enum, revision: int) -> IllegalTransition:
    """A request the table refuses, as the wire sees it (the status, the current revision)."""
    return IllegalTransition(
        operation=_cell(op), status=None if status is None else _cell(status), current=revision
    )


class TransitionTable(Generic[S, E]):
    """`(state or None, event) -> state`, in the order written; read-only."""

    def __init__(
        self,
        moves: Mapping[tuple[S | None, E], S],
        *,
        guards: Mapping[tuple[S | None, E], str] | None = None,
        notes: Mapping[tuple[S | None, E], str] | None = None,
        column: str = "event",
    ) -> None:
        """`guards` maps each move legal only when the caller's fact holds to the name of that
        fact; `notes` says when each move happens (given, it must cover every move); both show
        in the rendered table, whose event column is headed `column`."""
        self.moves: Mapping[tuple[S | None, E], S] = MappingProxyType(dict(moves))
        """The table itself."""
        self._guards: Mapping[tuple[S | None, E], str] = MappingProxyType(dict(guards or {}))
        self.guarded: frozenset[tuple[S | None, E]] = frozenset(self._guards)
        """The moves that need their guard."""
        self._notes: Mapping[tuple[S | None, E], str] | None = (
            None if notes is None else MappingProxyType(dict(notes))
        )
        self._column = column
        unknown = self.guarded - self.moves.keys()
        if unknown:
            raise ValueError(f"guarded moves missing from the table: {sorted(map(str, unknown))}")
        if notes is not None and notes.keys() != self.moves.keys():
            raise ValueError("a noted table needs one note per move, and no other")

    @classmethod
    def noted(
        cls, moves: Mapping[tuple[S | None, E], tuple[S, str]], *, column: str = "event"
    ) -> TransitionTable[S, E]:
        """A table written as `(state, event) -> (next state, when it happens)`."""
        return cls(
            {move: to for move, (to, _) in moves.items()},
            notes={move: note for move, (_, note) in moves.items()},
            column=column,
        )

    def allows(self, state: S | None, event: E) -> bool:
        """Whether `event` moves a machine in `state` at all (guards aside)."""
        return (state, event) in self.moves

    def next(self, state: S, event: E, *, subject: str = "") -> S:
        """Where `event` moves a machine in `state`; `InvalidState` (nothing changes) if
        nowhere. `subject` names the machine in the error ("stream uni_1")."""
        to = self.moves.get((state, event))
        if to is None:
            where = f"{subject}: " if subject else ""
            raise InvalidState(f"{where}{_cell(event)} is illegal in {_cell(state)}")
        return to

    def target(self, status: S | None, op: E, *, revision: int) -> S:
        """The table's answer for `op` in `status`, ignoring guards; `IllegalTransition` if none.

        `revision` is the record's current revision (0 when absent); it only travels in the
        error."""
        to = self.moves.get((status, op))
        if to is None:
            raise _refused(status, op, revision)
        return to

    def decide(self, status: S | None, op: E, *, revision: int, guard: bool = False) -> S:
        """The status `op` moves a record in `status` to, or `IllegalTransition` (nothing
        changes). `guard` is the caller's fact; it matters only for the guarded moves."""
        to = self.target(status, op, revision=revision)
        if (status, op) in self.guarded and not guard:
            raise _refused(status, op, revision)
        return to

    def sources(self, op: E) -> dict[S | None, S]:
        """Every state `op` may leave, with where it goes (the store builds its SQL from this)."""
        return {state: to for (state, each), to in self.moves.items() if each is op}

    def terminal(self, states: Iterable[S]) -> frozenset[S]:
        """Those of `states` no event leaves."""
        leaving = {state for state, _ in self.moves}
        return frozenset(state for state in states if state not in leaving)

    def render(self) -> str:
        """The table as Markdown rows, in table order (the docs embed exactly this)."""
        if self._notes is None:
            lines = [f"| from | {self._column} | to |", "|---|---|---|"]
        else:
            lines = [f"| from | {self._column} | to | when |", "|---|---|---|---|"]
        for move, to in self.moves.items():
            state, event = move
            name = self._guards.get(move)
            guard = f" ({name})" if name is not None else ""
            row = f"| {_cell(state)} | `{_cell(event)}`{guard} | {_cell(to)} |"
            if self._notes is not None:
                row += f" {self._notes[move]} |"
            lines.append(row)
        return "\n".join(lines)
