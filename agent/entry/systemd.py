"""What systemd is told of the agent: the `STATUS=` line (`status_line`, also what `systemctl
status` shows), kept current while the agent runs (`tell_systemd`), `READY=1` sent once
(`Ready`), and the line `STOPPING=1` carries (`draining_line`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from agent.clock import Clock
from agent.watch.notify import Notifier
from agent.watch.status import STATE_UNWRITABLE, AgentStatus, SessionState, StatusSnapshot

__all__ = ["Ready", "draining_line", "status_line", "tell_systemd"]

# How often STATUS= is recomputed while nothing changes: the outage's duration grows.
_STATUS_REFRESH_S = 30.0


def status_line(snapshot: StatusSnapshot, now: float | None = None) -> str:
    """What `systemctl status` shows: first of all a state disk that refuses writes (the agent
    is not ready while it does), then the session's state and, while Cloudly is unreachable,
    since when, the last connect, the failed attempts and the last error (`now`: wall
    seconds, the status's clock; the snapshot's own time when None)."""
    state, error = snapshot.state, snapshot.last_error
    unwritable = snapshot.conditions.get(STATE_UNWRITABLE)
    if unwritable is not None and state is not SessionState.DRAINING:
        return f"not ready: {unwritable.text}; retrying"
    if state is SessionState.CONNECTED:
        cluster = snapshot.cluster_id
        return "connected to Cloudly" + (f", cluster {cluster}" if cluster else "")
    if state is SessionState.DRAINING:
        return draining_line(snapshot.in_flight)
    outage = snapshot.unreachable(snapshot.state_since if now is None else now)
    if outage is not None and state is not SessionState.STOPPED:
        return outage  # the same line while it connects again: one STATUS= per attempt
    if error is not None and state is not SessionState.STOPPED:
        return f"{state.value}; last error: {error}"
    return state.value


def draining_line(in_flight: int) -> str:
    """The line of a draining agent."""
    # STOPPING=1 and the STATUS= of the draining state say the same, count included.
    return f"stopping: draining {in_flight} requests in flight"


def _line_differs_from(shown: str, clock: Clock) -> Callable[[StatusSnapshot], bool]:
    return lambda snapshot: status_line(snapshot, clock.time()) != shown


async def tell_systemd(
    status: AgentStatus,
    notifier: Notifier,
    *,
    clock: Clock,
    refresh_s: float = _STATUS_REFRESH_S,
) -> None:
    """`STATUS=` on every change of the status line: the session's transitions and errors,
    and, every `refresh_s` while Cloudly is unreachable, the outage's growing duration."""
    if not notifier.enabled:
        return
    line = status_line(status.snapshot(), clock.time())
    while True:
        with contextlib.suppress(TimeoutError):
            async with clock.timeout(refresh_s):
                await status.wait_until(_line_differs_from(line, clock))
        now_line = status_line(status.snapshot(), clock.time())
        if now_line != line:
            line = now_line
            notifier.status(line)


class Ready:
    """`READY=1` (with the first `STATUS=`) and the `on_ready` callback, sent once: when the
    state is open and the health endpoint listens, or at the first refusal of a state disk
    that does not take writes (the agent then waits, serving health: agent/startup/opening.py)."""

    def __init__(
        self,
        notifier: Notifier,
        status: AgentStatus,
        address: str,
        on_ready: Callable[[str], None] | None,
        clock: Clock,
    ) -> None:
        self._notifier, self._status, self._address = notifier, status, address
        self._on_ready, self._clock = on_ready, clock
        self._sent = False

    def send(self) -> None:
        """Say ready once (later calls do nothing)."""
        if self._sent:
            return
        self._sent = True
        self._notifier.ready(status_line(self._status.snapshot(), self._clock.time()))
        if self._on_ready is not None:
            self._on_ready(self._address)
