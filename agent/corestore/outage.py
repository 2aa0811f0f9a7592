"""`Outage`: since when one node's Corestore has given no usable answer (pure; times passed in).

An attempt that got no answer, or one saying 5xx/408/429, begins an outage (or goes on with
one); any other answer ends it. The transport asks its age to decide how long an idempotent
call may still be resent (`[corestore] outage_tolerance_s`), and reports its start, so status
and metrics can say "Corestore unavailable since".
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Outage"]


@dataclass(slots=True)
class Outage:
    """One node's Corestore outage: `since` (monotonic) and `since_wall` (epoch seconds) while
    it lasts, None while Corestore answers."""

    since: float | None = None
    since_wall: float | None = None
    outlasted: bool = False  # a call already gave up on it (told once per outage)

    def failed(self, *, monotonic: float, wall: float) -> bool:
        """An attempt got no usable answer; True when that begins an outage."""
        if self.since is not None:
            return False
        self.since, self.since_wall, self.outlasted = monotonic, wall, False
        return True

    def answered(self, *, monotonic: float) -> float | None:
        """Corestore answered; how long the outage it ends lasted (None: there was none)."""
        if self.since is None:
            return None
        lasted = monotonic - self.since
        self.since = self.since_wall = None
        self.outlasted = False
        return lasted

    def age(self, monotonic: float) -> float:
        """Seconds since the outage began (0 while there is none)."""
        return 0.0 if self.since is None else monotonic - self.since
