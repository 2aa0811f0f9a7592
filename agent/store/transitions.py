"""A transition table's moves as SQL, for the compare-and-swap `UPDATE`s of both tables.

`status_moves(table, op)` gives the `CASE status WHEN .. THEN .. END` that moves each status
`op` may leave to its target, the `IN (..)` list of those statuses for the `WHERE`, and their
parameters; None when the op starts from nothing only (an `INSERT`, not an `UPDATE`). Both the
isolated-restore states (`node_states.py`, from `RESTORE_TABLE`) and the relay jobs
(`job_table.py`, from `JOB_TABLE`) build their statements with it, so SQLite enforces the same
`agent.table.TransitionTable` the Python side checks.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from agent.table import TransitionTable

__all__ = ["StatusMoves", "status_moves"]


@dataclass(frozen=True, slots=True)
class StatusMoves:
    case: str  # CASE status WHEN :from_0 THEN :to_0 ... END
    allowed: str  # :from_0, :from_1, ...
    params: dict[str, str]


def status_moves(table: TransitionTable[Any, Any], op: enum.StrEnum) -> StatusMoves | None:
    """The SQL of `op`'s moves in `table` from an existing status (`None`, a fresh row, is
    left out)."""
    moves = [(source, to) for source, to in table.sources(op).items() if source is not None]
    if not moves:
        return None
    params: dict[str, str] = {}
    whens: list[str] = []
    for index, (source, to) in enumerate(moves):
        params[f"from_{index}"], params[f"to_{index}"] = source, to
        whens.append(f"WHEN :from_{index} THEN :to_{index}")
    allowed = ", ".join(f":from_{index}" for index in range(len(moves)))
    return StatusMoves(f"CASE status {' '.join(whens)} END", allowed, params)
