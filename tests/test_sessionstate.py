"""The session state the status shows: one table, and what is computed from it."""

from __future__ import annotations

from agent.watch.sessionstate import STATE_TABLE, TRANSITIONS, SessionState

_S = SessionState


def test_every_move_enters_the_state_it_is_named_for() -> None:
    """The table's event is the state entered: a move named X arrives in X."""
    assert all(event is to for (_, event), to in STATE_TABLE.moves.items())


def test_the_moves_by_state_are_the_tables_moves() -> None:
    """`TRANSITIONS` lists exactly the table's moves, grouped by the state they leave."""
    regrouped = {(state, to) for state, onward in TRANSITIONS.items() for to in onward}
    assert regrouped == set(STATE_TABLE.moves)


def test_a_signal_may_drain_or_stop_the_session_from_any_state_before_the_drain() -> None:
    """Every state but draining and stopped may go to either."""
    live = set(SessionState) - {_S.DRAINING, _S.STOPPED}
    assert all({_S.DRAINING, _S.STOPPED} <= TRANSITIONS[state] for state in live)


def test_a_draining_session_can_only_stop() -> None:
    assert TRANSITIONS[_S.DRAINING] == frozenset({_S.STOPPED})


def test_every_failed_attempt_goes_through_backing_off() -> None:
    """Connecting, authenticating and connected each fall back to backing-off, which alone
    leads to the next attempt."""
    falls_back = {state for state, onward in TRANSITIONS.items() if _S.BACKING_OFF in onward}
    assert falls_back == {_S.CONNECTING, _S.AUTHENTICATING, _S.CONNECTED}
    assert {s for s, onward in TRANSITIONS.items() if _S.CONNECTING in onward} == {
        _S.STARTING,
        _S.BACKING_OFF,
    }
