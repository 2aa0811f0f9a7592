"""What the checks read out of the repository (pure): the README's install steps and the
edits a test node makes to the configuration the README installs.

`install_steps(readme)` cuts the first shell block under "## Install on a node" into its
numbered steps (`# 1. ...` starts step 1), so the checks run exactly what the README says and
a README change is tested as written. `set_keys(toml, {(section, key): value})` replaces the
value of keys that are set in the text (a key the text does not set is an error, so an edit
never silently misses). `sh_blocks(text, heading)` is every ```sh block of the section under
`heading` (down to the next heading of its level or above), so the checks run a runbook or a
day-two page as written.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

__all__ = ["INSTALL_HEADING", "Step", "install_steps", "set_keys", "sh_blocks"]

INSTALL_HEADING: Final = "## Install on a node"
_STEP: Final = re.compile(r"^# (\d+)\. (.*)$")


@dataclass(frozen=True, slots=True)
class Step:
    """One numbered step of the install block: its number, its first comment line, its shell
    text (comments included)."""

    number: int
    title: str
    script: str


def install_steps(readme: str) -> list[Step]:
    """The numbered steps of the first ```sh block under the install heading."""
    heading = re.search(rf"^{re.escape(INSTALL_HEADING)}$", readme, re.MULTILINE)
    if heading is None:
        raise ValueError(f"the README has no {INSTALL_HEADING!r} section")
    section = readme[heading.end() :].split("\n## ", 1)[0]
    block = re.search(r"^```sh\n(.*?)^```$", section, re.MULTILINE | re.DOTALL)
    if block is None:
        raise ValueError(f"{INSTALL_HEADING!r} has no ```sh block")
    steps: list[Step] = []
    lines: list[str] = []
    for line in block.group(1).splitlines():
        match = _STEP.match(line)
        if match is not None:
            if steps:
                steps[-1] = Step(steps[-1].number, steps[-1].title, "\n".join(lines) + "\n")
            steps.append(Step(int(match.group(1)), match.group(2).strip(), ""))
            lines = []
        if not steps:
            raise ValueError("the install block does not start with a numbered step")
        lines.append(line)
    if not steps:
        raise ValueError("the install block is empty")
    steps[-1] = Step(steps[-1].number, steps[-1].title, "\n".join(lines) + "\n")
    return steps


def set_keys(text: str, values: Mapping[tuple[str, str], str]) -> str:
    """`text` with each `(section, key)` set to `value` (TOML, written as given)."""
    lines = text.splitlines(keepends=True)
    for (section, key), value in values.items():
        lines[_key_line(lines, section, key)] = f"{key} = {value}\n"
    return "".join(lines)


def _key_line(lines: list[str], section: str, key: str) -> int:
    current = ""
    for number, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith("["):
            current = stripped.strip("[]").strip()
        elif current == section and re.match(rf"{re.escape(key)}\s*=", stripped):
            return number
    raise ValueError(f"[{section}] {key} is not set in the configuration")


def sh_blocks(text: str, heading: str) -> list[str]:
    """The ```sh blocks of the section `heading` (a whole heading line, `#` marks included)."""
    found = re.search(rf"^{re.escape(heading)}$", text, re.MULTILINE)
    if found is None:
        raise ValueError(f"no {heading!r} section")
    level = len(heading) - len(heading.lstrip("#"))
    lines, fenced = [], False
    for line in text[found.end() :].splitlines(keepends=True):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(rf"#{{1,{level}}} ", line):
            break  # a heading (a shell comment inside a block is none)
        lines.append(line)
    section = "".join(lines)
    blocks = re.findall(r"^```sh\n(.*?)^```$", section, re.MULTILINE | re.DOTALL)
    if not blocks:
        raise ValueError(f"{heading!r} has no ```sh block")
    return blocks
