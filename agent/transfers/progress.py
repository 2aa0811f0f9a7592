"""`ProgressPace`: when a long transfer's progress line is due (pure: time is passed in).

At most one line per `interval` seconds, and the final one always. A stage (`staging_progress`)
and the closures (`closure_sent`, `closure_received`) pace their log lines with it; where the
pace starts (`last`) says whether the first line may come at once.
"""

from __future__ import annotations

__all__ = ["ProgressPace"]


class ProgressPace:
    """At most one report per `interval` seconds; the final one whenever it comes."""

    def __init__(self, interval: float, *, last: float) -> None:
        """`last` is when the pace counts the previous report (`now - interval`: one is due at
        once; `now`: the first comes after `interval`)."""
        self._interval = interval
        self._last = last

    def due(self, now: float, *, final: bool = False) -> bool:
        """Whether a report is due at `now` (always when `final`); a due report counts as made."""
        if not final and now - self._last < self._interval:
            return False
        self._last = now
        return True
