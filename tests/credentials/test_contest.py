"""A second agent with the same machine token: the agent's recipient retired again and again
soon after it enrolled is said once (an error line, the observer's `duplicate-agent`), and the
contest ends once periodic checks find the recipient enrolled (agent/credentials/contest.py)."""

from __future__ import annotations

import pytest
import structlog

from agent.credentials.contest import CLEAR_AFTER, WINDOW_S, Contest, RecipientWatch
from tests.clock import ManualClock


class Heard:
    """A fake RecipientObserver: what it was told, in order."""

    def __init__(self) -> None:
        self.retired = 0
        self.duplicate: list[str | None] = []

    def recipient_retired(self) -> None:
        self.retired += 1

    def duplicate_agent(self, *, text: str | None) -> None:
        self.duplicate.append(text)


def test_one_retirement_is_no_contest() -> None:
    """A Cloudly that forgot its recipients once: the agent enrolls again, nothing more."""
    assert not Contest().retired(10.0).contested


def test_two_retirements_within_the_window_are_a_contest() -> None:
    assert Contest().retired(10.0).retired(10.0 + WINDOW_S).contested


def test_two_retirements_further_apart_than_the_window_are_no_contest() -> None:
    assert not Contest().retired(10.0).retired(10.0 + WINDOW_S + 1).contested


def test_the_contest_ends_after_enough_confirmations_in_a_row() -> None:
    contest = Contest().retired(1.0).retired(2.0)
    for _ in range(CLEAR_AFTER - 1):
        contest = contest.confirmed()
        assert contest.contested
    assert not contest.confirmed().contested


def test_a_retirement_between_confirmations_starts_the_count_again() -> None:
    contest = Contest().retired(1.0).retired(2.0)
    for _ in range(CLEAR_AFTER - 1):
        contest = contest.confirmed()
    contest = contest.retired(3.0)
    for _ in range(CLEAR_AFTER - 1):
        contest = contest.confirmed()
    assert contest.contested


def test_the_watch_says_a_second_agent_once_at_error(caplog: pytest.LogCaptureFixture) -> None:
    """Three retirements: the observer hears each, and the contest from the second on; one
    error line names the cause and what to do."""
    heard, clock = Heard(), ManualClock(start=0.0)
    watch = RecipientWatch(heard, clock=clock)
    with structlog.testing.capture_logs() as logs:
        for n in range(3):
            watch.retired(f"recipient-{n}")
            clock.advance(15.0)
    errors = [entry for entry in logs if entry["log_level"] == "error"]
    assert [entry["event"] for entry in errors] == ["duplicate_agent_suspected"]
    assert "run one agent per cluster" in errors[0]["error"]
    assert heard.retired == 3
    assert len(heard.duplicate) == 2
    assert all(heard.duplicate)


def test_one_recipient_met_retired_by_several_fetches_is_one_retirement() -> None:
    """Fetches for several nodes (and the periodic check) that meet the same retired recipient
    at once count it once: no second agent is suspected from one retirement."""
    heard, clock = Heard(), ManualClock(start=0.0)
    watch = RecipientWatch(heard, clock=clock)
    for _ in range(3):
        watch.retired("recipient-1")
    assert heard.retired == 1
    assert not watch.contest.contested
    assert heard.duplicate == []


def test_the_watch_says_when_the_other_agent_is_gone() -> None:
    heard, clock = Heard(), ManualClock(start=0.0)
    watch = RecipientWatch(heard, clock=clock)
    watch.retired("recipient-1")
    watch.retired("recipient-2")
    for _ in range(CLEAR_AFTER):
        watch.confirmed()
    assert heard.duplicate[-1] is None
    assert not watch.contest.contested
