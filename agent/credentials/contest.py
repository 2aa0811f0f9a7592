"""Whether a second agent enrolls with this cluster's machine token (readme.md, "Where it runs").

Cloudly keeps one recipient per cluster relay and retires the previous one whenever a new one
completes its enrollment (docs/credentials.md). One agent per cluster never sees its recipient
retired before it expires; two agents with the same token retire each other's at every
enrollment and take turns, each learning it only as `unknown-recipient` on its next ask.

`Contest` is the pure record of what the agent saw (times passed in, monotonic seconds):

- `retired(now)`: Cloudly said `unknown-recipient` for the agent's unexpired recipient;
- `confirmed()`: Cloudly sealed material to the agent's recipient at a periodic check.

Two retirements within `WINDOW_S` of each other make it `contested` (one alone is a Cloudly
that lost its recipients, which the agent heals by enrolling again); `CLEAR_AFTER` periodic
checks in a row that found the recipient still enrolled end it (the other agent is gone: with
both running every check finds the recipient retired, since each re-enrollment retires the
other's).

`RecipientWatch` holds the current `Contest` and says each change once: the error line
`duplicate_agent_suspected` (and `duplicate_agent_gone` at info), and the observer hooks that
name the `duplicate-agent` condition (not ready) and move the metrics.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Final, Protocol

import structlog

from agent.clock import SYSTEM_CLOCK, Clock

__all__ = [
    "CLEAR_AFTER",
    "WINDOW_S",
    "Contest",
    "RecipientObserver",
    "RecipientWatch",
    "duplicate_text",
]

_log = structlog.get_logger("agent.credentials.contest")

WINDOW_S: Final = 3600.0
"""Two retirements of the agent's recipient within this many seconds: another agent enrolls."""

CLEAR_AFTER: Final = 3
"""Periodic checks in a row that find the recipient enrolled before the contest is over."""


@dataclass(frozen=True, slots=True)
class Contest:
    """What the agent saw of its recipient's retirements (state as data)."""

    retired_at: tuple[float, ...] = ()
    """The retirements within the window of the last one (monotonic seconds)."""
    confirmed_in_row: int = 0
    contested: bool = False

    def retired(self, now: float) -> Contest:
        """Cloudly retired the agent's unexpired recipient at `now`."""
        recent = (*(at for at in self.retired_at if now - at <= WINDOW_S), now)
        return Contest(recent, 0, self.contested or len(recent) >= 2)

    def confirmed(self) -> Contest:
        """A periodic check found the recipient enrolled."""
        count = self.confirmed_in_row + 1
        if self.contested and count >= CLEAR_AFTER:
            return Contest((), count, False)
        return replace(self, confirmed_in_row=count)


def duplicate_text(retirements: int) -> str:
    """The condition's sentence (also the error line's and the readiness reason's)."""
    return (
        f"another agent enrolls with this cluster's machine token: Cloudly retired this "
        f"agent's recipient {retirements} times within {WINDOW_S / 60:.0f} min (one recipient "
        "per cluster relay); run one agent per cluster and stop the other"
    )


class RecipientObserver(Protocol):
    """What the watch reports (agent.observe)."""

    def recipient_retired(self) -> None:
        """Cloudly retired the agent's unexpired recipient (`unknown-recipient`)."""

    def duplicate_agent(self, *, text: str | None) -> None:
        """Another agent enrolls with the same token (`text` says it), or no longer (None)."""


class RecipientWatch:
    """The current `Contest`, fed by the credential provider, said on every change."""

    def __init__(self, observer: RecipientObserver, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self._observer = observer
        self._clock = clock
        self._counted: str | None = None  # the recipient whose retirement was counted last
        self.contest = Contest()

    def retired(self, recipient_id: str) -> None:
        """Cloudly said it does not know `recipient_id`, which had not expired. One recipient
        is retired once: several fetches (or a fetch and the periodic check) that meet the
        same retired recipient at the same time count one retirement, not a second agent."""
        if recipient_id == self._counted:
            return
        self._counted = recipient_id
        before, self.contest = self.contest, self.contest.retired(self._clock.monotonic())
        self._observer.recipient_retired()
        count = len(self.contest.retired_at)
        if self.contest.contested:
            text = duplicate_text(count)
            if not before.contested:
                _log.error(
                    "duplicate_agent_suspected",
                    recipient_id=recipient_id,
                    retirements=count,
                    error=text,
                    hint="readme.md, 'Where it runs'; docs/operations.md, "
                    "RestoreAgentDuplicateAgent",
                )
            self._observer.duplicate_agent(text=text)
        else:
            _log.warning("recipient_retired", recipient_id=recipient_id, retirements=count)

    def confirmed(self) -> None:
        """A periodic check found the recipient still enrolled."""
        before, self.contest = self.contest, self.contest.confirmed()
        if before.contested and not self.contest.contested:
            _log.info("duplicate_agent_gone", checks=self.contest.confirmed_in_row)
            self._observer.duplicate_agent(text=None)
