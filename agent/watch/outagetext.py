"""How the status says times and an outage in words, the same in `restore-agent status`,
`/readyz`'s `session` reason and systemd's `STATUS=` (pure):

    Cloudly unreachable since 2025-06-01 12:03:04 UTC (2 min), last connected
    2025-06-01 11:00:00 UTC, 17 attempts, last error: connection refused
"""

from __future__ import annotations

import time

__all__ = ["human_duration", "unreachable_sentence", "utc_text"]


def utc_text(seconds: float) -> str:
    """An epoch time as `2025-06-01 12:03:04 UTC` (the same on every node and in every log)."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(seconds))


def human_duration(seconds: float) -> str:
    """`45 s`, `3 min`, `5 h`, `2 d`: a duration as an operator reads it."""
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 86400:.0f} d"


def unreachable_sentence(
    *,
    since: float,
    now: float,
    last_connected_at: float | None,
    attempts: int,
    last_error: str | None,
) -> str:
    """`Cloudly unreachable since <time> (<duration>), last connected <time>, <n> attempts,
    last error: <text>` (epoch seconds in; `never connected` when it never did)."""
    connected = "never connected" if last_connected_at is None else (
        f"last connected {utc_text(last_connected_at)}"
    )  # fmt: skip
    line = (
        f"Cloudly unreachable since {utc_text(since)} ({human_duration(now - since)}), "
        f"{connected}, {attempts} attempt{'' if attempts == 1 else 's'}"
    )
    return line + (f", last error: {last_error}" if last_error else "")
