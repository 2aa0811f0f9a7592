"""The wait after each loss: full-jitter reconnect backoff (capped, reset when stable)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, strategies as st

from agent.errors import AuthenticationFailed, SessionClosed
from agent.retry import Backoff
from agent.session.faults import Cause, Fault, Reconnects

_TRANSIENT = SessionClosed(1006)
_PERMANENT = AuthenticationFailed("Cloudly refused the machine token: no")


def _always(value: float) -> Reconnects:
    return Reconnects(Backoff(base=1.0, cap=60.0), stable_after=60.0, rng=lambda: value)


def _wait(reconnects: Reconnects, *, permanent: bool = False, lasted: float = 0.0) -> float:
    error = _PERMANENT if permanent else _TRANSIENT
    return reconnects.lost(error, reason="lost", session_lasted=lasted).delay


def test_a_loss_is_decided_with_its_fault_and_its_count() -> None:
    """`lost()` names the fault (cause, the scrubbed reason) and counts the attempt."""
    reconnects = _always(0.0)
    first = reconnects.lost(_PERMANENT, reason="refused: **********")
    second = reconnects.lost(_TRANSIENT, reason="closed")
    assert (first.fault, first.attempt) == (Fault(Cause.TOKEN_REFUSED, "refused: **********"), 1)
    assert (second.fault.cause, second.attempt) == (Cause.CLOSED, 2)


def test_window_doubles_from_base_up_to_cap() -> None:
    """The upper bound doubles per consecutive failure and stops at the cap."""
    reconnects = _always(1.0)
    delays = [_wait(reconnects) for _ in range(9)]
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0]


def test_delay_is_the_random_fraction_of_the_window() -> None:
    """Full jitter: the delay is the random fraction times the current window."""
    reconnects = _always(0.25)
    assert [_wait(reconnects) for _ in range(4)] == [0.25, 0.5, 1.0, 2.0]


def test_a_permanent_fault_waits_from_the_cap_window_at_once() -> None:
    """After a fault only an operator can fix, the first wait is already drawn from the cap."""
    reconnects = _always(0.5)
    loss = reconnects.lost(_PERMANENT, reason="refused")
    assert (loss.delay, loss.attempt) == (30.0, 1)
    assert _wait(reconnects) == 1.0  # a transient fault after it: the window of attempt 2


def test_a_permanent_fault_refuses_a_draw_outside_zero_to_one() -> None:
    """A broken random source is refused, and the failure is not counted."""
    draws = iter([1.5, 0.0])
    reconnects = Reconnects(Backoff(base=1.0, cap=60.0), rng=lambda: next(draws))
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        reconnects.lost(_PERMANENT, reason="refused")
    assert reconnects.lost(_TRANSIENT, reason="closed").attempt == 1


def test_zero_random_draw_reconnects_at_once() -> None:
    """A draw of 0 yields no wait at all (full jitter starts at zero)."""
    assert _wait(_always(0.0)) == 0.0


def test_stable_session_resets_the_window() -> None:
    """A session that lasted `stable_after` seconds starts the next backoff from the base."""
    reconnects = _always(1.0)
    for _ in range(5):
        _wait(reconnects)
    loss = reconnects.lost(_TRANSIENT, reason="closed", session_lasted=60.0)
    assert (loss.delay, loss.attempt) == (1.0, 1)


def test_short_session_does_not_reset_the_window() -> None:
    """A session shorter than `stable_after` keeps growing the window."""
    reconnects = _always(1.0)
    for _ in range(3):
        _wait(reconnects)
    assert _wait(reconnects, lasted=59.9) == 8.0


def test_out_of_range_random_source_is_refused() -> None:
    """A random source outside [0, 1] is a bug, not a long sleep."""
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        _wait(_always(1.5))


@pytest.mark.parametrize(
    ("base", "cap", "stable_after"), [(0.0, 1.0, 1.0), (2.0, 1.0, 1.0), (1.0, 1.0, -1.0)]
)
def test_inconsistent_policy_is_refused(base: float, cap: float, stable_after: float) -> None:
    """A policy with a non-positive base, a cap below the base or negative stability is refused."""
    with pytest.raises(ValueError, match="backoff needs"):
        Reconnects(Backoff(base=base, cap=cap), stable_after=stable_after)


@given(seed=st.integers(min_value=0, max_value=2**32), failures=st.integers(1, 200))
def test_delays_always_lie_inside_zero_and_the_cap(seed: int, failures: int) -> None:
    """Whatever the draws, every delay is within [0, min(cap, base * 2**attempt)]."""
    rng = random.Random(seed)
    policy = Backoff()
    reconnects = Reconnects(policy, rng=rng.random)
    for attempt in range(failures):
        delay = _wait(reconnects)
        assert 0.0 <= delay <= min(policy.cap, policy.base * 2**attempt)


def test_seeded_rng_gives_reproducible_delays() -> None:
    """The same seed yields the same delay sequence (no hidden randomness)."""
    first = Reconnects(rng=random.Random(7).random)
    second = Reconnects(rng=random.Random(7).random)
    assert [_wait(first) for _ in range(10)] == [_wait(second) for _ in range(10)]
