"""The intake rules on their own: which request frames are let in, refused or deferred, and the
requests in flight (no connection, no streams, no time)."""

from __future__ import annotations

from typing import Any

import pytest

from agent.errors import InvalidRequest, LocalProtocolError, ShuttingDown
from agent.protocol.admission import Admission, AdmissionBounds, Deferred, stream_class
from agent.protocol.envelope import Correlation, Envelope
from agent.protocol.intake import Admitted, Refused, RequestIntake, UnknownMethod

STAGE = stream_class("targetNodeName")


def intake(control: int = 2, stream: int = 2, per_node: int = 2) -> RequestIntake:
    return RequestIntake(
        ["status", "stage"], AdmissionBounds(control, stream, per_node), {"stage": STAGE}
    )


def frame(method: str = "status", request: Any = None, number: int = 1) -> Envelope:
    body = {"targetNodeName": "node-1"} if request is None else request
    return Envelope(method, body, None, Correlation(f"c{number}", "request"))


def admitted(gate: RequestIntake, env: Envelope, streams: tuple[str, ...] = ()) -> int:
    verdict = gate.admit(env)
    assert isinstance(verdict, Admitted)
    gate.enter(verdict, env, streams)
    return verdict.request_id


def test_a_stopped_intake_refuses_shutting_down() -> None:
    gate = intake()
    gate.stop()
    verdict = gate.admit(frame())
    assert isinstance(verdict, Refused)
    assert isinstance(verdict.error, ShuttingDown)


def test_a_method_nobody_routes_gets_the_librarys_text_and_its_code() -> None:
    verdict = intake().admit(frame("nobodysMethod"))
    assert isinstance(verdict, UnknownMethod)
    assert verdict.text == "There is no available method for this call on the server side"
    assert verdict.data == {"code": "unknown-method", "retryable": False}


def test_a_request_that_is_no_json_object_is_invalid() -> None:
    verdict = intake().admit(frame(request=[1, 2]))
    assert isinstance(verdict, Refused)
    assert isinstance(verdict.error, InvalidRequest)


def test_requests_let_in_are_numbered_in_order() -> None:
    gate = intake()
    assert [admitted(gate, frame(number=n)) for n in (1, 2)] == [1, 2]
    assert len(gate) == 2


def test_a_full_class_defers_and_takes_nothing() -> None:
    gate = intake(control=1)
    admitted(gate, frame())
    verdict = gate.admit(frame(number=2))
    assert isinstance(verdict, Deferred)
    assert (len(gate), gate.seats.in_flight("control")) == (1, 1)


def test_a_withdrawn_admission_gives_its_seat_back_and_its_number_is_used_again() -> None:
    gate = intake(stream=1)
    first = gate.admit(frame("stage"))
    assert isinstance(first, Admitted)
    gate.withdraw(first)  # a stream id of it was refused
    assert gate.seats.in_flight("stream") == 0
    assert admitted(gate, frame("stage", number=2)) == first.request_id


def test_ending_a_request_gives_its_seat_back() -> None:
    gate = intake(control=1)
    request_id = admitted(gate, frame())
    assert gate.end(request_id) is not None
    assert gate.end(request_id) is None  # once
    assert isinstance(gate.admit(frame(number=2)), Admitted)


def test_each_stream_of_a_request_is_unopened_until_read_once() -> None:
    gate = intake()
    request_id = admitted(gate, frame("stage"), ("s1",))
    gate.unopened(request_id, "s1").opened.add("s1")
    with pytest.raises(LocalProtocolError, match="not an unopened stream"):
        gate.unopened(request_id, "s1")
    with pytest.raises(LocalProtocolError, match="not an unopened stream"):
        gate.unopened(request_id, "other")


def test_a_request_turned_away_when_it_asks_for_a_seat_leaves() -> None:
    """A request let in without a seat that needs its handler after all leaves when its class
    is full."""
    gate = RequestIntake(
        ["status"], AdmissionBounds(1, 1, 1), {"status": Admission(answers_now=True)}
    )
    first = admitted(gate, frame())
    second = admitted(gate, frame(number=2))
    assert gate.seat(first) is None
    assert isinstance(gate.seat(second), Deferred)
    assert (gate.get(first) is not None, gate.get(second)) == (True, None)
