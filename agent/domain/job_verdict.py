"""The verdict on a relay request, from plain facts (pure).

The runner gathers what a request finds (`JobFacts`: the work of its scope running in this
process, the job of its key or its service's last run as recorded, whether the identical request
made it, whether that run kept a plan, where its answer went) and `job_verdict(facts)` says what
it meets, what it gets and why (`Verdict`), by the request rule of `agent.domain.job_machine`
(`REQUESTS`) and the fate of an answer (`agent.domain.answer_fate`, `HELD`). Nothing here reads
the store or the answers given: the runner's lock makes the facts current, this only decides.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.domain.answer_fate import HELD, AnswerFate
from agent.domain.job_machine import (
    Answer,
    JobKind,
    JobStatus,
    Meets,
    answer,
    backup_meets,
    restore_meets,
)
from agent.errors import InvalidState

__all__ = ["JobFacts", "Verdict", "job_verdict"]


@dataclass(frozen=True, slots=True)
class JobFacts:
    """What a request of `kind` finds, as the runner gathered it under the scope's lock."""

    kind: JobKind
    live: bool | None = None
    """Work of the request's scope runs in this process: whether the identical request (same
    backup, same body) made it; None: none runs."""
    last: JobStatus | None = None
    """The status of the job of its key (a backup) or of its service's last run (a restore, a
    run left `running` already reconciled); None: there is none (or it was not read)."""
    same_body: bool = False
    """Whether `last` was made by the identical request (same backup, same body)."""
    planned: bool = True
    """Whether `last` kept a plan to run it again by (an older agent kept none)."""
    fate: AnswerFate | None = None
    """Where the answer of `last` went, when it ended (read for a restore only)."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the request meets, what it gets, and why (where the answer of the run it meets
    went, when that was judged; else what it met)."""

    meets: Meets
    answer: Answer
    reason: str


def job_verdict(facts: JobFacts) -> Verdict:
    """The verdict on a request that found `facts` (module docstring); `InvalidState` when the
    fate of an ended run it must judge is missing (a bug of the gatherer)."""
    if facts.kind == "backup":
        meets = backup_meets(facts.last, same_body=facts.same_body, here=facts.live is not None)
        return _of("backup", meets)
    if facts.live is not None:
        return _of("restore", restore_meets(here=True, last=None, same_body=facts.live, held=False))
    # A run that did not succeed is run again by its plan: one kept none (an older agent) is
    # nothing to run again, so the request counts as another body's.
    same = (
        facts.last is not None and facts.same_body and (facts.last == "succeeded" or facts.planned)
    )
    if not same or facts.last == "running":
        meets = restore_meets(here=False, last=facts.last, same_body=same, held=False)
        return _of("restore", meets)
    if facts.fate is None:
        raise InvalidState("an ended restore run met by the identical request needs its fate")
    meets = restore_meets(here=False, last=facts.last, same_body=True, held=HELD[facts.fate])
    return _of("restore", meets, reason=facts.fate.value)


def _of(kind: JobKind, meets: Meets, *, reason: str | None = None) -> Verdict:
    """The request rule's answer to what `kind` meets (`reason` defaults to what it met)."""
    return Verdict(meets, answer(kind, meets), reason or meets.value)
