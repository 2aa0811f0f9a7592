"""Session timing: full-jitter reconnect backoff (capped, reset when stable), identity renewal."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, strategies as st

from agent.errors import AuthenticationFailed
from agent.retry import Backoff
from agent.session.reconnect import Reconnects, renew_delay


def _always(value: float) -> Reconnects:
    return Reconnects(Backoff(base=1.0, cap=60.0), stable_after=60.0, rng=lambda: value)


def test_window_doubles_from_base_up_to_cap() -> None:
    """The upper bound doubles per consecutive failure and stops at the cap."""
    backoff = _always(1.0)
    delays = [backoff.next_delay() for _ in range(9)]
    assert delays == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0]


def test_delay_is_the_random_fraction_of_the_window() -> None:
    """Full jitter: the delay is the random fraction times the current window."""
    backoff = _always(0.25)
    assert [backoff.next_delay() for _ in range(4)] == [0.25, 0.5, 1.0, 2.0]


def test_a_permanent_fault_waits_from_the_cap_window_at_once() -> None:
    """After a fault only an operator can fix, the first wait is already drawn from the cap."""
    backoff = _always(0.5)
    assert backoff.next_delay(permanent=True) == 30.0
    assert backoff.attempt == 1
    assert backoff.next_delay() == 1.0  # a transient fault after it: the window of attempt 2


def test_a_permanent_fault_refuses_a_draw_outside_zero_to_one() -> None:
    """A broken random source is refused, and the failure is not counted."""
    backoff = _always(1.5)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        backoff.next_delay(permanent=True)
    assert backoff.attempt == 0


def test_zero_random_draw_reconnects_at_once() -> None:
    """A draw of 0 yields no wait at all (full jitter starts at zero)."""
    assert _always(0.0).next_delay() == 0.0


def test_stable_session_resets_the_window() -> None:
    """A session that lasted `stable_after` seconds starts the next backoff from the base."""
    backoff = _always(1.0)
    for _ in range(5):
        backoff.next_delay()
    assert backoff.next_delay(session_lasted=60.0) == 1.0
    assert backoff.attempt == 1


def test_short_session_does_not_reset_the_window() -> None:
    """A session shorter than `stable_after` keeps growing the window."""
    backoff = _always(1.0)
    for _ in range(3):
        backoff.next_delay()
    assert backoff.next_delay(session_lasted=59.9) == 8.0


def test_reset_forgets_failures() -> None:
    """`reset()` brings the window back to the base."""
    backoff = _always(1.0)
    backoff.next_delay()
    backoff.next_delay()
    backoff.reset()
    assert backoff.next_delay() == 1.0


def test_out_of_range_random_source_is_refused() -> None:
    """A random source outside [0, 1] is a bug, not a long sleep."""
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        _always(1.5).next_delay()


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
        delay = reconnects.next_delay()
        assert 0.0 <= delay <= min(policy.cap, policy.base * 2**attempt)


def test_seeded_rng_gives_reproducible_delays() -> None:
    """The same seed yields the same delay sequence (no hidden randomness)."""
    first = Reconnects(rng=random.Random(7).random)
    second = Reconnects(rng=random.Random(7).random)
    assert [first.next_delay() for _ in range(10)] == [second.next_delay() for _ in range(10)]


def test_renewal_happens_the_margin_before_expiry() -> None:
    """An identity valid for an hour is renewed `margin` seconds before it expires."""
    assert renew_delay(expires_at_ms=1_000_000 + 3_600_000, now=1_000.0, margin_s=300.0) == 3300.0


def test_short_lived_identity_is_renewed_at_half_life() -> None:
    """An identity living shorter than the margin is renewed half-way, not at once."""
    assert renew_delay(expires_at_ms=1_060_000, now=1_000.0, margin_s=300.0) == 30.0


def test_identity_issued_already_expired_is_an_authentication_failure() -> None:
    """An identity whose expiry lies in the past cannot be used: AuthenticationFailed."""
    with pytest.raises(AuthenticationFailed, match="already expired"):
        renew_delay(expires_at_ms=999_000, now=1_000.0, margin_s=300.0)
