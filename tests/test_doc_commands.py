"""Every command the operator's documents give (the ```sh blocks of readme.md and
docs/operations.md) is one the tools take as written: each `restore-agent` line parses with the
agent's own command line (no --config needed where the unit's is the only sensible one), each
`systemctl` line names the unit with a verb systemctl has, each `journalctl` line reads the
unit. The systemd checks run the runbooks' and the day-two pages' blocks verbatim on a node
(devstack/systemdcheck, docs/operations.md "Tested under a real systemd")."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from agent.entry.cli import _parser

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = (ROOT / "readme.md", ROOT / "docs" / "operations.md")
AGENTS = ("restore-agent", "/opt/restore-agent/venv/bin/restore-agent")
SYSTEMCTL_VERBS = frozenset(
    {"status", "show", "start", "stop", "restart", "enable", "disable", "daemon-reload"}
    | {"reset-failed", "is-active", "edit"}
)


def _commands(path: Path) -> list[list[str]]:
    """Each command of each ```sh block of `path` (continuations joined, comments dropped,
    pipelines and `&&` cut into their commands)."""
    text = path.read_text()
    found = []
    for block in re.findall(r"^```sh\n(.*?)^```$", text, re.MULTILINE | re.DOTALL):
        joined = block.replace("\\\n", " ")
        for line in joined.splitlines():
            words = shlex.split(line, comments=True)
            command: list[str] = []
            for word in [*words, "|"]:
                if word in ("|", "&&", ";"):
                    if command:
                        found.append(command)
                    command = []
                else:
                    command.append(word)
    return found


def _agent_commands() -> list[tuple[str, list[str]]]:
    found = []
    for path in DOCUMENTS:
        for command in _commands(path):
            words = command[1:] if command[0] == "sudo" else command
            if words and words[0] in AGENTS:
                found.append((f"{path.name}: {shlex.join(command)}", words[1:]))
    return found


def test_the_documents_give_agent_commands() -> None:
    """The reader below finds the commands: the check is not vacuous."""
    names = {args[0] for _, args in _agent_commands() if args}
    assert {"status", "check-config", "rotate-key", "state", "--version"} <= names


@pytest.mark.parametrize(("where", "args"), _agent_commands(), ids=lambda v: str(v)[:80])
def test_every_agent_command_parses_as_written(where: str, args: list[str]) -> None:
    try:
        _parser().parse_args(args)
        code: object = 0
    except SystemExit as exc:  # --version and --help exit 0 too
        code = exc.code
    assert code == 0, where


def test_every_systemctl_and_journalctl_line_reads_the_unit() -> None:
    for path in DOCUMENTS:
        for command in _commands(path):
            words = command[1:] if command[0] == "sudo" else command
            if words[0] == "systemctl":
                assert words[1] in SYSTEMCTL_VERBS, shlex.join(command)
                if words[1] != "daemon-reload":
                    assert "restore-agent" in words, shlex.join(command)
            elif words[0] == "journalctl":
                assert words[1:3] == ["-u", "restore-agent"], shlex.join(command)
