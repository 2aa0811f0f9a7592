"""The relay job tables: the transitions (every status, and absent, against every operation)
and the rule that answers a request by what it meets."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from agent.domain.job_machine import (
    JOB_KINDS,
    JOB_STATUSES,
    JOB_TABLE,
    REQUESTS,
    Answer,
    JobKind,
    JobOp,
    JobStatus,
    Meets,
    answer,
    backup_meets,
    render_requests,
    restore_meets,
)
from agent.errors import IllegalTransition, InvalidState

TRANSITIONS = JOB_TABLE.moves
decide = JOB_TABLE.decide

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
    assert JOB_TABLE.render() in DOCS.read_text(encoding="utf-8")


# --- the request rule ---------------------------------------------------------------------------


def test_docs_embed_the_rendered_request_rule() -> None:
    """docs/relay.md shows the request rule exactly as the code renders it."""
    assert render_requests() in DOCS.read_text(encoding="utf-8")


@pytest.mark.parametrize(
    ("status", "same_body", "here", "meets"),
    [
        (None, True, False, Meets.NOTHING),
        ("running", False, True, Meets.OTHER_BODY),
        ("succeeded", False, False, Meets.OTHER_BODY),
        ("running", True, True, Meets.RUNNING_SAME),
        ("running", True, False, Meets.UNOWNED),
        ("succeeded", True, False, Meets.SUCCEEDED),
        ("failed", True, False, Meets.FAILED),
    ],
)
def test_a_backup_meets_the_job_of_its_key(
    status: JobStatus | None, same_body: bool, here: bool, meets: Meets
) -> None:
    """Another body is seen before anything else; then where the job's work runs, its status."""
    assert backup_meets(status, same_body=same_body, here=here) is meets


@pytest.mark.parametrize(
    ("here", "last", "same_body", "held", "meets"),
    [
        (True, None, True, False, Meets.RUNNING_SAME),
        (True, None, False, False, Meets.RUNNING_OTHER),
        (False, None, False, False, Meets.NOTHING),
        (False, "running", True, False, Meets.UNOWNED),
        (False, "running", False, False, Meets.UNOWNED_OTHER),
        (False, "succeeded", True, False, Meets.UNANSWERED_SUCCEEDED),
        (False, "failed", True, False, Meets.UNANSWERED_FAILED),
        (False, "succeeded", True, True, Meets.ANSWERED),
        (False, "failed", True, True, Meets.ANSWERED),
        (False, "succeeded", False, False, Meets.ANSWERED),
        (False, "failed", False, True, Meets.ANSWERED),
    ],
)
def test_a_restore_meets_the_run_that_works_now_else_the_services_last_run(
    here: bool, last: JobStatus | None, same_body: bool, held: bool, meets: Meets
) -> None:
    """Work running here comes first; then the last run: left running, or ended with Cloudly
    holding its answer, or not (then by how it ended)."""
    assert restore_meets(here=here, last=last, same_body=same_body, held=held) is meets


def test_a_restore_is_answered_from_its_record_only_for_a_success_whose_answer_may_be_lost() -> (
    None
):
    """The one recorded answer a restore gets is that of an identical last run that succeeded
    while Cloudly may not hold its answer; a failure then runs again under its keys (`retry`);
    an answer Cloudly holds, or another body, runs anew; a restore is never a `job-conflict`,
    and a run left by a stopped agent is resumed only by the same body."""
    restore = {meets: to for (kind, meets), to in REQUESTS.items() if kind == "restore"}
    recorded = [meets for meets, to in restore.items() if to is Answer.RECORDED]
    assert recorded == [Meets.UNANSWERED_SUCCEEDED]
    assert restore[Meets.UNANSWERED_FAILED] is Answer.RETRY
    assert restore[Meets.ANSWERED] is Answer.START
    assert [meets for meets, to in restore.items() if to is Answer.RESUME] == [Meets.UNOWNED]
    assert Answer.CONFLICT not in restore.values()


def test_a_backup_is_never_busy() -> None:
    """One backupId is one backup: its repeats are answered by its own job, never `busy`."""
    answers = {to for (kind, _), to in REQUESTS.items() if kind == "backup"}
    assert Answer.BUSY not in answers


@pytest.mark.parametrize(
    "pair",
    [(kind, meets) for kind in JOB_KINDS for meets in Meets if (kind, meets) not in REQUESTS],
    ids=lambda pair: f"{pair[0]}-{pair[1].value}",
)
def test_a_situation_a_kind_cannot_meet_is_a_bug(pair: tuple[JobKind, Meets]) -> None:
    """`answer` refuses what the table does not list instead of guessing."""
    with pytest.raises(InvalidState):
        answer(*pair)
