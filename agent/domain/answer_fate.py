"""Whether Cloudly holds the answer of a restore run, from facts the agent itself holds (pure).

A restore request carries no restore id (seed 002), so the identical body is either a repeat of
a run whose answer Cloudly never got, or a new restore Cloudly sends knowing the last one's
outcome. The agent tells them apart by where the last run's answer went, never by how fast
Cloudly's websocket happens to read a ping (docs/relay.md, "Jobs and repeats"):

- frames travel in order on one connection, and an answer is lost only when its connection
  ends before it arrives. An answer given on the connection a request now arrives on is not
  lost: the request is not a repeat of a lost answer;
- a pong read after the answer (a ping goes in the same write, and every keepalive ping
  confirms too) proves Cloudly's websocket read it; the store keeps that (`delivered_at`), so
  it survives a restart;
- an answer given only on connections that have ended, unconfirmed, or given to nobody (the
  caller's connection ended while the run worked), or left by an earlier process and never
  recorded delivered, may be lost: the identical request may be its repeat.

`answer_fate(...)` names which of these holds (`AnswerFate`); `HELD[fate]` says whether Cloudly
holds the answer then. `render_fates()` is the table docs/relay.md embeds.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping
from types import MappingProxyType
from typing import Final

__all__ = ["HELD", "AnswerFate", "answer_fate", "render_fates"]


class AnswerFate(enum.StrEnum):
    """Where a restore run's answer went, as the agent knows it."""

    CONFIRMED = "answer-confirmed"
    ON_THIS_CONNECTION = "answer-on-this-connection"
    LOST_WITH_CONNECTION = "answer-lost-with-its-connection"
    NEVER_GIVEN = "answer-never-given"
    UNCONFIRMED_BEFORE_RESTART = "answer-unconfirmed-before-restart"


HELD: Final[Mapping[AnswerFate, bool]] = MappingProxyType(
    {
        AnswerFate.CONFIRMED: True,
        AnswerFate.ON_THIS_CONNECTION: True,
        AnswerFate.LOST_WITH_CONNECTION: False,
        AnswerFate.NEVER_GIVEN: False,
        AnswerFate.UNCONFIRMED_BEFORE_RESTART: False,
    }
)
"""Whether Cloudly holds (or, on a live connection, will hold) the answer."""

_TEXT: Final[Mapping[AnswerFate, str]] = MappingProxyType(
    {
        AnswerFate.CONFIRMED: (
            "a pong read after it confirmed it, on any connection, in this process or (recorded "
            "`delivered_at`) an earlier one"
        ),
        AnswerFate.ON_THIS_CONNECTION: (
            "given on the connection this request arrives on, which is live: frames arrive in "
            "order, so it is not lost"
        ),
        AnswerFate.LOST_WITH_CONNECTION: (
            "given only on connections that ended before a pong confirmed it"
        ),
        AnswerFate.NEVER_GIVEN: (
            "given to nobody: the run ended in this process after its callers' connections ended"
        ),
        AnswerFate.UNCONFIRMED_BEFORE_RESTART: (
            "the run ended in an earlier process, its answer never recorded delivered"
        ),
    }
)


def answer_fate(
    *,
    confirmed: bool,
    given_on: Collection[int] | None,
    connection: int,
) -> AnswerFate:
    """Where the last run's answer went: `confirmed` by a pong (or recorded delivered);
    `given_on` the connections of this process it was handed out on (None: the run ended in an
    earlier process, this one never handed it out); `connection` the one the request arrived on."""
    if confirmed:
        return AnswerFate.CONFIRMED
    if given_on is None:
        return AnswerFate.UNCONFIRMED_BEFORE_RESTART
    if connection in given_on:
        return AnswerFate.ON_THIS_CONNECTION
    if given_on:
        return AnswerFate.LOST_WITH_CONNECTION
    return AnswerFate.NEVER_GIVEN


def render_fates() -> str:
    """Where the answer went, and whether Cloudly holds it, as Markdown (docs/relay.md)."""
    lines = ["| where the last run's answer went | Cloudly holds it |", "|---|---|"]
    for fate, held in HELD.items():
        lines.append(f"| `{fate.value}`: {_TEXT[fate]} | {'yes' if held else 'may not'} |")
    return "\n".join(lines)
