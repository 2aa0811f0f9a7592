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
    ping = ledger.ping()
    assert ledger.pong(ping) == [("a", Mark(3))]


def test_a_ping_sent_before_an_answer_does_not_deliver_it() -> None:
    """An answer handed out while a ping is in flight waits for the next ping's pong."""
    ledger: Deliveries[str] = Deliveries(connection=1)
    ledger.answered(["a"])
    first = ledger.ping()
    ledger.answered(["b"])
    assert ledger.pong(first) == [("a", Mark(1))]
    second = ledger.ping()
    assert ledger.pong(second) == [("b", Mark(1))]


def test_a_pong_answers_its_ping_and_every_earlier_one() -> None:
    """A peer may answer only the latest ping: every earlier one is answered with it."""
    ledger: Deliveries[str] = Deliveries(connection=1)
    ledger.answered(["a"])
    first = ledger.ping()
    ledger.answered(["b", "c"])
    second = ledger.ping()
    assert ledger.pong(second) == [("a", Mark(1)), ("b", Mark(1)), ("c", Mark(1))]
    assert ledger.pong(first) == []


def test_a_pong_of_no_ping_we_sent_delivers_nothing() -> None:
    ledger: Deliveries[str] = Deliveries(connection=1)
    ledger.answered(["a"])
    assert ledger.pong(99) == []


def test_a_lost_connection_leaves_every_unconfirmed_answer_undelivered() -> None:
    """Answers in flight under a ping and answers not yet pinged are lost, in order; what
    comes later is dropped: no pong delivers it."""
    ledger: Deliveries[str] = Deliveries(connection=1)
    ledger.answered(["a"])
    ping = ledger.ping()
    ledger.answered(["b"])
    assert ledger.lost() == ["a", "b"]
    assert ledger.pong(ping) == []
    ledger.answered(["c"])
    assert ledger.pong(ledger.ping()) == []


def test_connections_are_numbered_from_one() -> None:
    with pytest.raises(InvalidState):
        Deliveries(connection=0)
