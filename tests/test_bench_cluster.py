"""`bench.cluster`'s own rules: how fairness among the streams moving at once is counted, and
that every command docs/benchmarks.md gives for issue 34 is one the bench takes as written."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from bench.cluster import ROOT, fairness_at_once, parse

BENCHMARKS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
SECTION = "## Cloudly keeps control at any load (issue 34"


def test_streams_moving_together_at_one_rate_are_fair() -> None:
    """Two pairs, one after the other, each pair at its own rate: every stream equals its
    contemporaries, whatever the other pair did."""
    spans = [(0.0, 2.0), (0.0, 2.0), (2.0, 3.0), (2.0, 3.0)]
    assert fairness_at_once(spans, [50.0, 50.0, 100.0, 100.0]) == 1.0


def test_a_stream_slower_than_its_contemporaries_is_the_figure() -> None:
    """The slowest ratio of a stream to the mean of the streams moving with it."""
    spans = [(0.0, 4.0), (0.0, 4.0), (0.0, 4.0), (0.0, 4.0)]
    assert fairness_at_once(spans, [40.0, 80.0, 80.0, 80.0]) == pytest.approx(40.0 / 70.0)


def test_a_short_overlap_does_not_make_streams_contemporaries() -> None:
    """A stream whose span shares less than half of the shorter span is not compared."""
    spans = [(0.0, 10.0), (9.5, 11.5)]
    assert fairness_at_once(spans, [10.0, 100.0]) == 1.0


def _commands() -> list[str]:
    text = BENCHMARKS.read_text()
    section = text[text.index(SECTION) :]
    section = section[: section.find("\n## ", 1)]
    joined = section.replace("\\\n", " ")
    return [
        line.split("#", 1)[0].strip()
        for line in joined.splitlines()
        if line.strip().startswith(".venv/bin/python -m bench.cluster")
    ]


def test_the_issue_34_section_gives_the_curve_and_the_flood_commands() -> None:
    """The section names the bench's commands: the four sizes, the flood, the tree before."""
    commands = _commands()
    assert len(commands) >= 6
    assert any("--flood" in command for command in commands)
    assert any("--agent-root" in command for command in commands)


@pytest.mark.parametrize("command", _commands())
def test_each_command_of_the_section_is_one_the_bench_takes(command: str, tmp_path: Path) -> None:
    """Each command's options, as written (`$BEFORE`: a tree before), parse as the bench's."""
    words = shlex.split(command.replace("$BEFORE", str(tmp_path)))
    args = parse(words[3:])
    assert args.agent_root in (ROOT, tmp_path)
