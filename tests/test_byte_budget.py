"""The one byte budget: its ledger never draws past the limit, a draw that does not fit waits
its turn (and is never refused for it), the reserve keeps room for what keeps bytes moving,
and a transfer's holding gives everything back however it ends."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings, strategies as st

from agent.errors import InvalidState
from agent.transfers.budget import BudgetLedger, ByteBudget
from tests.clock import ManualClock


async def settle() -> None:
    """Let every ready task run until none is (no time passes)."""
    for _ in range(20):
        await asyncio.sleep(0)


class Recorder:
    """A `BudgetObserver` that keeps what it is told."""

    def __init__(self) -> None:
        self.changes: list[tuple[int, int, int]] = []
        self.waits: list[float] = []
        self.trims: list[int] = []

    def budget_changed(self, *, limit: int, held: int, waiting: int) -> None:
        self.changes.append((limit, held, waiting))

    def budget_waited(self, *, seconds: float) -> None:
        self.waits.append(seconds)

    def memory_trimmed(self, *, released: int) -> None:
        self.trims.append(released)


# --- the ledger (pure) ---------------------------------------------------------------------


def test_a_draw_that_fits_is_taken_and_one_past_the_limit_is_not() -> None:
    ledger = BudgetLedger(100)
    assert ledger.try_take(60)
    assert not ledger.try_take(41)
    assert ledger.held == 60
    assert ledger.try_take(40)
    assert ledger.held == 100


def test_a_draw_that_keeps_the_reserve_free_leaves_it_to_draws_that_keep_bytes_moving() -> None:
    ledger = BudgetLedger(100, reserve=30)
    assert ledger.try_take(70, keep=30)
    assert not ledger.try_take(1, keep=30)
    assert ledger.try_take(30, keep=0)  # the reserve: only for what keeps bytes moving
    assert ledger.held == 100


def test_a_draw_that_could_never_fit_is_refused_as_a_bug() -> None:
    ledger = BudgetLedger(100, reserve=30)
    with pytest.raises(InvalidState):
        ledger.ask(80, keep=30)
    with pytest.raises(InvalidState):
        ledger.try_take(101)


def test_asks_are_granted_first_come_first_served_and_none_passes_the_first() -> None:
    ledger = BudgetLedger(100)
    assert ledger.try_take(90)
    big, small = ledger.ask(50, keep=0), ledger.ask(5, keep=0)
    assert not big.granted
    assert not small.granted  # it fits, but waits its turn
    assert ledger.give(40) == [big]  # 100 drawn: the small one still does not fit
    assert ledger.give(5) == [small]
    assert ledger.held == 100


def test_a_draw_that_leaves_the_reserve_free_does_not_pass_a_waiting_one() -> None:
    ledger = BudgetLedger(100, reserve=10)
    assert ledger.try_take(80)
    waiting = ledger.ask(20, keep=10)
    assert not ledger.try_take(5, keep=10)
    assert ledger.try_take(5, keep=0)  # a moving transfer's next frame still goes
    assert not waiting.granted


def test_cancelling_a_queued_ask_lets_the_next_one_through() -> None:
    ledger = BudgetLedger(100)
    assert ledger.try_take(60)
    first, second = ledger.ask(50, keep=0), ledger.ask(30, keep=0)
    assert ledger.cancel(first) == [second]
    assert ledger.held == 90


def test_giving_back_more_than_was_drawn_is_refused() -> None:
    ledger = BudgetLedger(100)
    assert ledger.try_take(10)
    with pytest.raises(InvalidState):
        ledger.give(11)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["try", "try-keep", "ask", "give", "cancel"]),
            st.integers(min_value=0, max_value=60),
        ),
        max_size=80,
    )
)
def test_the_bytes_drawn_never_exceed_the_limit(steps: list[tuple[str, int]]) -> None:
    """Whatever is drawn, asked, given back or cancelled, in any order: held <= limit, and
    held is exactly what was taken and granted minus what was given back."""
    ledger = BudgetLedger(64, reserve=16)
    mine = 0  # what the drawers hold, by their own count
    asks = []
    for op, size in steps:
        if (op == "try" and ledger.try_take(size, keep=0)) or (
            op == "try-keep" and size <= 48 and ledger.try_take(size, keep=16)
        ):
            mine += size
        elif op == "ask" and size <= 48:
            asks.append(ledger.ask(size, keep=16))
        elif op == "give" and mine:
            back = min(size, mine)
            ledger.give(back)
            mine -= back
        elif op == "cancel" and asks:
            ledger.cancel(asks.pop(0))  # a granted one gives its bytes back
        assert 0 <= ledger.held <= ledger.limit
        assert ledger.held == mine + sum(a.size for a in asks if a.granted)


# --- the asyncio face ----------------------------------------------------------------------


async def test_a_transfer_that_does_not_fit_waits_for_room_instead_of_failing() -> None:
    """The second draw waits (an hour on the clock changes nothing: no deadline), and gets its
    bytes the moment the first gives them back."""
    clock = ManualClock()
    recorder = Recorder()
    budget = ByteBudget(100, reserve=0, clock=clock, observer=recorder)
    first = budget.holding()
    await first.take(80)
    second = budget.holding()
    waiting = asyncio.create_task(second.take(40))
    await settle()
    clock.advance(3600.0)
    await settle()
    assert not waiting.done()
    assert recorder.changes[-1] == (100, 80, 1)
    first.give(50)
    await waiting
    assert (budget.held, second.held) == (70, 40)
    assert recorder.waits == [0.0, 3600.0]


async def test_a_waiter_that_goes_away_leaves_the_queue_and_the_next_one_moves() -> None:
    budget = ByteBudget(100, reserve=0, clock=ManualClock())
    await budget.take(90)
    gone = asyncio.create_task(budget.take(50))
    stays = asyncio.create_task(budget.take(10))
    await settle()
    gone.cancel()
    await asyncio.gather(gone, return_exceptions=True)
    await stays
    assert budget.held == 100


async def test_a_holding_gives_back_everything_when_its_transfer_fails() -> None:
    budget = ByteBudget(100, clock=ManualClock())

    async def transfer() -> None:
        async with budget.holding() as holding:
            await holding.take(20)
            assert holding.try_take(10)
            assert budget.held == 30
            raise RuntimeError("the transfer failed")

    with pytest.raises(RuntimeError):
        await transfer()
    assert budget.held == 0


async def test_listeners_hear_of_room_and_of_idleness() -> None:
    budget = ByteBudget(100, clock=ManualClock())
    room: list[int] = []
    idle: list[int] = []
    stop_room = budget.on_room(lambda: room.append(budget.held))
    budget.on_idle(lambda: idle.append(budget.held))
    assert budget.try_take(30)
    budget.give(10)
    budget.give(20)
    stop_room()
    assert budget.try_take(5)
    budget.give(5)
    assert room == [20, 0]
    assert idle == [0, 0]
