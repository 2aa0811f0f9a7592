"""Every `bench.wan` command docs/benchmarks.md gives for the four stages opened at once is one
the bench takes as written."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from bench.wan import ROOT, parse

BENCHMARKS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
SECTION = "### Four stages opened at once"


def _commands() -> list[str]:
    text = BENCHMARKS.read_text()
    section = text[text.index(SECTION) :]
    end = section.find("\n## ", 1)
    section = section if end < 0 else section[:end]
    joined = section.replace("\\\n", " ")
    return [
        line.split("#", 1)[0].strip()
        for line in joined.splitlines()
        if line.strip().startswith(".venv/bin/python -m bench.wan")
    ]


def test_the_section_gives_its_commands_with_the_trees_before() -> None:
    commands = _commands()
    assert len(commands) >= 4
    assert any("--checkout" in command for command in commands)


@pytest.mark.parametrize("command", _commands())
def test_each_command_of_the_section_is_one_the_bench_takes(command: str, tmp_path: Path) -> None:
    """Each command's options, as written (`$BEFORE`: a tree before), parse as the bench's."""
    words = shlex.split(command.replace("$BEFORE", str(tmp_path)))
    args = parse(words[3:])
    assert args.checkout in (ROOT, tmp_path)
