"""The smallest round trip expires and is probed again (`MinRoundTrip`), and a stream we drive
whose path's round trip grows mid-stream reaches the rate of one born on that path (manual
clock; the links are simulated)."""

from __future__ import annotations

from collections.abc import Callable
from itertools import count

import pytest

from agent.protocol.chunks import encode_chunk
from agent.protocol.round_trip import PROBE_SPAN, RTT_SPAN, MinRoundTrip
from agent.protocol.settings import StreamSettings
from agent.protocol.stream_frames import StreamPackage
from agent.protocol.stream_initiator import InitiatorState, InitiatorStream
from agent.protocol.stream_responder import Role
from tests.clock import ManualClock


def test_a_smaller_round_trip_is_taken_at_once() -> None:
    """A round trip that shrinks is the minimum at the sample that shows it."""
    clock, smallest = ManualClock(), MinRoundTrip()
    smallest.sample(0.2, clock.monotonic())
    clock.advance(1.0)
    smallest.sample(0.05, clock.monotonic())
    assert smallest.current(clock.monotonic()) == 0.05


def test_a_larger_round_trip_does_not_move_a_fresh_minimum() -> None:
    """Within the span a larger sample (one that carries a queue) changes nothing."""
    clock, smallest = ManualClock(), MinRoundTrip()
    smallest.sample(0.01, clock.monotonic())
    clock.advance(RTT_SPAN - 1.0)
    smallest.sample(0.5, clock.monotonic())
    assert (smallest.current(clock.monotonic()), smallest.probing(clock.monotonic())) == (
        0.01,
        False,
    )


def test_the_minimum_expires_after_its_span_and_a_probe_begins() -> None:
    """Not matched for `span` seconds, the minimum is no longer current: a probe is due."""
    clock, smallest = ManualClock(), MinRoundTrip()
    smallest.sample(0.01, clock.monotonic())
    clock.advance(RTT_SPAN + 0.001)
    now = clock.monotonic()
    assert (smallest.current(now), smallest.probing(now), smallest.value) == (None, True, 0.01)


def test_a_sample_equal_to_the_minimum_keeps_it_fresh() -> None:
    """A path that still answers in its smallest round trip keeps it past the first span."""
    clock, smallest = ManualClock(), MinRoundTrip()
    smallest.sample(0.01, clock.monotonic())
    clock.advance(RTT_SPAN - 1.0)
    smallest.sample(0.01, clock.monotonic())
    clock.advance(5.0)
    assert smallest.current(clock.monotonic()) == 0.01


def test_a_grown_round_trip_is_taken_by_the_probe_within_the_span() -> None:
    """The path's round trip grew from 10 ms to 200 ms: the minimum expires one span after it
    was last seen, and the probe's first sample after `probe` seconds is the minimum."""
    clock, smallest = ManualClock(), MinRoundTrip()
    smallest.sample(0.01, clock.monotonic())
    while clock.monotonic() < RTT_SPAN + 1.0:  # one cycle at a time, 200 ms each
        clock.advance(0.2)
        smallest.sample(0.2, clock.monotonic())
    assert smallest.current(clock.monotonic()) == pytest.approx(0.2)


def test_a_sample_of_a_cycle_sent_before_the_probe_is_not_taken() -> None:
    """A cycle sent before the probe may carry its owner's own queue: only cycles sent since
    count, and the minimum stays expired until one is answered."""
    clock, smallest = ManualClock(), MinRoundTrip()
    smallest.sample(0.01, clock.monotonic())
    clock.advance(RTT_SPAN + 1.0)
    smallest.sample(2.0, clock.monotonic())  # sent one second before the span ended
    assert smallest.current(clock.monotonic()) is None


def test_the_probe_takes_its_smallest_sample_once_it_lasted_its_time() -> None:
    """Near a path many cycles are answered within `probe` seconds: the smallest of them."""
    clock, smallest = ManualClock(), MinRoundTrip()
    smallest.sample(0.001, clock.monotonic())
    clock.advance(RTT_SPAN + 0.01)
    for took in (0.004, 0.002, 0.003):
        clock.advance(took)
        smallest.sample(took, clock.monotonic())
    assert smallest.current(clock.monotonic()) is None  # the probe lasts `probe` seconds
    clock.advance(PROBE_SPAN)
    smallest.sample(0.005, clock.monotonic())
    assert smallest.current(clock.monotonic()) == 0.002


# --- a stream whose path's round trip grows mid-stream --------------------------------------

RATE = 25e6  # bytes per second each way: 200 Mbit/s, a 256 KiB chunk on the line in 10.5 ms
CHUNK = 256 << 10
NEAR, FAR = 0.002, 0.2  # round trips, seconds
STEP = 0.002  # the simulation's tick


def _stream(
    role: Role, *, at: float = 0.0, path_rtt: Callable[[float], float | None] = lambda now: None
) -> InitiatorStream:
    """A stream armed `at`, whose connection's calls measured `path_rtt` (SEND: its opening
    probe answered then)."""
    numbers = count(1)
    # Idle for longer than a span without breaking: what is tested here is the round trip.
    settings = StreamSettings(window=32, window_bytes=8 << 20, park_timeout=1.0, idle_timeout=60)
    stream = InitiatorStream(
        role.value, role, settings, new_id=lambda: f"k{next(numbers)}", path_rtt=path_rtt
    )
    stream.arm(at)
    if role is Role.SEND:  # the responder invites its first chunk at once
        probe = next(f for f in stream.poll(at) if f.main_purpose == "feedback")
        stream.on_reply(probe.cycle_id, _answer(probe), at)
    return stream


def _answer(frame: StreamPackage, chunk: object = None) -> StreamPackage:
    return StreamPackage(
        frame.stream_id,
        frame.cycle_id,
        "response",
        "chunk" if chunk is not None else "feedback",
        keep_alive=True,
        next=True,
        backpressure=False,
        chunk_data=chunk,
    )


def over_a_changing_link(
    role: Role, rtt_at: Callable[[float], float], seconds: float
) -> list[tuple[float, int]]:
    """(when, payload bytes) of every chunk delivered by a stream driven for `seconds` over a
    link carrying `RATE` each way, whose round trip for a frame sent at `t` is `rtt_at(t)`;
    chunks wait for the line, small frames do not. SEND: the producer always has data;
    RECEIVE: the responder always has a chunk."""
    clock = ManualClock()
    stream, payload = _stream(role), bytes(CHUNK)
    encoded = encode_chunk(payload, "base64")  # decoded faster than the Buffer form
    free_at = 0.0  # when the line carrying the chunks is free
    answers: list[tuple[float, StreamPackage, StreamPackage]] = []
    delivered: list[tuple[float, int]] = []
    while (now := clock.monotonic()) < seconds:
        while role is Role.SEND and stream.has_space():
            stream.write(payload)
        for frame in stream.poll(now):
            rtt = rtt_at(now)
            if frame.main_purpose in ("chunk", "read"):
                leaves = max(free_at, now + (rtt / 2 if role is Role.RECEIVE else 0.0))
                free_at = leaves + CHUNK / RATE
                reply = _answer(frame, encoded if role is Role.RECEIVE else None)
                when = free_at + (rtt / 2 if role is Role.RECEIVE else rtt)
                answers.append((when, frame, reply))
            else:
                answers.append((now + rtt, frame, _answer(frame)))
        answers.sort(key=lambda item: item[0])
        while answers and answers[0][0] <= now:
            _, frame, reply = answers.pop(0)
            stream.on_reply(frame.cycle_id, reply, now)
            if frame.main_purpose in ("chunk", "read"):
                delivered.append((now, CHUNK))
        while role is Role.RECEIVE and stream.take() is not None:
            pass
        clock.advance(STEP)
    assert stream.state is InitiatorState.OPEN
    return delivered


def _rate(delivered: list[tuple[float, int]], start: float, end: float) -> float:
    return sum(size for when, size in delivered if start <= when < end) / (end - start)


@pytest.mark.parametrize("role", [Role.SEND, Role.RECEIVE])
def test_a_stream_whose_round_trip_grows_reaches_the_rate_of_one_born_on_that_path(
    role: Role,
) -> None:
    """80 Mbit/s, 2 ms for 15 s, then 200 ms: within a span and a few seconds of the change
    the stream moves at least 0.8x what a stream born on the 200 ms path moves (one chunk per
    round trip, 3.4 MB/s, while the near minimum held)."""
    change, settle = 15.0, RTT_SPAN + 5.0
    grown = over_a_changing_link(role, lambda t: NEAR if t < change else FAR, 45.0)
    born = over_a_changing_link(role, lambda t: FAR, 45.0 - change)
    after = _rate(grown, change + settle, 45.0)
    assert after >= 0.8 * _rate(born, settle, 45.0 - change)


def test_while_its_round_trip_is_probed_a_stream_keeps_a_quarter_of_its_allowance_in_flight() -> (
    None
):
    """Half the bandwidth-delay product (a quarter of twice it) while the minimum is probed:
    no queue of its own lies ahead of the cycles it sends then, and the link still carries half
    its rate."""
    stream = _stream(Role.SEND)
    while stream.has_space():
        stream.write(bytes(CHUNK))
    first = [f for f in stream.poll(0.0) if f.main_purpose == "chunk"]  # a quarter of 8 MiB
    for frame in first:
        stream.on_reply(frame.cycle_id, _answer(frame), 0.2)
    allowance = stream.allowance  # 2 x 2 MiB / 0.2 s x 0.2 s and a chunk: 17 chunks
    while stream.has_space():
        stream.write(bytes(CHUNK))
    sent = [f for f in stream.poll(0.2 + RTT_SPAN + 0.1) if f.main_purpose == "chunk"]
    assert (allowance // CHUNK, len(sent)) == (17, 17 // 4)


def test_a_connection_round_trip_older_than_the_span_no_longer_bounds_its_streams() -> None:
    """The authentication's 1 ms, a span ago (the path grew since): a stream whose answers take
    0.2 s sizes its allowance from them, 2 x 2 MiB / 0.2 s x 0.2 s and a chunk, not from 1 ms
    (about one chunk)."""
    calls = MinRoundTrip()
    calls.sample(0.001, 0.0)
    start = RTT_SPAN + 5.0
    stream = _stream(Role.SEND, at=start, path_rtt=calls.current)
    while stream.has_space():
        stream.write(bytes(CHUNK))
    for frame in [f for f in stream.poll(start) if f.main_purpose == "chunk"]:
        stream.on_reply(frame.cycle_id, _answer(frame), start + 0.2)
    assert stream.allowance == pytest.approx(17 * CHUNK, abs=1)
