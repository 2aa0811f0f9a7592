"""The loop watch: lag measured, WATCHDOG=1 only from a healthy loop, /healthz's verdict."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.watch.loopwatch import LoopWatch, watch_interval
from agent.watch.notify import Notifier
from tests.clock import ManualClock


class _Lags:
    """A loop observer that records each lag and wakes waiters on each one."""

    def __init__(self) -> None:
        self.seen: list[float] = []
        self._changed = asyncio.Event()

    def loop_lag(self, *, seconds: float) -> None:
        self.seen.append(seconds)
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait_for(self, predicate: object) -> float:
        """The first lag recorded from now on that satisfies `predicate`."""
        assert callable(predicate)
        start = len(self.seen)
        async with asyncio.timeout(10):
            while True:
                for lag in self.seen[start:]:
                    if predicate(lag):
                        return lag
                start = len(self.seen)
                await self._changed.wait()


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[socket.socket]:
    """A datagram socket standing in for systemd's notify socket (non-blocking reads)."""
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.bind(str(tmp_path / "notify.sock"))
    receiver.setblocking(False)
    yield receiver
    receiver.close()


def _received(receiver: socket.socket) -> list[str]:
    messages: list[str] = []
    while True:
        try:
            messages.append(receiver.recv(4096).decode())
        except BlockingIOError:
            return messages


def test_the_interval_is_a_quarter_of_the_watchdog_at_most_one_second() -> None:
    """systemd asks for a ping every half period; a quarter leaves room for one late wake."""
    assert (watch_interval(None), watch_interval(30.0), watch_interval(2.0)) == (1.0, 1.0, 0.5)


async def test_a_timely_wake_pings_the_watchdog(
    tmp_path: Path, notify_socket: socket.socket
) -> None:
    """A wake on time sends WATCHDOG=1 and counts as healthy."""
    clock = ManualClock()
    notifier = Notifier(str(tmp_path / "notify.sock"))
    watch = LoopWatch(interval=1.0, max_lag=0.5, notifier=notifier, watchdog=True, clock=clock)
    task = asyncio.create_task(watch.run())
    try:
        await clock.run_until_sleeping()  # one on-time wake
        await clock.next_wakeup()  # ... fully handled: the watch sleeps again
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        notifier.close()
    alive, facts = watch.health()
    assert _received(notify_socket) == ["WATCHDOG=1"]
    assert (watch.pings, watch.skipped) == (1, 0)
    assert alive
    assert facts["loopLagSeconds"] == 0.0


async def test_a_late_wake_skips_the_ping_and_fails_health(
    tmp_path: Path, notify_socket: socket.socket
) -> None:
    """A wake later than max_lag sends nothing and /healthz says the loop is not alive; the
    next timely wake pings again."""
    clock = ManualClock()
    notifier = Notifier(str(tmp_path / "notify.sock"))
    watch = LoopWatch(interval=1.0, max_lag=0.5, notifier=notifier, watchdog=True, clock=clock)
    task = asyncio.create_task(watch.run())
    try:
        await clock.next_wakeup()
        clock.advance(4.0)  # the loop was busy for 3 s past the wake-up time
        await clock.next_wakeup()
        late = watch.health()
        skipped = _received(notify_socket)
        await clock.run_until_sleeping()
        await clock.next_wakeup()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        notifier.close()
    assert skipped == []
    assert late[0] is False
    assert late[1]["loopLagSeconds"] == 3.0
    assert _received(notify_socket) == ["WATCHDOG=1"]
    assert (watch.pings, watch.skipped) == (1, 1)
    assert watch.health()[0] is True


async def test_watchdog_pings_stop_while_the_loop_is_blocked(
    tmp_path: Path, notify_socket: socket.socket
) -> None:
    """On the real clock: a loop blocked for 0.5 s (a blocking call in a handler) produces one
    wake 0.5 s late, which sends no WATCHDOG=1; the following timely wake pings again."""
    lags = _Lags()
    notifier = Notifier(str(tmp_path / "notify.sock"))
    watch = LoopWatch(interval=0.02, max_lag=0.25, notifier=notifier, watchdog=True, observer=lags)
    task = asyncio.create_task(watch.run())
    try:
        await lags.wait_for(lambda lag: lag <= 0.25)
        pings_before = watch.pings
        _received(notify_socket)
        time.sleep(0.5)  # noqa: ASYNC251  # creates the block; nothing waits on it to synchronise
        blocked_lag = await lags.wait_for(lambda lag: lag > 0.25)
        during = (watch.pings, _received(notify_socket), watch.health()[0])
        await lags.wait_for(lambda lag: lag <= 0.25)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        notifier.close()
    assert blocked_lag >= 0.4
    assert during == (pings_before, [], False)
    assert watch.skipped >= 1
    assert watch.pings > pings_before
    assert "WATCHDOG=1" in _received(notify_socket)


def test_without_a_watchdog_nothing_is_sent(tmp_path: Path, notify_socket: socket.socket) -> None:
    """With no WatchdogSec= the watch still measures but never pings."""
    notifier = Notifier(str(tmp_path / "notify.sock"))
    watch = LoopWatch(interval=1.0, max_lag=0.5, notifier=notifier, watchdog=False)
    watch.woke(0.0)
    notifier.close()
    assert (watch.pings, _received(notify_socket)) == (0, [])


def test_a_watch_that_stopped_waking_is_not_alive() -> None:
    """/healthz fails when the watch has not woken for longer than interval + max_lag."""
    clock = ManualClock()
    watch = LoopWatch(interval=1.0, max_lag=0.5, clock=clock)
    watch.woke(0.0)
    clock.advance(1.4)
    assert watch.health()[0] is True
    clock.advance(0.2)
    assert watch.health()[0] is False
