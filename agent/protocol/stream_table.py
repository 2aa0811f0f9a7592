"""`StreamTable`: the life of one VirtualStream machine as data, `(state, event) -> state`.

The same shape as `agent/domain/table.py` (the protocol imports nothing of the domain): one
table per machine (`stream_initiator.INITIATOR_TABLE`, `stream_responder.RESPONDER_TABLE`),
read by the machine before it moves (`next`, `allows`) and rendered into docs/wire-notes.md
(`render`, checked by a test). A move the table does not list is illegal: `next` raises
`InvalidState` and the machine changes nothing. What a stream carries besides its state (its
queues, the cycles it has in flight, the reads it parked) is data, not flags.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Generic, TypeVar

from agent.errors import InvalidState

__all__ = ["StreamTable"]

S = TypeVar("S", bound=enum.Enum)  # a state
E = TypeVar("E", bound=enum.Enum)  # an event


class StreamTable(Generic[S, E]):
    """`(state, event) -> state`, in the order written, each move with a note; read-only."""

    def __init__(self, moves: Mapping[tuple[S, E], tuple[S, str]]) -> None:
        """`moves` maps each legal `(state, event)` to `(next state, why it happens)`."""
        self.moves: Mapping[tuple[S, E], S] = MappingProxyType(
            {move: to for move, (to, _) in moves.items()}
        )
        """The table itself."""
        self._notes = {move: note for move, (_, note) in moves.items()}

    def allows(self, state: S, event: E) -> bool:
        """Whether `event` moves a stream in `state` at all."""
        return (state, event) in self.moves

    def next(self, state: S, event: E, *, stream_id: str = "") -> S:
        """Where `event` moves a stream in `state`; `InvalidState` (nothing changes) if nowhere."""
        to = self.moves.get((state, event))
        if to is None:
            raise InvalidState(f"stream {stream_id}: {event.value} is illegal in {state.value}")
        return to

    def final(self, states: Iterable[S]) -> frozenset[S]:
        """Those of `states` no event leaves."""
        leaving = {state for state, _ in self.moves}
        return frozenset(state for state in states if state not in leaving)

    def render(self) -> str:
        """The table as Markdown rows, in table order (the docs embed exactly this)."""
        lines = ["| from | event | to | when |", "|---|---|---|---|"]
        for (state, event), to in self.moves.items():
            note = self._notes[(state, event)]
            lines.append(f"| {state.value} | `{event.value}` | {to.value} | {note} |")
        return "\n".join(lines)
