"""The one retry policy: full-jitter exponential backoff, and `retrying()` with its budget."""

from __future__ import annotations

import asyncio

import pytest

from agent.errors import CorestoreRefused, CorestoreUnavailable
from agent.retry import Backoff, RetryPolicy, retrying
from tests.clock import ManualClock


class TestBackoff:
    def test_the_window_doubles_from_the_base_up_to_the_cap(self) -> None:
        """Failure n waits at most base * factor**(n-1), never more than the cap."""
        backoff = Backoff(base=1.0, cap=10.0, factor=2.0)
        assert [backoff.window(n) for n in range(1, 7)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]

    def test_the_delay_is_the_draw_times_the_window(self) -> None:
        """Full jitter: a draw of 0 retries at once, a draw of 1 waits the whole window."""
        backoff = Backoff(base=0.5, cap=60.0)
        assert (backoff.delay(3, 0.0), backoff.delay(3, 0.5), backoff.delay(3, 1.0)) == (
            0.0,
            1.0,
            2.0,
        )

    def test_a_huge_failure_count_stays_finite_at_the_cap(self) -> None:
        """Ten thousand failures in a row still wait the cap, not an overflow."""
        assert Backoff(base=1.0, cap=90.0).window(10_000) == 90.0

    @pytest.mark.parametrize("fraction", [-0.1, 1.5])
    def test_a_draw_outside_the_unit_interval_is_refused(self, fraction: float) -> None:
        """The random source must return [0, 1]: anything else is a bug, not a delay."""
        with pytest.raises(ValueError, match="random draw"):
            Backoff().delay(1, fraction)
        with pytest.raises(ValueError, match="random draw"):
            Backoff().from_cap(fraction)

    def test_a_wait_from_the_cap_draws_over_the_caps_whole_window(self) -> None:
        """After a failure retrying cannot mend soon, the wait is the draw times the cap."""
        backoff = Backoff(base=0.5, cap=60.0)
        assert (backoff.from_cap(0.0), backoff.from_cap(0.25), backoff.from_cap(1.0)) == (
            0.0,
            15.0,
            60.0,
        )

    @pytest.mark.parametrize(
        ("base", "cap", "factor"), [(0.0, 1.0, 2.0), (2.0, 1.0, 2.0), (1.0, 2.0, 0.5)]
    )
    def test_an_impossible_shape_is_refused(self, base: float, cap: float, factor: float) -> None:
        """A zero base, a cap below the base or a shrinking factor is a configuration bug."""
        with pytest.raises(ValueError, match="backoff needs"):
            Backoff(base=base, cap=cap, factor=factor)


class TestRetrying:
    async def test_it_retries_the_named_error_until_the_step_succeeds(self) -> None:
        """Two unavailable answers, then the value: three calls, two waits from the policy."""
        clock = ManualClock()
        outcomes: list[Exception | str] = [
            CorestoreUnavailable("down"),
            CorestoreUnavailable("down"),
            "done",
        ]
        calls = 0

        async def step() -> str:
            nonlocal calls
            calls += 1
            outcome = outcomes.pop(0)
            if isinstance(outcome, Exception):
                raise outcome
            return outcome

        policy = RetryPolicy(attempts=4, backoff=Backoff(base=1.0, cap=8.0))
        task = asyncio.create_task(
            retrying(
                step,
                policy=policy,
                retry_on=CorestoreUnavailable,
                clock=clock,
                rng=lambda: 1.0,
                what="test",
            )
        )
        assert await clock.run_until_sleeping() == 1.0
        assert await clock.run_until_sleeping() == 2.0
        assert await task == "done"
        assert calls == 3

    async def test_the_last_attempts_error_propagates(self) -> None:
        """`attempts` calls in all, then the error of the last one."""
        calls = 0

        async def step() -> None:
            nonlocal calls
            calls += 1
            raise CorestoreUnavailable(f"down {calls}")

        with pytest.raises(CorestoreUnavailable, match="down 3"):
            await retrying(
                step,
                policy=RetryPolicy(attempts=3),
                retry_on=CorestoreUnavailable,
                clock=ManualClock(),
                rng=lambda: 0.0,
                what="test",
            )
        assert calls == 3

    async def test_any_other_error_is_not_retried(self) -> None:
        """A refusal says the same call cannot succeed: one call, at once."""
        calls = 0

        async def step() -> None:
            nonlocal calls
            calls += 1
            raise CorestoreRefused("no")

        clock = ManualClock()
        with pytest.raises(CorestoreRefused):
            await retrying(
                step,
                policy=RetryPolicy(attempts=5),
                retry_on=CorestoreUnavailable,
                clock=clock,
                rng=lambda: 0.5,
                what="test",
            )
        assert (calls, clock.slept) == (1, [])

    def test_a_policy_without_an_attempt_is_refused(self) -> None:
        """Zero attempts would never call the step."""
        with pytest.raises(ValueError, match="attempts"):
            RetryPolicy(attempts=0)
