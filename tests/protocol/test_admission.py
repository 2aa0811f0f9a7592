"""The seat table of a connection's request classes, on its own: who is let in, who is deferred,
and who holds which seat (no connection, no time)."""

from __future__ import annotations

import pytest

from agent.errors import InvalidState
from agent.protocol.admission import (
    CONTROL,
    Admission,
    AdmissionBounds,
    AdmissionTable,
    Deferred,
    stream_class,
)

STAGE = stream_class("targetNodeName")
STATUS = Admission(answers_now=True)


def table(control: int = 2, stream: int = 4, stream_per_node: int = 2) -> AdmissionTable:
    return AdmissionTable(AdmissionBounds(control, stream, stream_per_node))


def fill(seats: AdmissionTable, admission: Admission, count: int, *, first: int = 1) -> None:
    """Let `count` requests in, one node each (node-1, node-2, ...), each admitted."""
    for number in range(first, first + count):
        assert seats.admit(number, admission, {"targetNodeName": f"node-{number}"}) is None


def test_a_control_request_is_let_in_while_every_stream_seat_is_taken() -> None:
    """Stream requests holding all their seats leave the control seats free."""
    seats = table(stream=4, stream_per_node=4)
    fill(seats, STAGE, 4)
    assert seats.admit(5, STAGE, {"targetNodeName": "node-9"}) is not None
    assert seats.admit(6, CONTROL, {}) is None
    assert (seats.in_flight("control"), seats.in_flight("stream")) == (1, 4)


def test_a_stream_request_is_let_in_while_every_control_seat_is_taken() -> None:
    """Control requests holding all their seats leave the stream seats free."""
    seats = table(control=2)
    fill(seats, CONTROL, 2)
    assert seats.admit(3, CONTROL, {}) is not None
    assert seats.admit(4, STAGE, {"targetNodeName": "node-1"}) is None


def test_one_nodes_flood_leaves_another_node_its_seat() -> None:
    """A node at its share is deferred; another node's stream request is still let in."""
    seats = table(stream=8, stream_per_node=3)
    flood = [seats.admit(number, STAGE, {"targetNodeName": "node-a"}) for number in range(1, 11)]
    assert [outcome is None for outcome in flood] == [True] * 3 + [False] * 7
    assert seats.admit(11, STAGE, {"targetNodeName": "node-b"}) is None
    assert (seats.node_in_flight("node-a"), seats.node_in_flight("node-b")) == (3, 1)


def test_a_refusal_names_its_class() -> None:
    """The deferral says which class was full, in its reason too."""
    seats = table(control=1, stream=1, stream_per_node=1)
    fill(seats, CONTROL, 1)
    fill(seats, STAGE, 1, first=2)
    control = seats.admit(3, CONTROL, {})
    stream = seats.admit(4, STAGE, {"targetNodeName": "node-7"})
    assert control == Deferred(
        "control", "the agent is busy with 1 control requests; send it again"
    )
    assert stream == Deferred("stream", "the agent is busy with 1 stream requests; send it again")


def test_a_nodes_share_refusal_does_not_echo_the_node() -> None:
    """Deferred for its node's share: the reason says so without the peer's own text."""
    seats = table(stream=8, stream_per_node=1)
    fill(seats, STAGE, 1)
    deferred = seats.admit(2, STAGE, {"targetNodeName": "node-1"})
    assert deferred is not None
    assert deferred.request_class == "stream"
    assert "node-1" not in deferred.reason
    assert "for this request's node" in deferred.reason


def test_refusals_are_counted_per_class() -> None:
    """Each deferral counts against its own class only."""
    seats = table(control=1, stream=1, stream_per_node=1)
    fill(seats, CONTROL, 1)
    fill(seats, STAGE, 1, first=2)
    for number in range(3, 6):
        seats.admit(number, CONTROL, {})
    seats.admit(6, STAGE, {"targetNodeName": "node-6"})
    assert seats.refused == {"control": 3, "stream": 1}


def test_a_request_answered_from_memory_takes_no_seat() -> None:
    """Let in without a seat: with every control seat taken, a status still comes in."""
    seats = table(control=1)
    fill(seats, CONTROL, 1)
    assert seats.admit(2, STATUS, {}) is None
    assert seats.in_flight("control") == 1
    assert seats.release(2) is None


def test_a_request_that_needs_its_handler_after_all_asks_for_a_control_seat() -> None:
    """`seat` takes a control seat for a request let in without one."""
    seats = table(control=2)
    seats.admit(1, STATUS, {})
    assert seats.seat(1) is None
    assert seats.in_flight("control") == 1
    assert seats.release(1) == "control"


def test_a_request_that_needs_its_handler_when_control_is_full_is_deferred() -> None:
    """`seat` with every control seat taken defers it, as a control request."""
    seats = table(control=1)
    seats.admit(1, STATUS, {})
    fill(seats, CONTROL, 1, first=2)
    deferred = seats.seat(1)
    assert deferred is not None
    assert deferred.request_class == "control"
    assert seats.refused["control"] == 1


def test_releasing_a_seat_lets_the_next_request_of_its_node_in() -> None:
    """A node at its share gets a seat back when one of its requests ends."""
    seats = table(stream=8, stream_per_node=1)
    fill(seats, STAGE, 1)
    assert seats.admit(2, STAGE, {"targetNodeName": "node-1"}) is not None
    assert seats.release(1) == "stream"
    assert seats.node_in_flight("node-1") == 0
    assert seats.admit(3, STAGE, {"targetNodeName": "node-1"}) is None


def test_a_stream_request_naming_no_node_counts_against_the_class_only() -> None:
    """No node field (or not a string): only the class bound applies."""
    seats = table(stream=3, stream_per_node=1)
    for number in range(1, 4):
        assert seats.admit(number, STAGE, {"targetNodeName": 5}) is None
    assert seats.admit(4, STAGE, {}) is not None
    assert seats.in_flight("stream") == 3


def test_clearing_frees_every_seat_and_keeps_the_refusals() -> None:
    """The connection is gone: nothing holds a seat; what was refused stays counted."""
    seats = table(control=1)
    fill(seats, CONTROL, 1)
    fill(seats, STAGE, 2, first=2)
    seats.admit(4, CONTROL, {})
    seats.clear()
    assert (seats.in_flight("control"), seats.in_flight("stream")) == (0, 0)
    assert seats.node_in_flight("node-2") == 0
    assert seats.refused["control"] == 1


@pytest.mark.parametrize("bounds", [(0, 4, 2), (2, 0, 2), (2, 4, 0)])
def test_a_class_without_seats_is_refused(bounds: tuple[int, int, int]) -> None:
    """A bound below 1 would turn every request of its class away: `InvalidState`."""
    with pytest.raises(InvalidState, match="at least one seat"):
        AdmissionBounds(*bounds)
