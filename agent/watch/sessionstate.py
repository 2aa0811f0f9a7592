"""`SessionState`: where the Cloudly session is, as the status shows it, and its one table.

`STATE_TABLE` (an `agent.table.TransitionTable`, the agent's one table type) is the only form
of the moves: its events are the states entered (`AgentStatus.move_to`); `TRANSITIONS`, the
same moves by state, is computed from it. The session moves it to show its own lifecycle
(`agent.session.lifecycle.PUBLISHED`).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType
from typing import Final

from agent.table import TransitionTable

__all__ = ["STATE_TABLE", "TRANSITIONS", "SessionState"]


class SessionState(StrEnum):
    """Where the Cloudly session is."""

    STARTING = "starting"
    CONNECTING = "connecting"
    AUTHENTICATING = "authenticating"
    CONNECTED = "connected"
    BACKING_OFF = "backing-off"
    DRAINING = "draining"
    STOPPED = "stopped"


_S = SessionState

# A signal may arrive at any moment: every state before the drain may drain or stop.
_LIVE: Final = (_S.STARTING, _S.CONNECTING, _S.AUTHENTICATING, _S.CONNECTED, _S.BACKING_OFF)

# Every attempt that fails goes through BACKING_OFF (even with a zero delay), so the reconnect
# count and the last error are recorded in exactly one place.
STATE_TABLE: Final = TransitionTable[SessionState, SessionState](
    {
        (_S.STARTING, _S.CONNECTING): _S.CONNECTING,
        (_S.CONNECTING, _S.AUTHENTICATING): _S.AUTHENTICATING,
        (_S.CONNECTING, _S.BACKING_OFF): _S.BACKING_OFF,
        (_S.AUTHENTICATING, _S.CONNECTED): _S.CONNECTED,
        (_S.AUTHENTICATING, _S.BACKING_OFF): _S.BACKING_OFF,
        (_S.CONNECTED, _S.BACKING_OFF): _S.BACKING_OFF,
        (_S.BACKING_OFF, _S.CONNECTING): _S.CONNECTING,
        **{(state, to): to for state in _LIVE for to in (_S.DRAINING, _S.STOPPED)},
        (_S.DRAINING, _S.STOPPED): _S.STOPPED,
    },
    column="enters",
)
"""The shown session state's table: the event is the state entered (`move_to`)."""

TRANSITIONS: Final[Mapping[SessionState, frozenset[SessionState]]] = MappingProxyType(
    {
        state: frozenset(to for (source, _), to in STATE_TABLE.moves.items() if source is state)
        for state in SessionState
    }
)
"""Where each state may go, every state listed (`STATE_TABLE`'s moves, by state)."""
