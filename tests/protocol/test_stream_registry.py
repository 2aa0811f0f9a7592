"""The stream registry: routing of `##VirtualStream##` frames, and a sans-I/O round trip."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from itertools import count

import orjson
import pytest

from agent.errors import RemoteProtocolError
from agent.protocol.chunks import CLOSING, RawChunk
from agent.protocol.envelope import Envelope, decode_envelope, encode_envelope
from agent.protocol.settings import StreamSettings
from agent.protocol.stream_initiator import InitiatorState
from agent.protocol.stream_registry import StreamRegistry
from agent.protocol.stream_responder import ResponderStream, Role, StreamState

SETTINGS = StreamSettings(window=4, park_timeout=1.0, idle_timeout=10.0)


def registry(prefix: str) -> StreamRegistry:
    numbers = count(1)
    return StreamRegistry(SETTINGS, lambda: f"{prefix}{next(numbers)}")


def wire(env: Envelope) -> Envelope:
    """Through the codec, as over a websocket."""
    return decode_envelope(encode_envelope(env))


def test_frame_for_an_unknown_stream_is_echoed_as_read() -> None:
    """As the TS router: the frame's package comes back, response null and localData null."""
    frame = (
        b'{"method":"##VirtualStream##","request":{"streamId":"nope","cycleId":"c1",'
        b'"cycle":"request","mainPurpose":"keepAlive","keepAlive":true},"response":null}'
    )
    result = registry("b").on_frame(decode_envelope(frame), 0.0)
    assert result.reply is not None
    echo = encode_envelope(result.reply.envelope)
    assert orjson.loads(echo) == orjson.loads(frame) | {"localData": None}


def test_malformed_stream_package_is_dropped() -> None:
    """A stream frame whose package is invalid gets no answer."""
    env = Envelope("##VirtualStream##", {"streamId": "s", "cycle": "request"}, None)
    result = registry("b").on_frame(env, 0.0)
    assert (result.reply, bool(result.dropped)) == (None, True)


def test_answer_is_routed_to_its_stream_by_cycle_id() -> None:
    """An answer package completes the initiator cycle with the same cycleId."""
    a, b = registry("a"), registry("b")
    stream = a.open_initiator(Role.SEND)
    b.open_responder(stream.stream_id, Role.RECEIVE, 0.0)
    stream.arm(0.0)
    stream.close()
    for _ in range(2):  # the opening probe's answer invites the closing bit's chunk
        for env in a.poll(stream, 0.0):
            result = b.on_frame(wire(env), 0.0)
            assert result.reply is not None
            a.on_frame(wire(result.reply.envelope), 0.0)
    assert stream.state is InitiatorState.ENDED


def test_our_frame_echoed_back_breaks_our_stream() -> None:
    """A 3.3.0 responder answers read with response null: our read comes back, we break."""
    a = registry("a")
    stream = a.open_initiator(Role.RECEIVE, "theirs")
    stream.arm(0.0)
    for env in a.poll(stream, 0.0):
        a.on_frame(wire(env), 0.0)  # the peer sent our frame back untouched
    assert stream.state is InitiatorState.BROKEN


def test_duplicate_stream_id_is_refused() -> None:
    """Announcing a stream id already in use is a remote protocol error."""
    b = registry("b")
    b.open_responder("s", Role.RECEIVE, 0.0)
    with pytest.raises(RemoteProtocolError):
        b.open_responder("s", Role.RECEIVE, 0.0)


def test_finished_responder_is_removed_after_lingering() -> None:
    """expire() drops a drained, ended registration once it has been quiet long enough."""
    b = registry("b")
    stream = b.open_responder("s", Role.RECEIVE, 0.0)
    stream.abandon(0.0)
    b.expire(5.0)
    assert "s" in b.responders
    b.expire(10.5)
    assert "s" not in b.responders


def pump(a: StreamRegistry, b: StreamRegistry, now: float) -> int:
    """Deliver every frame the initiators of `a` want to send, and their answers; count them."""
    moved = 0
    for stream in list(a.initiators.values()):
        for env in a.poll(stream, now):
            result = b.on_frame(wire(env), now)
            if result.reply is not None:
                a.on_frame(wire(result.reply.envelope), now)
            moved += 1
    return moved


def test_slow_reader_bounds_the_receive_queue_below_twice_the_window() -> None:
    """A reader that never takes holds less than twice `window` chunks: the sender keeps a
    window of chunks in flight, stops at the first backpressure answer, and never pushes the
    responder past the bound at which it would break the stream."""
    a, b = registry("a"), registry("b")
    sender = a.open_initiator(Role.SEND)
    reader = b.open_responder(sender.stream_id, Role.RECEIVE, 0.0)
    sender.arm(0.0)
    written = 0
    now = 0.0
    for _ in range(200):
        while sender.has_space():
            sender.write(b"x" * 1000)
            written += 1
        pump(a, b, now)
        now += 0.01
        assert reader._backpressured() or len(reader._queue) < SETTINGS.window
        assert len(reader._queue) < 2 * SETTINGS.window
    # the sender's queue, plus the window in flight past the first backpressure answer
    assert written <= 3 * SETTINGS.window
    assert sender.state is InitiatorState.OPEN
    assert reader.state is StreamState.OPEN


def test_sans_io_round_trip_keeps_every_byte_in_both_directions() -> None:
    """Bytes cross intact both ways (initiator SEND, responder SEND) through the codec."""
    a, b = registry("a"), registry("b")
    upstream = bytes(range(256)) * 300
    up = a.open_initiator(Role.SEND)
    up_reader = b.open_responder(up.stream_id, Role.RECEIVE, 0.0)
    up.arm(0.0)
    down_writer = b.open_responder("down", Role.SEND, 0.0)
    down = a.open_initiator(Role.RECEIVE, "down")
    down.arm(0.0)
    chunks = [upstream[i : i + 5000] for i in range(0, len(upstream), 5000)]
    to_send, to_offer = list(chunks), list(chunks)
    got_up, got_down = bytearray(), bytearray()
    now, closed_up = 0.0, False
    while not (up.done and down.done):
        while to_send and up.has_space():
            up.write(to_send.pop(0))
        if not to_send and up.has_space() and not closed_up:
            up.close()
            closed_up = True
        while to_offer and down_writer.has_space():
            for released in down_writer.offer(to_offer.pop(0)):
                a.on_frame(wire(released.envelope), now)
        if not to_offer and down_writer.has_space() and down_writer.state is StreamState.OPEN:
            for released in down_writer.close():
                a.on_frame(wire(released.envelope), now)
        pump(a, b, now)
        while (item := up_reader.take()) not in (None, CLOSING):
            assert isinstance(item, bytes)
            got_up += item
        while (item := down.take()) not in (None, CLOSING):
            assert isinstance(item, bytes)
            got_down += item
        now += 0.01
        assert now < 60, "the round trip stalled"
    assert hashlib.sha256(got_up).digest() == hashlib.sha256(upstream).digest()
    assert hashlib.sha256(got_down).digest() == hashlib.sha256(upstream).digest()
    assert (up.broken, down.broken) == (False, False)
    assert up_reader.state is StreamState.ENDED
    assert down_writer.state is StreamState.ENDED
    assert isinstance(down_writer, ResponderStream)


# --- what the byte budget draws for, and what the receive budget counts ------------------------


def chunk_request(stream_id: str, **package: object) -> Envelope:
    body = {"streamId": stream_id, "cycleId": "k1", "cycle": "request", "mainPurpose": "chunk"}
    return Envelope("##VirtualStream##", body | package, None)


def test_a_chunk_frame_names_the_receiving_stream_that_keeps_it() -> None:
    streams = registry("b")
    stream = streams.open_responder("s1", Role.RECEIVE, 0.0)
    assert streams.chunk_keeper(chunk_request("s1")) is stream


def test_a_chunk_frame_of_a_stream_we_send_on_is_kept_by_none() -> None:
    streams = registry("b")
    streams.open_responder("s1", Role.SEND, 0.0)
    assert streams.chunk_keeper(chunk_request("s1")) is None


def test_a_chunk_frame_of_an_unknown_stream_is_kept_by_none() -> None:
    assert registry("b").chunk_keeper(chunk_request("nope")) is None


def test_a_frame_that_is_no_chunk_is_kept_by_none() -> None:
    streams = registry("b")
    streams.open_responder("s1", Role.RECEIVE, 0.0)
    assert streams.chunk_keeper(chunk_request("s1", mainPurpose="feedback")) is None


def test_a_malformed_chunk_frame_still_names_its_keeper() -> None:
    """The draw comes before the package is checked: a chunk frame without a cycle id is drawn
    for like any other (and then dropped by the routing)."""
    streams = registry("b")
    stream = streams.open_responder("s1", Role.RECEIVE, 0.0)
    env = chunk_request("s1", cycleId=None)
    assert streams.chunk_keeper(env) is stream
    assert streams.on_frame(env, 0.0).dropped


@pytest.mark.parametrize(
    ("purpose", "used"), [("chunk", "chunk"), ("feedback", "probe"), ("keepAlive", None)]
)
def test_a_chunk_or_a_probe_uses_up_its_streams_invitation(purpose: str, used: str) -> None:
    streams = registry("b")
    streams.open_responder("s1", Role.RECEIVE, 0.0)
    env = chunk_request("s1", mainPurpose=purpose, chunkData=[1], keepAlive=True)
    assert streams.on_frame(env, 0.0).used == used


def test_a_frame_behind_a_chunk_being_decoded_waits() -> None:
    streams = StreamRegistry(replace(SETTINGS, inline_decode_max=0), lambda: "id")
    streams.open_responder("s1", Role.RECEIVE, 0.0)
    raw = RawChunk("buffer", memoryview(b"[1]"), 60)
    first = streams.on_frame(chunk_request("s1", chunkData=raw), 0.0)
    second = streams.on_frame(chunk_request("s1", cycleId="k2", chunkData=[2]), 0.0)
    assert (first.waits, second.waits) == (False, True)
