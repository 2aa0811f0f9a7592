"""`AnswerBook`: where a service's last restore run's answer went, as the runner noted it."""

from __future__ import annotations

from agent.domain.answer_fate import AnswerFate
from agent.domain.jobs import JobKey, StoredJob
from agent.domain.outcomes import Succeeded
from agent.relay.answers import AnswerBook

RUN_1 = JobKey("cluster-1", "node-1", "restore", "bk-1", "svc-1", 1)
RUN_2 = RUN_1.numbered(2)


def _recorded(key: JobKey, revision: int = 2, delivered_at: int | None = None) -> StoredJob:
    return StoredJob(
        key, revision, "succeeded", "a" * 64, Succeeded({}), 1, 0, 0, delivered_at=delivered_at
    )


def test_an_answer_given_on_a_connection_is_held_for_a_request_on_it() -> None:
    book = AnswerBook()
    book.given(RUN_1, 2, connection=3)
    assert book.fate(_recorded(RUN_1), 3) is AnswerFate.ON_THIS_CONNECTION
    assert book.fate(_recorded(RUN_1), 4) is AnswerFate.LOST_WITH_CONNECTION


def test_a_run_that_ended_here_with_nobody_given_its_answer_is_never_given() -> None:
    book = AnswerBook()
    book.ended(RUN_1, 2)
    assert book.fate(_recorded(RUN_1), 1) is AnswerFate.NEVER_GIVEN


def test_a_confirmation_holds_on_every_later_connection() -> None:
    book = AnswerBook()
    book.given(RUN_1, 2, connection=1)
    book.confirmed(RUN_1, 2)
    assert book.fate(_recorded(RUN_1), 5) is AnswerFate.CONFIRMED


def test_a_run_this_process_never_heard_of_is_judged_by_the_store() -> None:
    """An earlier process's run: confirmed only if the store recorded its delivery."""
    book = AnswerBook()
    assert book.fate(_recorded(RUN_1), 1) is AnswerFate.UNCONFIRMED_BEFORE_RESTART
    assert book.fate(_recorded(RUN_1, delivered_at=7), 1) is AnswerFate.CONFIRMED


def test_a_note_about_an_older_run_changes_nothing() -> None:
    """A late joiner of run 1 handed its answer after run 2 ended: run 2's entry stands."""
    book = AnswerBook()
    book.ended(RUN_2, 2)
    book.given(RUN_1, 2, connection=1)
    book.confirmed(RUN_1, 2)
    assert book.fate(_recorded(RUN_2), 1) is AnswerFate.NEVER_GIVEN


def test_the_same_run_at_a_later_revision_starts_afresh() -> None:
    """A failed run run again under its keys ends at a new revision: its new answer has gone
    nowhere yet, whatever the old one did."""
    book = AnswerBook()
    book.given(RUN_1, 2, connection=1)
    book.confirmed(RUN_1, 2)
    book.ended(RUN_1, 4)
    assert book.fate(_recorded(RUN_1, revision=4), 1) is AnswerFate.NEVER_GIVEN
