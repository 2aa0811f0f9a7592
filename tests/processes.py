"""The environment a test gives the agent it starts as a process of its own.

The test process runs with asyncio's debug mode (scripts/test sets `PYTHONASYNCIODEBUG`); an
agent it starts runs as production does, without it: debug mode logs every callback slower
than 100 ms, and on a loaded machine such a line would land among the very lines a test reads.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["REPO", "agent_environ"]

REPO = Path(__file__).resolve().parent.parent


def agent_environ(**extra: str) -> dict[str, str]:
    """This process's environment without asyncio's debug mode, the checkout on the path, and
    `extra` on top."""
    environ = {key: value for key, value in os.environ.items() if key != "PYTHONASYNCIODEBUG"}
    return {**environ, "PYTHONPATH": str(REPO), **extra}
