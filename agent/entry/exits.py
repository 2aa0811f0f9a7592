"""The command line's exit codes and its one fatal line (agent/entry/cli.py's table says what each
code means; docs/operations.md, "Start-up and exit codes")."""

from __future__ import annotations

import sys
from typing import Final

from agent.log import PRIORITIES, is_journal

__all__ = [
    "EXIT_BROKEN_PIPE",
    "EXIT_CONFIG",
    "EXIT_CRASH",
    "EXIT_DAMAGED",
    "EXIT_INTERRUPTED",
    "EXIT_NOT_READY",
    "EXIT_OK",
    "EXIT_TEMPORARY",
    "EXIT_UNREACHABLE",
    "PROG",
    "fatal_line",
    "one_line",
]

EXIT_OK: Final = 0
EXIT_CRASH: Final = 1
EXIT_CONFIG: Final = 2
EXIT_UNREACHABLE: Final = 3
# `status` of an agent that answers but is not ready (a different command from the probe's 3).
EXIT_NOT_READY: Final = 3
# sysexits.h's EX_DATAERR: "the input data was incorrect in some way" (the state database).
EXIT_DAMAGED: Final = 65
# sysexits.h's EX_TEMPFAIL: "a temporary failure; the user is invited to retry".
EXIT_TEMPORARY: Final = 75
# What a shell reports for a process ended by SIGINT (Ctrl-C in the foreground) / SIGPIPE.
EXIT_INTERRUPTED: Final = 130
EXIT_BROKEN_PIPE: Final = 141

PROG: Final = "restore-agent"


def one_line(text: str) -> str:
    """`text` on one line, whatever the message holds."""
    return " ".join(text.split())


def fatal_line(text: str) -> None:
    """`text` as one line on stderr, with the error priority when stderr is the journal."""
    line = one_line(text)
    prefix = f"<{PRIORITIES['error']}>" if is_journal(sys.stderr) else ""
    print(prefix + line, file=sys.stderr)
