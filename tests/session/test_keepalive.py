"""The session's keepalive on a manual clock: a ping per interval, a pong late is a dead link."""

from __future__ import annotations

import asyncio

import pytest

from agent.errors import SessionClosed
from agent.protocol.delivery import Mark
from agent.session.delivery import DeliveryTracker
from agent.session.keepalive import keep_alive
from agent.session.transport import Pong
from tests.clock import ManualClock, advancing


class _Cloudly:
    """Answers pings with a fixed round trip until it goes silent."""

    def __init__(self, answers: int) -> None:
        self.pings = 0
        self._answers = answers

    async def ping(self) -> Pong:
        self.pings += 1
        if self.pings > self._answers:
            await asyncio.Event().wait()  # never answered
        return Pong(0.25)


async def _run(cloudly: _Cloudly, clock: ManualClock, pongs: list[float]) -> SessionClosed:
    async with advancing(clock):
        with pytest.raises(SessionClosed) as caught:
            await keep_alive(
                cloudly, clock=clock, interval=10.0, pong_timeout=30.0, on_pong=pongs.append
            )
    return caught.value


async def test_each_answered_ping_reports_its_round_trip() -> None:
    """A ping every interval; every pong's round trip goes to `on_pong`."""
    clock, cloudly, pongs = ManualClock(), _Cloudly(answers=2), []
    await _run(cloudly, clock, pongs)
    assert (pongs, cloudly.pings) == ([0.25, 0.25], 3)
    assert clock.slept[::2] == [10.0, 10.0, 10.0]


async def test_a_ping_unanswered_for_the_pong_timeout_ends_the_connection_with_1011() -> None:
    """No pong within `pong_timeout` (on the clock): `SessionClosed` 1011, naming the wait."""
    clock, pongs = ManualClock(), []
    closed = await _run(_Cloudly(answers=0), clock, pongs)
    assert (closed.close_code, clock.monotonic(), pongs) == (1011, 40.0, [])
    assert str(closed) == (
        "session closed with code 1011: Cloudly answered no keepalive ping within 30 s"
    )


async def test_a_keepalive_pong_delivers_every_answer_sent_before_its_ping() -> None:
    """An answer the peer wrote (its own confirming ping not answered yet) is delivered by the
    next keepalive pong too, on its connection."""
    clock, cloudly = ManualClock(), _Cloudly(answers=1)
    deliveries = DeliveryTracker(connection=4)
    delivered: list[Mark] = []
    deliveries.answered([delivered.append])
    async with advancing(clock):
        with pytest.raises(SessionClosed):
            await keep_alive(
                cloudly,
                clock=clock,
                interval=10.0,
                pong_timeout=30.0,
                on_pong=lambda seconds: None,
                deliveries=deliveries,
            )
    assert delivered == [Mark(4)]


async def test_a_ping_left_unanswered_leaves_its_answers_undelivered() -> None:
    """The pong never comes: the connection ends 1011 and the answer is decided lost when the
    session declares the connection lost; its callback never runs."""
    clock, cloudly = ManualClock(), _Cloudly(answers=0)
    deliveries = DeliveryTracker(connection=1)
    delivered: list[Mark] = []
    deliveries.answered([delivered.append])
    async with advancing(clock):
        with pytest.raises(SessionClosed):
            await keep_alive(
                cloudly,
                clock=clock,
                interval=10.0,
                pong_timeout=30.0,
                on_pong=lambda seconds: None,
                deliveries=deliveries,
            )
    deliveries.lost()
    assert (cloudly.pings, delivered) == (1, [])
