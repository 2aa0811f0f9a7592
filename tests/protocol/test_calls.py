"""The outgoing call table: ids, deadlines, retry bookkeeping (wire.md §1.2, §1.4)."""

from __future__ import annotations

import re
from dataclasses import replace
from itertools import count

import pytest

from agent.errors import CallFailed, CallTimeout, InvalidState
from agent.protocol.calls import CallErrored, CallTable, Completed, Resend, Unmatched
from agent.protocol.envelope import Correlation, Envelope, ErrorInfo, RetryAdvice
from agent.protocol.ids import new_uni_id


def ids() -> CallTable:
    numbers = count(1)
    return CallTable(new_id=lambda: f"c{next(numbers)}", max_attempts=3)


def answer(call_frame: Envelope, **changes: object) -> Envelope:
    """The response frame for `call_frame` with `changes` applied."""
    assert call_frame.correlation is not None
    base = replace(call_frame, correlation=Correlation(call_frame.correlation.id, "response"))
    return replace(base, **changes)  # type: ignore[arg-type]


def test_default_ids_look_like_isounique() -> None:
    """Fresh ids are "uni_" + 24 lower-case hex, and differ."""
    first, second = new_uni_id(), new_uni_id()
    assert re.fullmatch(r"uni_[0-9a-f]{24}", first)
    assert first != second


def test_start_builds_the_request_frame() -> None:
    """A call is {method, request, response: null, correlation {id, phase: request}}."""
    call = ids().start("echo", {"v": 1}, now=10.0, timeout=5.0)
    assert call.frame == Envelope("echo", {"v": 1}, None, Correlation("c1", "request"))
    assert call.deadline == 15.0


def test_response_completes_the_call() -> None:
    """A response with an object completes the call and removes it."""
    table = ids()
    call = table.start("echo", {}, now=0, timeout=5)
    assert table.on_response(answer(call.frame, response={"ok": 1}), now=1) == Completed(
        "c1", {"ok": 1}
    )
    assert len(table) == 0


def test_error_reply_fails_the_call_with_its_text_and_data() -> None:
    """error {text, data} becomes CallFailed carrying both."""
    table = ids()
    call = table.start("get", {}, now=0, timeout=5)
    outcome = table.on_response(answer(call.frame, error=ErrorInfo("gone", {"code": "x"})), now=1)
    assert isinstance(outcome, CallErrored)
    assert isinstance(outcome.error, CallFailed)
    assert (outcome.error.text, outcome.error.error_data) == ("gone", {"code": "x"})


def test_error_wins_over_retry() -> None:
    """A reply with error and retry fails the call instead of retrying it."""
    table = ids()
    call = table.start("get", {}, now=0, timeout=5)
    both = answer(call.frame, error=ErrorInfo("no", None), retry=RetryAdvice(10, "r"))
    assert isinstance(table.on_response(both, now=1), CallErrored)


def test_retry_asks_to_resend_the_identical_frame_after_the_wait() -> None:
    """retry {waitForMs} yields Resend of the same frame (same id) at now + wait."""
    table = ids()
    call = table.start("get", {"a": 1}, now=0, timeout=5)
    outcome = table.on_response(answer(call.frame, retry=RetryAdvice(250, "busy")), now=1)
    assert outcome == Resend("c1", call.frame, 1.25)


def test_retries_are_bounded_then_the_call_fails() -> None:
    """After max_attempts sends in all, a further retry fails the call."""
    table = ids()
    call = table.start("get", {}, now=0, timeout=5)
    retry = answer(call.frame, retry=RetryAdvice(1, "busy"))
    assert isinstance(table.on_response(retry, now=0), Resend)
    assert isinstance(table.on_response(retry, now=0), Resend)
    outcome = table.on_response(retry, now=0)
    assert isinstance(outcome, CallErrored)
    assert isinstance(outcome.error, CallFailed)
    assert outcome.error.error_data["code"] == "retry-exhausted"
    assert len(table) == 0


def test_response_for_an_unknown_id_is_unmatched() -> None:
    """A reply nobody waits for is reported Unmatched."""
    frame = Envelope("m", {}, {}, Correlation("zzz", "response"))
    assert ids().on_response(frame, now=0) == Unmatched("zzz")


def test_response_with_another_method_is_unmatched() -> None:
    """A reply whose method differs from the call's does not complete it."""
    table = ids()
    call = table.start("a", {}, now=0, timeout=5)
    assert isinstance(table.on_response(answer(call.frame, method="b"), now=0), Unmatched)
    assert len(table) == 1


def test_null_response_without_error_fails_the_call() -> None:
    """A TS handler crash answers response null without error: the call fails."""
    table = ids()
    call = table.start("a", {}, now=0, timeout=5)
    outcome = table.on_response(answer(call.frame, response=None), now=0)
    assert isinstance(outcome, CallErrored)
    assert isinstance(outcome.error, CallFailed)


def test_expire_times_out_calls_past_their_deadline() -> None:
    """expire(now) returns CallTimeout for calls whose deadline passed, and only those."""
    table = ids()
    table.start("a", {}, now=0, timeout=1)
    table.start("b", {}, now=0, timeout=3)
    assert table.next_deadline() == 1
    expired = table.expire(2)
    assert [f.call_id for f in expired] == ["c1"]
    assert isinstance(expired[0].error, CallTimeout)
    assert table.next_deadline() == 3


def test_non_positive_timeout_is_refused() -> None:
    """A call needs a positive timeout."""
    with pytest.raises(InvalidState):
        ids().start("a", {}, now=0, timeout=0)


def test_clear_forgets_every_call() -> None:
    """clear() returns the pending ids and empties the table."""
    table = ids()
    table.start("a", {}, now=0, timeout=1)
    assert table.clear() == ["c1"]
    assert len(table) == 0
