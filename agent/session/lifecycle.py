"""The Cloudly session's lifecycle as data (pure): one state, moved only through one table.

`CloudlySession` holds a `Lifecycle` and moves it with `LIFECYCLE_TABLE.next` (an
`agent.table.TransitionTable`): an event the table does not list raises `InvalidState` and
changes nothing (`run()` while it runs, `run()` once stopped). The state says all the session
needs to know about itself: whether `run()` runs (every state but `idle`, `drained` and
`stopped`), whether intake stopped (`INTAKE_STOPPED`: no reconnect, new requests refused),
whether `close()` asked the socket to close (`stopping`). What one connection holds (its peer,
when it connected) is data beside it.

Intake may stop while an attempt goes on (`stop_intake()` comes when it comes): the attempt
still authenticates and serves what is in flight, but the state stays `draining` (or
`stopping`) until `stopped`, which is what the status shows (`PUBLISHED`). docs/architecture.md
embeds `render()`, checked by a test (tests/session/test_lifecycle.py).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from agent.table import TransitionTable
from agent.watch.status import SessionState

__all__ = ["INTAKE_STOPPED", "LIFECYCLE_TABLE", "PUBLISHED", "Lifecycle", "LifecycleEvent"]


class Lifecycle(enum.StrEnum):
    """Where the session is; `stopped` is final."""

    IDLE = "idle"  # made; run() not called yet
    CONNECTING = "connecting"
    AUTHENTICATING = "authenticating"  # the handshake, then the connect step
    CONNECTED = "connected"  # serving
    BACKING_OFF = "backing-off"  # the wait after a loss
    DRAINING = "draining"  # run() runs, intake stopped: in-flight handlers finish
    DRAINED = "drained"  # intake stopped before run(): nothing was ever in flight
    STOPPING = "stopping"  # close(): the socket closes 1001, run() ends
    STOPPED = "stopped"


class LifecycleEvent(enum.StrEnum):
    """What moves the session."""

    RUN = "run"
    CONNECT = "connect"
    AUTHENTICATE = "authenticate"
    GO_LIVE = "go-live"
    LOSE = "lose"
    STOP_INTAKE = "stop-intake"
    CLOSE = "close"
    END = "end"


_S, _E = Lifecycle, LifecycleEvent
_ATTEMPT: Final = (_S.CONNECTING, _S.AUTHENTICATING, _S.CONNECTED, _S.BACKING_OFF)
_ENDS: Final = "run() ended: cancelled, or a bug it raised"
_GOES_ON: Final = "the attempt goes on; intake stays stopped"

LIFECYCLE_TABLE: Final = TransitionTable[Lifecycle, LifecycleEvent].noted(
    {
        (_S.IDLE, _E.RUN): (_S.CONNECTING, "run(): the first attempt"),
        (_S.IDLE, _E.STOP_INTAKE): (_S.DRAINED, "stop_intake() before run()"),
        (_S.CONNECTING, _E.AUTHENTICATE): (_S.AUTHENTICATING, "the socket is open"),
        (_S.AUTHENTICATING, _E.GO_LIVE): (
            _S.CONNECTED,
            "the handshake and the connect step are done",
        ),
        **{
            (state, _E.LOSE): (_S.BACKING_OFF, "the attempt ended: a loss, its wait")
            for state in (_S.CONNECTING, _S.AUTHENTICATING, _S.CONNECTED)
        },
        (_S.BACKING_OFF, _E.CONNECT): (_S.CONNECTING, "the wait is over: the next attempt"),
        **{
            (state, _E.STOP_INTAKE): (_S.DRAINING, "stop_intake(): no reconnect, no new request")
            for state in _ATTEMPT
        },
        **{(state, _E.END): (_S.STOPPED, _ENDS) for state in _ATTEMPT},
        (_S.DRAINING, _E.AUTHENTICATE): (_S.DRAINING, _GOES_ON),
        (_S.DRAINING, _E.GO_LIVE): (_S.DRAINING, _GOES_ON),
        (_S.DRAINING, _E.STOP_INTAKE): (_S.DRAINING, "again: nothing more to stop"),
        (_S.DRAINING, _E.CLOSE): (_S.STOPPING, "close(), after the drain"),
        (_S.DRAINING, _E.END): (
            _S.STOPPED,
            "run() ended: the connection went (no reconnect now), cancelled, or a bug",
        ),
        (_S.DRAINED, _E.RUN): (_S.DRAINING, "run() after stop_intake(): it ends at once"),
        (_S.DRAINED, _E.STOP_INTAKE): (_S.DRAINED, "again: nothing more to stop"),
        (_S.DRAINED, _E.CLOSE): (_S.STOPPED, "close() before run(): nothing to wait for"),
        (_S.STOPPING, _E.AUTHENTICATE): (_S.STOPPING, _GOES_ON),
        (_S.STOPPING, _E.GO_LIVE): (_S.STOPPING, _GOES_ON),
        (_S.STOPPING, _E.STOP_INTAKE): (_S.STOPPING, "again: nothing more to stop"),
        (_S.STOPPING, _E.CLOSE): (_S.STOPPING, "another close(): it waits for the end"),
        (_S.STOPPING, _E.END): (_S.STOPPED, "run() ended: the socket is closed"),
        (_S.STOPPED, _E.STOP_INTAKE): (_S.STOPPED, "stop_intake() after the end: nothing to do"),
        (_S.STOPPED, _E.CLOSE): (_S.STOPPED, "close() after the end: nothing to do"),
    }
)
"""How the session moves (docs/architecture.md embeds `render()`, checked by a test)."""

INTAKE_STOPPED: Final = frozenset({_S.DRAINING, _S.DRAINED, _S.STOPPING, _S.STOPPED})
"""The states in which the session reconnects no more and a new connection serves no new
request."""

PUBLISHED: Final[Mapping[Lifecycle, SessionState]] = MappingProxyType(
    {
        _S.IDLE: SessionState.STARTING,
        _S.CONNECTING: SessionState.CONNECTING,
        _S.AUTHENTICATING: SessionState.AUTHENTICATING,
        _S.CONNECTED: SessionState.CONNECTED,
        _S.BACKING_OFF: SessionState.BACKING_OFF,
        _S.DRAINING: SessionState.DRAINING,
        _S.DRAINED: SessionState.DRAINING,
        _S.STOPPING: SessionState.DRAINING,
        _S.STOPPED: SessionState.STOPPED,
    }
)
"""What the status shows for each state: once intake stopped it says `draining` until
`stopped`, whatever the attempt still does."""
