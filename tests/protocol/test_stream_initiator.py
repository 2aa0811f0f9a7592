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


def initiator(
    role: Role, *, armed: bool = True, window: int = WINDOW, window_bytes: int = 1 << 20
) -> InitiatorStream:
    numbers = count(1)
    settings = StreamSettings(
        window=window,
        window_bytes=window_bytes,
        park_timeout=1.0,
        idle_timeout=10.0,
        probe_interval=0.05,
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


def all_of(frames: list[StreamPackage], purpose: str) -> list[StreamPackage]:
    return [f for f in frames if f.main_purpose == purpose]


def invited(stream: InitiatorStream, now: float = 0.0) -> InitiatorStream:
    """`stream` (SEND, armed) with its opening probe answered `backpressure: false` at `now`:
    the responder invited its first chunk."""
    probe = by_purpose(stream.poll(now), "feedback")
    stream.on_reply(probe.cycle_id, answer(probe), now)
    return stream


def test_pending_stream_sends_nothing_until_armed() -> None:
    """Frames must not overtake the request carrying the marker."""
    stream = initiator(Role.SEND, armed=False)
    stream.write(b"a")
    assert stream.poll(0.0) == []
    stream.arm(0.0)
    assert {f.main_purpose for f in stream.poll(0.0)} == {"keepAlive", "feedback"}


def test_a_stream_we_send_on_sends_no_chunk_before_an_answer_invites_one() -> None:
    """It opens with a `feedback` probe, as typedrequest 3.3.0 does: a responder that has not
    begun to read (ours holds the probe until its handler reads) is sent nothing it did not
    invite, so no chunk arrives that its byte budget must take at once or refuse."""
    stream = initiator(Role.SEND, window=8)
    stream.write(b"a")
    probe = by_purpose(stream.poll(0.0), "feedback")
    assert (probe.next, all_of(stream.poll(0.5), "chunk")) == (True, [])
    stream.on_reply(probe.cycle_id, answer(probe, backpressure=True), 1.0)
    assert all_of(stream.poll(1.0), "chunk") == []  # held: probe again after the interval
    again = by_purpose(stream.poll(1.05), "feedback")
    stream.on_reply(again.cycle_id, answer(again), 1.1)
    assert by_purpose(stream.poll(1.1), "chunk").chunk_data == encode_chunk(b"a")


def test_chunk_frame_carries_the_buffer_form_and_next() -> None:
    """A chunk frame holds chunkData in Buffer form and next = more queued after it."""
    stream = invited(initiator(Role.SEND))
    stream.write(b"a")
    stream.write(b"b")
    first, second = all_of(stream.poll(0.0), "chunk")
    assert (first.chunk_data, first.next) == (encode_chunk(b"a"), True)
    assert (second.chunk_data, second.next) == (encode_chunk(b"b"), False)


def test_a_window_of_chunks_goes_out_without_waiting_for_answers() -> None:
    """Up to `window` chunks are in flight at once (typedrequest 3.3.0 waits for each answer:
    one chunk per round trip); one more waits for a place."""
    stream = invited(initiator(Role.SEND, window=3))
    for data in (b"1", b"2", b"3"):
        stream.write(data)
    sent = all_of(stream.poll(0.0), "chunk")
    assert [f.chunk_data for f in sent] == [encode_chunk(d) for d in (b"1", b"2", b"3")]
    stream.write(b"4")
    assert stream.poll(0.1) == []
    assert stream.in_flight == 3


def test_until_a_chunk_is_answered_a_quarter_of_window_bytes_may_be_in_flight() -> None:
    """Until the link is measured, chunks in flight carry at most a quarter of `window_bytes`
    (the first always goes, however large)."""
    stream = invited(initiator(Role.SEND, window=8, window_bytes=1000))
    for _ in range(4):
        stream.write(bytes(100))
    assert len(all_of(stream.poll(0.0), "chunk")) == 2  # 200 bytes: 250 allowed
    lone = invited(initiator(Role.SEND, window=8, window_bytes=10))
    lone.write(bytes(100))
    assert len(all_of(lone.poll(0.0), "chunk")) == 1


def over_a_link(rate: float, rtt: float, *, chunk: int, window: int, seconds: float) -> int:
    """The most payload in flight once a sender settled (after its first 10 s), sending on a
    link that carries `rate` bytes per second each way with `rtt` round trip: each chunk leaves
    once the link is free, and its answer comes `rtt` after its last byte left."""
    stream = initiator(Role.SEND, window=window, window_bytes=8 << 20)
    free_at, now, settled = 0.0, 0.0, 0
    answers: list[tuple[float, StreamPackage]] = []
    while now < seconds:
        while stream.has_space():
            stream.write(bytes(chunk))
        for frame in stream.poll(now):
            if frame.main_purpose == "chunk":
                free_at = max(free_at, now) + chunk / rate
                answers.append((free_at + rtt, frame))
            else:  # keep-alives and probes are small: a round trip
                answers.append((now + rtt, frame))
        answers.sort(key=lambda item: item[0])
        while answers and answers[0][0] <= now:
            _, frame = answers.pop(0)
            stream.on_reply(frame.cycle_id, answer(frame), now)
        if now > 10.0:
            settled = max(settled, stream._in_flight_bytes)
        now += 0.005
    assert stream.state is InitiatorState.OPEN
    return settled


def test_over_a_slow_far_link_the_payload_in_flight_follows_the_bandwidth_delay_product() -> None:
    """10 Mbit/s, 400 ms: the sender keeps about two round trips of bytes in flight (2 x 1.25
    MB/s x 0.4 s = 1 MB), not the whole 8 MiB window, which would queue half a minute of frames
    ahead of the session's pings."""
    settled = over_a_link(1.25e6, 0.4, chunk=64 << 10, window=256, seconds=40.0)
    assert settled <= 3 * 1.25e6 * 0.4
    assert settled >= 64 << 10


def test_over_a_fast_far_link_the_whole_window_is_in_flight() -> None:
    """1 GB/s, 200 ms: the measured product is far above the window: all 8 MiB go."""
    settled = over_a_link(1e9, 0.2, chunk=1 << 20, window=16, seconds=15.0)
    assert settled == 8 << 20


def test_backpressure_stops_new_chunks_until_an_answer_says_false() -> None:
    """A backpressure answer stops the sender; an answer in flight that says false resumes it."""
    stream = invited(initiator(Role.SEND))
    stream.write(b"a")
    stream.write(b"b")
    first, second = all_of(stream.poll(0.0), "chunk")
    stream.write(b"c")
    stream.on_reply(first.cycle_id, answer(first, backpressure=True), 0.1)
    assert stream.poll(0.2) == []  # paused, and the answer in flight will tell more
    stream.on_reply(second.cycle_id, answer(second), 0.2)
    assert by_purpose(stream.poll(0.2), "chunk").chunk_data == encode_chunk(b"c")


def test_backpressure_with_nothing_in_flight_probes_with_feedback() -> None:
    """Paused with nothing in flight: one feedback probe per probe interval, then data again."""
    stream = invited(initiator(Role.SEND, window=1))
    stream.write(b"a")
    first = by_purpose(stream.poll(0.0), "chunk")
    stream.write(b"b")
    stream.on_reply(first.cycle_id, answer(first, backpressure=True), 0.1)
    assert stream.poll(0.12) == []
    assert stream.next_wakeup() == pytest.approx(0.15)
    probe = by_purpose(stream.poll(0.16), "feedback")
    assert stream.poll(0.3) == []  # one probe in flight at a time
    stream.on_reply(probe.cycle_id, answer(probe), 0.3)
    assert by_purpose(stream.poll(0.3), "chunk").chunk_data == encode_chunk(b"b")


def test_a_typedrequest_responder_queue_holds_at_most_window_plus_16_chunks() -> None:
    """Against typedrequest 3.3.0's responder (`handleStreamTr`: every chunk is pushed into a
    16-item queue that never refuses, and the answer says backpressure once it is full), over
    a link of 10 ms each way, whose reader keeps up with 40 chunks and then stops reading
    while a window is in flight: the sender stops, and the queue holds at most window + 16."""
    window, delay = 16, 0.01
    stream = initiator(Role.SEND, window=window)
    queue: list[bytes] = []
    to_responder: list[tuple[float, StreamPackage]] = []  # (arrival, frame), in order
    to_us: list[tuple[float, StreamPackage, StreamPackage]] = []  # (arrival, frame, answer)
    now, arrived = 0.0, 0
    for _ in range(2000):
        while stream.has_space():
            stream.write(b"x")
        to_responder += [
            (now + delay, f) for f in stream.poll(now) if f.main_purpose != "keepAlive"
        ]
        while to_responder and to_responder[0][0] <= now:
            _, frame = to_responder.pop(0)
            if frame.main_purpose == "chunk":
                arrived += 1
                if arrived > 40:  # the reader kept up with the first 40, then stopped
                    queue.append(b"x")
            to_us.append((now + delay, frame, answer(frame, backpressure=len(queue) >= 16)))
            assert len(queue) <= window + 16
        while to_us and to_us[0][0] <= now:
            _, frame, reply = to_us.pop(0)
            stream.on_reply(frame.cycle_id, reply, now)
        now += 0.001
    assert len(queue) > 16  # the window was in flight when the queue filled
    assert stream.state is InitiatorState.OPEN


def test_write_on_a_full_queue_raises_and_changes_nothing() -> None:
    """The window bounds the send queue: write must wait for has_space()."""
    stream = initiator(Role.SEND, armed=False)
    stream.write(b"1")
    stream.write(b"2")
    assert not stream.has_space()
    with pytest.raises(InvalidState):
        stream.write(b"3")
    stream.arm(0.0)
    assert all_of(invited(stream).poll(0.0), "chunk")[0].chunk_data == encode_chunk(b"1")


def test_acknowledged_closing_bit_ends_the_stream_and_says_farewell_once() -> None:
    """The answer to the closing-bit chunk ends the stream; one keepAlive false follows."""
    stream = invited(initiator(Role.SEND))
    stream.close()
    last = by_purpose(stream.poll(0.0), "chunk")
    assert last.chunk_data == CLOSING_BIT
    stream.on_reply(last.cycle_id, answer(last), 0.1)
    assert stream.state is InitiatorState.ENDED
    farewell = stream.poll(0.1)
    assert [(f.main_purpose, f.keep_alive) for f in farewell] == [("keepAlive", False)]
    assert (stream.state, stream.broken) == (InitiatorState.OVER, False)
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
    assert (before, stream.broken) == (InitiatorState.OPEN, True)
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
    stream = invited(initiator(Role.SEND))
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


def read_rounds(
    stream: InitiatorStream, rounds: int, chunk: bytes, *, take: bool = True
) -> list[StreamPackage]:
    """Answer every read in flight with `chunk`, 10 ms after it went out, `rounds` times (the
    reader taking what came when `take`); the reads in flight after the last round."""
    now = 0.0
    reads = all_of(stream.poll(now), "read")
    for _ in range(rounds):
        now += 0.01
        for read in reads:
            stream.on_reply(read.cycle_id, answer(read, chunk_data=encode_chunk(chunk)), now)
        while take and stream.take() is not None:
            pass
        reads = all_of(stream.poll(now), "read")
    return reads


def test_a_reader_ramps_up_to_a_window_of_reads_in_flight() -> None:
    """RECEIVE: one read until the first chunk; then each round trip's answers allow twice as
    many reads as they brought (the bandwidth-delay product it measured) and one more, up to
    the window."""
    stream = initiator(Role.RECEIVE, window=8, window_bytes=1 << 20)
    assert len(all_of(stream.poll(0.0), "read")) == 1
    ramp = [len(read_rounds(initiator(Role.RECEIVE, window=8), n, bytes(1000))) for n in (1, 2, 3)]
    assert ramp == [3, 7, 8]


def test_chunks_are_queued_in_the_order_their_answers_come() -> None:
    """Reads in flight are answered in order; the chunks keep it."""
    stream = initiator(Role.RECEIVE, window=4)
    first = by_purpose(stream.poll(0.0), "read")
    stream.on_reply(first.cycle_id, answer(first, chunk_data=encode_chunk(b"a")), 0.1)
    reads = all_of(stream.poll(0.1), "read")
    assert len(reads) == 3
    for read, data in zip(reads, (b"b", b"c", b"d"), strict=True):
        stream.on_reply(read.cycle_id, answer(read, chunk_data=encode_chunk(data)), 0.2)
    assert [stream.take() for _ in range(4)] == [b"a", b"b", b"c", b"d"]


def test_an_empty_read_answer_drops_the_reader_to_one_read() -> None:
    """A responder with nothing to send is asked once per answer, not a window's worth."""
    stream = initiator(Role.RECEIVE, window=8)
    reads = read_rounds(stream, 3, bytes(1000))
    assert len(reads) == 8
    for read in reads:
        stream.on_reply(read.cycle_id, answer(read, next=True), 0.1)
    assert len(all_of(stream.poll(0.1), "read")) == 1


def test_reads_in_flight_are_bounded_by_window_bytes() -> None:
    """Each read in flight counts as the largest chunk seen: with nothing taken, the queued
    bytes and the reads in flight stay below `window_bytes` however fast the link."""
    stream = initiator(Role.RECEIVE, window=64, window_bytes=10_000)
    in_flight = len(read_rounds(stream, 6, bytes(1000), take=False))
    queued = sum(len(item) for item in stream._queue if isinstance(item, bytes))
    assert queued + (in_flight - 1) * 1000 < 10_000


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
    stream = invited(initiator(Role.SEND))
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


def test_cycles_bounds_the_data_cycles_in_flight_as_typedrequest_does_with_one() -> None:
    """`cycles=1` keeps one data cycle in flight, as typedrequest 3.3.0 (a stand-in Cloudly
    set so moves like the real one); the window still bounds the queue."""
    numbers = count(1)
    settings = StreamSettings(window=4, cycles=1, park_timeout=1.0, idle_timeout=10.0)
    stream = InitiatorStream("s1", Role.SEND, settings, new_id=lambda: f"k{next(numbers)}")
    stream.arm(0.0)
    invited(stream)
    for data in (b"1", b"2", b"3"):
        stream.write(data)
    first = by_purpose(stream.poll(0.0), "chunk")
    assert stream.poll(0.1) == []
    stream.on_reply(first.cycle_id, answer(first), 0.1)
    assert by_purpose(stream.poll(0.1), "chunk").chunk_data == encode_chunk(b"2")


def test_the_connections_round_trip_bounds_what_a_stream_measures() -> None:
    """A stream whose every answer waited behind a queue (2 s) uses the connection's smaller
    round trip (0.2 s, its calls'): 2 x 50 KB/s x 0.2 s and one chunk, 120 KB in flight, not
    2 x 50 KB/s x 2 s and one chunk (300 KB)."""
    numbers = count(1)
    settings = StreamSettings(window=16, window_bytes=8 << 20, park_timeout=1.0)
    stream = InitiatorStream(
        "s1", Role.SEND, settings, new_id=lambda: f"k{next(numbers)}", path_rtt=lambda now: 0.2
    )
    stream.arm(0.0)
    invited(stream)
    now = 0.0
    for _ in range(30):
        stream.write(bytes(100_000))
        sent = all_of(stream.poll(now), "chunk")
        now += 1.0
        for frame in sent:
            stream.on_reply(frame.cycle_id, answer(frame), now + 1.0)
    assert stream.allowance == 120_000


def test_a_reader_over_a_slow_far_link_keeps_its_answers_within_the_idle_timeout() -> None:
    """20 Mbit/s from the responder, 400 ms, 1 MiB chunks (a Buffer-form answer is ~3.7 MB,
    1.5 s on the line): a window of reads (8 MiB) would queue eight answers, 12 s of line, and
    the last would come past the 10 s idle timeout; the reader keeps about two round trips'
    worth in flight, the stream stays open and the line stays busy."""
    rate, rtt, chunk = 2.5e6, 0.4, 1 << 20
    payload = encode_chunk(bytes(range(256)) * (chunk // 256))  # every byte value: ~3.6 MB
    line = len(payload.json)  # what one answer's chunk takes on the line
    stream = initiator(Role.RECEIVE, window=16, window_bytes=8 << 20)
    free_at, now, got = 0.0, 0.0, 0
    answers: list[tuple[float, StreamPackage, StreamPackage]] = []
    while now < 60.0:
        for frame in stream.poll(now):
            if frame.main_purpose == "read":  # answered at once; its chunk waits for the line
                free_at = max(free_at, now + rtt / 2) + line / rate
                reply = answer(frame, chunk_data=payload, next=True)
                answers.append((free_at + rtt / 2, frame, reply))
            else:
                answers.append((now + rtt, frame, answer(frame, keep_alive=True)))
        answers.sort(key=lambda item: item[0])
        while answers and answers[0][0] <= now:
            _, frame, reply = answers.pop(0)
            stream.on_reply(frame.cycle_id, reply, now)
        while (item := stream.take()) is not None:
            got += len(item) if isinstance(item, bytes) else 0
        now += 0.01
    assert stream.state is InitiatorState.OPEN
    assert got > 0.8 * rate * 50 * chunk / line  # the line was busy most of the time
