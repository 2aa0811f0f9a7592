"""`TransitionTable`: one state machine as data, the type both of the agent's machines use.

A table maps `(status, operation)` to the next status; `None` as the status is "no record yet"
(revision 0). Anything the table does not list is illegal: `decide()` raises
`IllegalTransition` and changes nothing. Some moves may be *guarded*: legal only when a fact
only the caller knows holds (the isolated restore's "staging complete", "the failure is
retryable"), passed in as `guard`; each guarded move names its fact in the rendered table.

The same table is read three ways: in Python before any work (`decide`), in SQL by the store's
compare-and-swap (`sources`, turned into a `CASE` by `agent/store/transitions.py`), and as
Markdown in the docs (`render`, embedded and checked by a test).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Generic, TypeVar

from agent.errors import IllegalTransition

__all__ = ["TransitionTable"]

S = TypeVar("S", bound=str)  # a status
Op = TypeVar("Op", bound=enum.StrEnum)  # an operation


class TransitionTable(Generic[S, Op]):
    """`(status or None, operation) -> status`, in the order written; read-only."""

    def __init__(
        self,
        moves: Mapping[tuple[S | None, Op], S],
        *,
        guards: Mapping[tuple[S | None, Op], str] | None = None,
    ) -> None:
        """`guards` maps each move legal only when the caller's fact holds to the name of that
        fact (the rendered table shows it)."""
        self.moves: Mapping[tuple[S | None, Op], S] = MappingProxyType(dict(moves))
        """The table itself."""
        self._guards: Mapping[tuple[S | None, Op], str] = MappingProxyType(dict(guards or {}))
        self.guarded: frozenset[tuple[S | None, Op]] = frozenset(self._guards)
        """The moves that need their guard."""
        unknown = self.guarded - self.moves.keys()
        if unknown:
            raise ValueError(f"guarded moves missing from the table: {sorted(map(str, unknown))}")

    def target(self, status: S | None, op: Op, *, revision: int) -> S:
        """The table's answer for `op` in `status`, ignoring guards; `IllegalTransition` if none.

        `revision` is the record's current revision (0 when absent); it only travels in the
        error."""
        to = self.moves.get((status, op))
        if to is None:
            raise IllegalTransition(operation=op.value, status=status, current=revision)
        return to

    def decide(self, status: S | None, op: Op, *, revision: int, guard: bool = False) -> S:
        """The status `op` moves a record in `status` to, or `IllegalTransition` (nothing
        changes). `guard` is the caller's fact; it matters only for the guarded moves."""
        to = self.target(status, op, revision=revision)
        if (status, op) in self.guarded and not guard:
            raise IllegalTransition(operation=op.value, status=status, current=revision)
        return to

    def sources(self, op: Op) -> dict[S | None, S]:
        """Every status `op` may leave, with where it goes (the store builds its SQL from this)."""
        return {status: to for (status, each), to in self.moves.items() if each is op}

    def terminal(self, statuses: Iterable[S]) -> frozenset[S]:
        """Those of `statuses` no operation leaves."""
        leaving = {status for status, _ in self.moves}
        return frozenset(status for status in statuses if status not in leaving)

    def render(self) -> str:
        """The table as Markdown rows, in table order (the docs embed exactly this)."""
        lines = ["| from | operation | to |", "|---|---|---|"]
        for (status, op), to in self.moves.items():
            name = self._guards.get((status, op))
            guard = f" ({name})" if name is not None else ""
            lines.append(f"| {status or '(absent)'} | `{op.value}`{guard} | {to} |")
        return "\n".join(lines)
