"""The environment a test gives the agent it starts as a process of its own.

The test process runs with asyncio's debug mode (scripts/test sets `PYTHONASYNCIODEBUG`); an
agent it starts runs as production does, without it: debug mode logs every callback slower
than 100 ms, and on a loaded machine such a line would land among the very lines a test reads.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["REPO", "agent_environ", "run_agent"]

REPO = Path(__file__).resolve().parent.parent


def agent_environ(**extra: str) -> dict[str, str]:
    """This process's environment without asyncio's debug mode, the checkout on the path, and
    `extra` on top."""
    environ = {key: value for key, value in os.environ.items() if key != "PYTHONASYNCIODEBUG"}
    return {**environ, "PYTHONPATH": str(REPO), **extra}


def run_agent(
    *args: str, cwd: Path = REPO, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`python -m agent ARGS` in a fresh interpreter (the environment above), its output as
    text; it may exit with any status."""
    return subprocess.run(
        [sys.executable, "-m", "agent", *args],
        capture_output=True,
        text=True,
        env=agent_environ(),
        cwd=cwd,
        timeout=timeout,
        check=False,
    )
