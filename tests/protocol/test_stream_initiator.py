"""The initiator side of a VirtualStream: polling, backpressure, keep-alive, end (fake clock)."""

from __future__ import annotations

from itertools import count

import pytest

from agent.errors import InvalidState, StreamBroken, StreamNotServed
from agent.protocol.chunks import CLOSING, CLOSING_BIT, encode_chunk
from agent.protocol.events import StreamBroke
from agent.protocol.settings import StreamSettings
from agent.protocol.stream_frames import StreamPackage
from agent.protocol.stream_initiator import InitiatorState, InitiatorStream
from agent.protocol.stream_responder import Role

WINDOW = 2


def initiator(role: Role, *, armed: bool = True) -> InitiatorStream:
    numbers = count(1)
    settings = StreamSettings(
        window=WINDOW, park_timeout=1.0, idle_timeout=10.0, probe_interval=0.05
    )
    stream = InitiatorStream("s1", role, settings, new_id=lambda: f"k{next(numbers)}")
    if armed:
        stream.arm(0.0)
    return stream


def answer(request: StreamPackage, **fields: object) -> StreamPackage:
    """The responder's package answering `request`."""
    base: dict[str, object] = {"next": False, "backpressure": False} | fields
    return StreamPackage("s1", request.cycle_id, "response", "feedback", **base)  # type: ignore[arg-type]


def by_purpose(frames: list[StreamPackage], purpose: str) -> StreamPackage:
    (found,) = [f for f in frames if f.main_purpose == purpose]
    return found


def test_pending_stream_sends_nothing_until_armed() -> None:
    """Frames must not overtake the request carrying the marker."""
    stream = initiator(Role.SEND, armed=False)
    stream.write(b"a")
    assert stream.poll(0.0) == []
    stream.arm(0.0)
    assert {f.main_purpose for f in stream.poll(0.0)} == {"keepAlive", "chunk"}


def test_chunk_frame_carries_the_buffer_form_and_next() -> None:
    """A chunk frame holds chunkData in Buffer form and next = more queued."""
    stream = initiator(Role.SEND)
    stream.write(b"a")
    stream.write(b"b")
    sent = by_purpose(stream.poll(0.0), "chunk")
    assert (sent.chunk_data, sent.next) == (encode_chunk(b"a"), True)


def test_one_data_cycle_is_in_flight_at_a_time() -> None:
    """No second chunk goes out before the first is answered."""
    stream = initiator(Role.SEND)
    stream.write(b"a")
    stream.write(b"b")
    first = by_purpose(stream.poll(0.0), "chunk")
    assert stream.poll(0.1) == []
    stream.on_reply(first.cycle_id, answer(first), 0.1)
    assert by_purpose(stream.poll(0.1), "chunk").chunk_data == encode_chunk(b"b")


def test_backpressure_pauses_then_probes_with_feedback() -> None:
    """After backpressure true the next data frame is a feedback probe, one interval later."""
    stream = initiator(Role.SEND)
    stream.write(b"a")
    stream.write(b"b")
    first = by_purpose(stream.poll(0.0), "chunk")
    stream.on_reply(first.cycle_id, answer(first, backpressure=True), 0.1)
    assert stream.poll(0.12) == []
    probe = by_purpose(stream.poll(0.16), "feedback")
    stream.on_reply(probe.cycle_id, answer(probe), 0.17)
    assert by_purpose(stream.poll(0.17), "chunk").chunk_data == encode_chunk(b"b")


def test_write_on_a_full_queue_raises_and_changes_nothing() -> None:
    """The window bounds the send queue: write must wait for has_space()."""
    stream = initiator(Role.SEND, armed=False)
    stream.write(b"1")
    stream.write(b"2")
    assert not stream.has_space()
    with pytest.raises(InvalidState):
        stream.write(b"3")
    stream.arm(0.0)
    assert by_purpose(stream.poll(0.0), "chunk").chunk_data == encode_chunk(b"1")


def test_acknowledged_closing_bit_ends_the_stream_and_says_farewell_once() -> None:
    """The answer to the closing-bit chunk ends the stream; one keepAlive false follows."""
    stream = initiator(Role.SEND)
    stream.close()
    last = by_purpose(stream.poll(0.0), "chunk")
    assert last.chunk_data == CLOSING_BIT
    stream.on_reply(last.cycle_id, answer(last), 0.1)
    assert stream.state is InitiatorState.ENDED
    farewell = stream.poll(0.1)
    assert [(f.main_purpose, f.keep_alive) for f in farewell] == [("keepAlive", False)]
    assert stream.poll(0.2) == []


def test_keepalive_is_sent_every_interval_once_answered() -> None:
    """One keepAlive in flight; the next one is due an interval after the previous send."""
    stream = initiator(Role.SEND)
    ka = by_purpose(stream.poll(0.0), "keepAlive")
    assert ka.keep_alive is True
    stream.on_reply(ka.cycle_id, answer(ka, keep_alive=True), 0.1)
    assert stream.poll(0.5) == []
    assert stream.next_wakeup() == 1.0
    assert by_purpose(stream.poll(1.0), "keepAlive").keep_alive is True


def test_no_answer_within_the_idle_timeout_breaks_the_stream() -> None:
    """10 s without any answer: StreamBroken for the writer."""
    stream = initiator(Role.SEND)
    stream.poll(0.0)
    stream.poll(10.0)
    before = stream.state
    stream.poll(10.01)
    assert (before, stream.state) == (InitiatorState.OPEN, InitiatorState.BROKEN)
    with pytest.raises(StreamBroken, match="no answer"):
        stream.write(b"x")


def test_keepalive_false_answer_before_the_end_breaks_the_stream() -> None:
    """The responder stopping the stream before the closing bit breaks it."""
    stream = initiator(Role.SEND)
    ka = by_purpose(stream.poll(0.0), "keepAlive")
    stream.on_reply(ka.cycle_id, answer(ka, keep_alive=False), 0.1)
    assert stream.state is InitiatorState.BROKEN


def test_unserved_frame_breaks_the_stream() -> None:
    """A frame echoed back unanswered (unknown stream, 3.3.0 read) breaks the stream."""
    stream = initiator(Role.RECEIVE)
    read = by_purpose(stream.poll(0.0), "read")
    stream.on_unserved(read.cycle_id)
    with pytest.raises(StreamBroken, match="did not serve"):
        stream.take()


def test_an_unserved_read_is_the_typed_stream_not_served() -> None:
    """An echoed `read`: the peer serves no stream in a response, and the reader is told so by
    the error's type (not retryable), not by its text."""
    stream = initiator(Role.RECEIVE)
    read = by_purpose(stream.poll(0.0), "read")
    stream.on_unserved(read.cycle_id)
    with pytest.raises(StreamNotServed):
        stream.take()
    assert stream.not_served


def test_an_unserved_data_frame_of_a_stream_we_send_is_a_plain_break() -> None:
    """An echoed frame of a stream we send on is a break like any other (retryable)."""
    stream = initiator(Role.SEND)
    stream.write(b"data")
    frame = by_purpose(stream.poll(0.0), "chunk")
    stream.on_unserved(frame.cycle_id)
    with pytest.raises(StreamBroken) as raised:
        stream.write(b"more")
    assert type(raised.value) is StreamBroken
    assert not stream.not_served


def test_reader_reads_while_its_window_has_room() -> None:
    """RECEIVE: read frames go out until `window` chunks wait unread."""
    stream = initiator(Role.RECEIVE)
    for data in (b"a", b"b"):
        read = by_purpose(stream.poll(0.0), "read")
        stream.on_reply(read.cycle_id, answer(read, chunk_data=encode_chunk(data), next=True), 0.0)
    assert [f.main_purpose for f in stream.poll(0.0)] == []
    assert stream.take() == b"a"
    assert by_purpose(stream.poll(0.0), "read").main_purpose == "read"


def test_empty_read_answer_without_next_waits_one_probe_interval() -> None:
    """No chunk and next false: the next read waits probe_interval."""
    stream = initiator(Role.RECEIVE)
    read = by_purpose(stream.poll(0.0), "read")
    stream.on_reply(read.cycle_id, answer(read), 0.0)
    assert stream.poll(0.01) == []
    assert by_purpose(stream.poll(0.05), "read").main_purpose == "read"


def test_reader_ends_at_the_closing_bit_after_the_data() -> None:
    """RECEIVE: the closing bit ends the stream; queued data is still taken first."""
    stream = initiator(Role.RECEIVE)
    read = by_purpose(stream.poll(0.0), "read")
    stream.on_reply(read.cycle_id, answer(read, chunk_data=encode_chunk(b"z")), 0.0)
    read = by_purpose(stream.poll(0.0), "read")
    stream.on_reply(read.cycle_id, answer(read, chunk_data=CLOSING_BIT), 0.0)
    assert stream.state is InitiatorState.ENDED
    assert [stream.take(), stream.take()] == [b"z", CLOSING]


def test_undecodable_chunk_answer_breaks_the_reader() -> None:
    """A read answer with a broken chunk breaks the stream."""
    stream = initiator(Role.RECEIVE)
    read = by_purpose(stream.poll(0.0), "read")
    stream.on_reply(read.cycle_id, answer(read, chunk_data={"type": "Buffer", "data": [-1]}), 0.0)
    assert stream.state is InitiatorState.BROKEN


def test_final_states_do_not_move() -> None:
    """Aborting an ended stream changes nothing."""
    stream = initiator(Role.SEND)
    stream.close()
    last = by_purpose(stream.poll(0.0), "chunk")
    stream.on_reply(last.cycle_id, answer(last), 0.0)
    stream.abort("late")
    assert stream.state is InitiatorState.ENDED
    with pytest.raises(InvalidState):
        stream.arm(1.0)


def test_a_broken_outcome_gives_the_error_its_kind_says() -> None:
    """`StreamBroke.error()`: `StreamNotServed` for a stream the peer did not serve, else a
    plain `StreamBroken`, both naming the stream and why."""
    not_served = StreamBroke("s1", "echoed", not_served=True).error()
    broken = StreamBroke("s1", "timed out").error()
    assert isinstance(not_served, StreamNotServed)
    assert type(broken) is StreamBroken
    assert str(broken) == "stream s1 broke: timed out"
