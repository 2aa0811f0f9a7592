"""The ping rule's ledger: an answer is delivered by the pong of a ping sent after it, never by
an earlier one; a connection that ends leaves what no pong confirmed undelivered; a repeated
request is judged by where it arrived against where the answer was delivered."""

from __future__ import annotations

import pytest

from agent.errors import InvalidState
from agent.protocol.delivery import Deliveries, Mark


def test_an_answer_is_delivered_by_the_pong_of_a_ping_sent_after_it() -> None:
    """The pong of the ping that followed the answer delivers it, where the pong was read."""
    ledger: Deliveries[str] = Deliveries(connection=3)
    ledger.answered(["a"])
    assert ledger.wanted
    ping = ledger.ping()
    assert not ledger.wanted
    assert ledger.pong(ping, after=7) == [("a", Mark(3, 7))]


def test_a_ping_sent_before_an_answer_does_not_deliver_it() -> None:
    """An answer handed out while a ping is in flight waits for the next ping's pong."""
    ledger: Deliveries[str] = Deliveries(connection=1)
    ledger.answered(["a"])
    first = ledger.ping()
    ledger.answered(["b"])
    assert ledger.pong(first, after=2) == [("a", Mark(1, 2))]
    assert ledger.wanted
    second = ledger.ping()
    assert ledger.pong(second, after=5) == [("b", Mark(1, 5))]


def test_a_pong_answers_its_ping_and_every_earlier_one() -> None:
    """A peer may answer only the latest ping: every earlier one is answered with it."""
    ledger: Deliveries[str] = Deliveries(connection=1)
    ledger.answered(["a"])
    first = ledger.ping()
    ledger.answered(["b", "c"])
    second = ledger.ping()
    assert ledger.pong(second, after=4) == [("a", Mark(1, 4)), ("b", Mark(1, 4)), ("c", Mark(1, 4))]
    assert ledger.pong(first, after=4) == []


def test_a_pong_of_no_ping_we_sent_delivers_nothing() -> None:
    ledger: Deliveries[str] = Deliveries(connection=1)
    ledger.answered(["a"])
    assert ledger.pong(99, after=1) == []
    assert ledger.wanted


def test_a_lost_connection_leaves_every_unconfirmed_answer_undelivered() -> None:
    """Answers in flight under a ping and answers not yet pinged are lost, in order; what
    comes later is decided lost at once and wants no ping."""
    ledger: Deliveries[str] = Deliveries(connection=1)
    ledger.answered(["a"])
    ping = ledger.ping()
    ledger.answered(["b"])
    assert ledger.lost() == ["a", "b"]
    assert ledger.pong(ping, after=3) == []
    ledger.answered(["c"])
    assert not ledger.wanted
    assert ledger.settled(ledger.horizon())


def test_settled_means_every_answer_before_the_horizon_was_decided() -> None:
    """The horizon is taken now: answers handed out later do not hold it up."""
    ledger: Deliveries[str] = Deliveries(connection=1)
    assert ledger.settled(ledger.horizon())
    ledger.answered(["a"])
    horizon = ledger.horizon()
    assert not ledger.settled(horizon)
    ping = ledger.ping()
    ledger.answered(["b"])
    assert not ledger.settled(horizon)
    ledger.pong(ping, after=1)
    assert ledger.settled(horizon)
    assert not ledger.settled(ledger.horizon())


def test_connections_are_numbered_from_one() -> None:
    with pytest.raises(InvalidState):
        Deliveries(connection=0)
