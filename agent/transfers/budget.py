"""The agent's one byte budget: every byte a transfer holds in memory is drawn from it first.

A transfer holds bytes between its two ends: chunk frames Cloudly was invited to send and their
decoded chunks (the protocol draws for them, `agent.protocol.pool`), the chunks a stage or a
closure import assembles for Corestore and the bodies of its PUTs, the pieces a closure export
read from Corestore and has not yet queued. Each draws its bytes before it holds them and gives
them back once they are gone; the bytes drawn together never exceed `limit` (`[memory]
budget_bytes`).

Two ways to draw:

- **waiting** (`ask`, `ByteBudget.take`): a transfer that needs room waits its turn, first
  come first served. Waiting is backpressure: a waiting stage does not read its stream, so
  Cloudly is told `backpressure`; nothing times out because it waited (the stream's own
  deadlines do not run while nobody reads or writes it, docs/operations.md, "Memory");
- **at once or not at all** (`try_take`): what cannot wait, the protocol's invitation of a
  chunk frame (a sans-I/O decision): when it does not fit, the invitation is held back and
  asked again when room appears (`on_room`).

The reserve: the last `reserve` bytes of the budget are only for draws that keep bytes moving
(`keep=0`: a frame for a stream somebody reads, a piece a moving transfer must take to go on).
What only adds depth (a transfer's first buffer, a further buffer, a frame nobody reads yet)
leaves the reserve free (`keep=reserve`). So however many transfers wait or hold buffers, a
moving one can always draw the next frame it needs once its own earlier bytes left, and every
byte drawn leaves: no transfer waits for room only another waiting transfer could give back.

`BudgetLedger` is the accounting (pure: no asyncio); `ByteBudget` its asyncio face (waiters are
futures; `clock` times the waits for the observer); `Holding` what one transfer holds, given back
whole when it ends, however it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from agent.clock import SYSTEM_CLOCK, Clock
from agent.errors import InvalidState
from agent.observe import NULL_OBSERVER, BudgetObserver

__all__ = ["DEFAULT_BUDGET_BYTES", "Ask", "BudgetLedger", "ByteBudget", "Holding"]

DEFAULT_BUDGET_BYTES: Final = 64 * 1024 * 1024
"""`[memory] budget_bytes`' default (docs/benchmarks.md, "One byte budget")."""


@dataclass(eq=False, slots=True)
class Ask:
    """A draw waiting for room: `size` bytes, leaving `keep` bytes of the budget free."""

    size: int
    keep: int
    granted: bool = False


class BudgetLedger:
    """The bytes drawn from one budget, and the draws waiting for room (pure)."""

    def __init__(self, limit: int, *, reserve: int = 0) -> None:
        if limit < 1 or not 0 <= reserve < limit:
            raise InvalidState("a byte budget needs a positive limit and 0 <= reserve < limit")
        self.limit = limit
        self.reserve = reserve
        self._held = 0
        self._asks: deque[Ask] = deque()

    @property
    def held(self) -> int:
        """Bytes drawn and not given back."""
        return self._held

    @property
    def waiting(self) -> int:
        """Draws waiting for room."""
        return len(self._asks)

    def try_take(self, size: int, *, keep: int = 0) -> bool:
        """Draw `size` bytes now if they fit with `keep` bytes to spare; False changes nothing.

        A draw that leaves the reserve free (`keep > 0`) does not pass draws already waiting;
        one that keeps bytes moving (`keep == 0`) does: it is what lets the waiting ones go."""
        self._check(size, keep)
        if keep > 0 and self._asks:
            return False
        if self._held + size + keep > self.limit:
            return False
        self._held += size
        return True

    def ask(self, size: int, *, keep: int) -> Ask:
        """A draw of `size` bytes that waits its turn: granted at once when it fits and nobody
        waits before it, else queued (first come, first served) until `give` grants it."""
        self._check(size, keep)
        ask = Ask(size, keep)
        self._asks.append(ask)
        self._grant()
        return ask

    def give(self, size: int) -> list[Ask]:
        """Give `size` drawn bytes back; the asks this lets through (now drawn), in order."""
        if size < 0 or size > self._held:
            raise InvalidState(f"giving back {size} bytes of the {self._held} drawn")
        self._held -= size
        return self._grant()

    def cancel(self, ask: Ask) -> list[Ask]:
        """`ask` gives up: a granted one gives its bytes back, a queued one leaves the queue.
        The asks this lets through, in order."""
        if ask.granted:
            ask.granted = False
            return self.give(ask.size)
        with contextlib.suppress(ValueError):
            self._asks.remove(ask)
        return self._grant()

    def _grant(self) -> list[Ask]:
        granted: list[Ask] = []
        while self._asks:
            head = self._asks[0]
            if self._held + head.size + head.keep > self.limit:
                break  # nobody passes the first in line
            self._asks.popleft()
            self._held += head.size
            head.granted = True
            granted.append(head)
        return granted

    def _check(self, size: int, keep: int) -> None:
        if size < 0 or keep < 0 or size + keep > self.limit:
            raise InvalidState(
                f"a draw of {size} bytes keeping {keep} free can never fit a budget of "
                f"{self.limit} bytes"
            )


class ByteBudget:
    """The agent's byte budget, shared by every transfer and the protocol (asyncio face)."""

    def __init__(
        self,
        limit: int,
        *,
        reserve: int | None = None,
        clock: Clock = SYSTEM_CLOCK,
        observer: BudgetObserver = NULL_OBSERVER,
    ) -> None:
        self.ledger = BudgetLedger(limit, reserve=limit // 4 if reserve is None else reserve)
        self._clock = clock
        self._observer = observer
        self._waiters: dict[int, asyncio.Future[None]] = {}
        self._room_listeners: list[Callable[[], None]] = []
        self._idle_listeners: list[Callable[[], None]] = []
        observer.budget_changed(limit=limit, held=0, waiting=0)

    @property
    def limit(self) -> int:
        """The most bytes drawn at once."""
        return self.ledger.limit

    @property
    def reserve(self) -> int:
        """Bytes only draws that keep bytes moving may use."""
        return self.ledger.reserve

    @property
    def held(self) -> int:
        """Bytes drawn now."""
        return self.ledger.held

    @property
    def idle(self) -> bool:
        """Nothing drawn and nobody waiting (the `on_idle` listeners' moment)."""
        return self.ledger.held == 0 and self.ledger.waiting == 0

    def try_take(self, size: int, *, keep: int = 0) -> bool:
        """Draw `size` bytes now or not at all (`BudgetLedger.try_take`)."""
        taken = self.ledger.try_take(size, keep=keep)
        if taken:
            self._report()
        return taken

    async def take(self, size: int, *, keep: int | None = None) -> None:
        """Draw `size` bytes, waiting for room in turn (`keep` defaults to the reserve). No
        deadline: a caller that goes away (cancelled) leaves the queue."""
        ask = self.ledger.ask(size, keep=self.reserve if keep is None else keep)
        if ask.granted:
            self._observer.budget_waited(seconds=0.0)
            self._report()
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[id(ask)] = waiter
        began = self._clock.monotonic()
        self._report()
        try:
            await waiter
        except BaseException:
            self._wake(self.ledger.cancel(ask))
            raise
        finally:
            del self._waiters[id(ask)]
        self._observer.budget_waited(seconds=self._clock.monotonic() - began)

    def give(self, size: int) -> None:
        """Give `size` drawn bytes back: wake the waits this lets through, then tell the
        listeners there may be room (and that nothing is drawn, when nothing is)."""
        if size == 0:
            return
        self._wake(self.ledger.give(size))
        for listener in list(self._room_listeners):
            listener()
        if self.idle:
            for listener in list(self._idle_listeners):
                listener()

    def on_room(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call `listener` whenever bytes are given back (a held invitation may fit now);
        returns the function that stops it."""
        self._room_listeners.append(listener)
        return lambda: self._drop(self._room_listeners, listener)

    def on_idle(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call `listener` whenever the last drawn byte is given back and nobody waits;
        returns the function that stops it."""
        self._idle_listeners.append(listener)
        return lambda: self._drop(self._idle_listeners, listener)

    def holding(self) -> Holding:
        """A new account of what one transfer holds (`async with budget.holding() as h`)."""
        return Holding(self)

    def _wake(self, granted: list[Ask]) -> None:
        for ask in granted:
            waiter = self._waiters.get(id(ask))
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
        self._report()

    def _report(self) -> None:
        ledger = self.ledger
        self._observer.budget_changed(limit=ledger.limit, held=ledger.held, waiting=ledger.waiting)

    @staticmethod
    def _drop(listeners: list[Callable[[], None]], listener: Callable[[], None]) -> None:
        with contextlib.suppress(ValueError):
            listeners.remove(listener)


class Holding:
    """What one transfer has drawn: drawn and given back through it, given back whole by
    `close()` (or the end of `async with`), whatever the transfer did."""

    def __init__(self, budget: ByteBudget) -> None:
        self._budget = budget
        self._held = 0
        self._closed = False

    @property
    def held(self) -> int:
        """Bytes this transfer holds now."""
        return self._held

    async def take(self, size: int, *, keep: int | None = None) -> None:
        """Draw `size` bytes, waiting in turn (`ByteBudget.take`)."""
        self._check_open()
        await self._budget.take(size, keep=keep)
        self._held += size

    def try_take(self, size: int, *, keep: int | None = None) -> bool:
        """Draw `size` bytes now or not at all (`keep` defaults to the reserve)."""
        self._check_open()
        taken = self._budget.try_take(size, keep=self._budget.reserve if keep is None else keep)
        if taken:
            self._held += size
        return taken

    def most_at_once(self, size: int) -> int:
        """How many draws of `size` bytes one waiting draw can ever hold (the budget beyond
        its reserve)."""
        return (self._budget.limit - self._budget.reserve) // size

    def give(self, size: int) -> None:
        """Give back `size` of the bytes this transfer holds."""
        if size > self._held:
            raise InvalidState(f"giving back {size} bytes of the {self._held} held")
        self._held -= size
        self._budget.give(size)

    def close(self) -> None:
        """Give back everything; later draws raise."""
        self._closed = True
        held, self._held = self._held, 0
        self._budget.give(held)

    async def __aenter__(self) -> Holding:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidState("the transfer's holding is closed")
