"""ProgressPace: at most one progress line per interval, the final one always."""

from __future__ import annotations

from agent.transfers.progress import ProgressPace


def test_reports_within_the_interval_are_not_due() -> None:
    """After a report, the next is due only once `interval` has passed."""
    pace = ProgressPace(5.0, last=0.0)
    assert [pace.due(now) for now in (1.0, 4.9, 5.0, 9.9, 10.0)] == [
        False,
        False,
        True,
        False,
        True,
    ]


def test_the_final_report_is_always_due() -> None:
    """`final` is due however soon it comes, and counts as the latest report."""
    pace = ProgressPace(5.0, last=0.0)
    assert pace.due(0.1, final=True)
    assert not pace.due(5.0)
    assert pace.due(5.1)


def test_where_the_pace_starts_decides_the_first_report() -> None:
    """Started `interval` ago, a report is due at once; started now, only after `interval`."""
    assert ProgressPace(5.0, last=100.0 - 5.0).due(100.0)
    assert not ProgressPace(5.0, last=100.0).due(100.0)


def test_a_zero_interval_makes_every_report_due() -> None:
    """`progress_interval = 0` logs every chunk."""
    pace = ProgressPace(0.0, last=7.0)
    assert all(pace.due(7.0) for _ in range(3))
