"""The verdict on a relay request from plain facts: every combination the runner tells apart."""

from __future__ import annotations

import pytest

from agent.domain.answer_fate import AnswerFate
from agent.domain.job_machine import Answer, Meets
from agent.domain.job_verdict import JobFacts, Verdict, job_verdict
from agent.errors import InvalidState

CONFIRMED = AnswerFate.CONFIRMED
HERE = AnswerFate.ON_THIS_CONNECTION
LOST = AnswerFate.LOST_WITH_CONNECTION
NEVER = AnswerFate.NEVER_GIVEN
RESTARTED = AnswerFate.UNCONFIRMED_BEFORE_RESTART

# (facts, what it meets, what it gets, why)
VERDICTS: list[tuple[JobFacts, Meets, Answer, str]] = [
    # A backup: the job of its exact key.
    (JobFacts("backup"), Meets.NOTHING, Answer.START, "nothing"),
    (
        JobFacts("backup", live=True, last="running", same_body=True),
        Meets.RUNNING_SAME,
        Answer.JOIN,
        "running-same",
    ),
    (
        JobFacts("backup", last="running", same_body=True),
        Meets.UNOWNED,
        Answer.RESUME,
        "unowned",
    ),
    (
        JobFacts("backup", last="succeeded", same_body=True),
        Meets.SUCCEEDED,
        Answer.RECORDED,
        "succeeded",
    ),
    (JobFacts("backup", last="failed", same_body=True), Meets.FAILED, Answer.RETRY, "failed"),
    (
        JobFacts("backup", last="failed", same_body=True, planned=False, fate=CONFIRMED),
        Meets.FAILED,
        Answer.RETRY,
        "failed",
    ),
    (
        JobFacts("backup", live=True, last="running"),
        Meets.OTHER_BODY,
        Answer.CONFLICT,
        "other-body",
    ),
    (JobFacts("backup", last="running"), Meets.OTHER_BODY, Answer.CONFLICT, "other-body"),
    (JobFacts("backup", last="succeeded"), Meets.OTHER_BODY, Answer.CONFLICT, "other-body"),
    (JobFacts("backup", last="failed"), Meets.OTHER_BODY, Answer.CONFLICT, "other-body"),
    # A restore: the run of its service working here, whatever its service's last run.
    (JobFacts("restore", live=True), Meets.RUNNING_SAME, Answer.JOIN, "running-same"),
    (JobFacts("restore", live=False), Meets.RUNNING_OTHER, Answer.BUSY, "running-other"),
    (
        JobFacts("restore", live=False, last="succeeded", same_body=True, fate=LOST),
        Meets.RUNNING_OTHER,
        Answer.BUSY,
        "running-other",
    ),
    # Else the service's last run: none.
    (JobFacts("restore"), Meets.NOTHING, Answer.START, "nothing"),
    # Left `running` by a stopped agent (not every effect applied).
    (
        JobFacts("restore", last="running", same_body=True),
        Meets.UNOWNED,
        Answer.RESUME,
        "unowned",
    ),
    (
        JobFacts("restore", last="running", same_body=True, planned=False),
        Meets.UNOWNED_OTHER,
        Answer.START,
        "unowned-other",
    ),
    (JobFacts("restore", last="running"), Meets.UNOWNED_OTHER, Answer.START, "unowned-other"),
    # Ended, for the identical request: judged by where its answer went.
    *(
        (
            JobFacts("restore", last="succeeded", same_body=True, fate=fate),
            Meets.ANSWERED,
            Answer.START,
            fate.value,
        )
        for fate in (CONFIRMED, HERE)
    ),
    *(
        (
            JobFacts("restore", last="succeeded", same_body=True, fate=fate),
            Meets.UNANSWERED_SUCCEEDED,
            Answer.RECORDED,
            fate.value,
        )
        for fate in (LOST, NEVER, RESTARTED)
    ),
    (
        JobFacts("restore", last="succeeded", same_body=True, planned=False, fate=NEVER),
        Meets.UNANSWERED_SUCCEEDED,
        Answer.RECORDED,
        NEVER.value,
    ),
    *(
        (
            JobFacts("restore", last="failed", same_body=True, fate=fate),
            Meets.ANSWERED,
            Answer.START,
            fate.value,
        )
        for fate in (CONFIRMED, HERE)
    ),
    *(
        (
            JobFacts("restore", last="failed", same_body=True, fate=fate),
            Meets.UNANSWERED_FAILED,
            Answer.RETRY,
            fate.value,
        )
        for fate in (LOST, NEVER, RESTARTED)
    ),
    # A failed run that kept no plan is nothing to run again: as another body's, not judged.
    (
        JobFacts("restore", last="failed", same_body=True, planned=False, fate=LOST),
        Meets.ANSWERED,
        Answer.START,
        "answered",
    ),
    # Ended, for another body: a new run, whatever became of its answer.
    (JobFacts("restore", last="succeeded", fate=LOST), Meets.ANSWERED, Answer.START, "answered"),
    (JobFacts("restore", last="failed", fate=NEVER), Meets.ANSWERED, Answer.START, "answered"),
]


@pytest.mark.parametrize(("facts", "meets", "gets", "reason"), VERDICTS)
def test_each_combination_of_facts_gets_its_verdict(
    facts: JobFacts, meets: Meets, gets: Answer, reason: str
) -> None:
    """What the request meets, what it gets and why, for every case the rule tells apart."""
    assert job_verdict(facts) == Verdict(meets, gets, reason)


def test_an_ended_run_judged_without_its_fate_is_a_bug() -> None:
    """The identical request meeting its service's ended run needs where that answer went."""
    with pytest.raises(InvalidState, match="needs its fate"):
        job_verdict(JobFacts("restore", last="succeeded", same_body=True))
