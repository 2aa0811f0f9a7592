"""The responder side of a VirtualStream: answers as typedrequest 3.3.0, plus `read`."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson
import pytest

from agent.errors import InvalidState, RemoteProtocolError, StreamBroken
from agent.protocol.chunks import CLOSING, CLOSING_BIT, EncodedChunk, RawChunk, encode_chunk
from agent.protocol.envelope import Envelope
from agent.protocol.settings import StreamSettings
from agent.protocol.stream_frames import StreamPackage, package_from_json, stream_frame
from agent.protocol.stream_responder import (
    PendingChunk,
    ResponderStream,
    Role,
    StreamAnswer,
    StreamState,
)

WINDOW = 2
SETTINGS = StreamSettings(window=WINDOW, idle_timeout=10.0, park_timeout=1.0)


def responder(role: Role) -> ResponderStream:
    return ResponderStream("s1", role, SETTINGS, now=0.0)


def frame(purpose: str, cycle: str = "k1", **fields: Any) -> tuple[Envelope, StreamPackage]:
    package = StreamPackage("s1", cycle, "request", purpose, **fields)  # type: ignore[arg-type]
    return stream_frame(package), package


def send(stream: ResponderStream, purpose: str, now: float = 1.0, **fields: Any) -> Envelope:
    answer = stream.handle(*frame(purpose, **fields), now)
    assert answer is not None
    return answer.envelope


def envelopes(answers: list[StreamAnswer]) -> list[Envelope]:
    return [answer.envelope for answer in answers]


def wire(chunk_data: Any) -> Any:
    """What a peer parses out of a `chunkData` we send (`encode_chunk` writes JSON text)."""
    assert isinstance(chunk_data, EncodedChunk)
    return orjson.loads(chunk_data.json)


def chunk(data: bytes | None) -> dict[str, Any]:
    return {"chunk_data": CLOSING_BIT if data is None else encode_chunk(data)}


def test_keepalive_answer_has_the_ts_shape() -> None:
    """keepAlive is answered with our flag, next and backpressure; the request is echoed."""
    env, _ = frame("keepAlive", keep_alive=True)
    answer = responder(Role.RECEIVE).handle(env, package_from_json(env.request), 1.0)
    assert answer is not None
    assert answer.envelope == Envelope(
        "##VirtualStream##",
        env.request,
        {
            "streamId": "s1",
            "cycleId": "k1",
            "cycle": "response",
            "mainPurpose": "keepAlive",
            "keepAlive": True,
            "next": False,
            "backpressure": False,
        },
        is_reply=True,
    )


def test_feedback_answer_reports_next_and_backpressure() -> None:
    """feedback is answered with a feedback package."""
    answer = send(responder(Role.RECEIVE), "feedback", next=True, backpressure=False)
    assert answer.response["mainPurpose"] == "feedback"
    assert (answer.response["next"], answer.response["backpressure"]) == (False, False)


def test_chunk_answer_has_null_request_and_queues_the_bytes() -> None:
    """A chunk is answered with request null and a feedback package; its bytes are queued."""
    stream = responder(Role.RECEIVE)
    answer = send(stream, "chunk", **chunk(b"abc"))
    assert answer.request is None
    assert answer.response["mainPurpose"] == "feedback"
    assert stream.take() == b"abc"


def test_full_receive_queue_reports_backpressure() -> None:
    """Once `window` chunks wait, answers say backpressure true."""
    stream = responder(Role.RECEIVE)
    assert send(stream, "chunk", **chunk(b"a")).response["backpressure"] is False
    assert send(stream, "chunk", **chunk(b"b")).response["backpressure"] is True
    stream.take()
    assert send(stream, "feedback").response["backpressure"] is False


def test_sender_ignoring_backpressure_breaks_the_stream() -> None:
    """More than 2 x window queued chunks break the stream; memory stays bounded."""
    stream = responder(Role.RECEIVE)
    for _ in range(2 * WINDOW + 1):
        send(stream, "chunk", **chunk(b"x" * 10))
    assert stream.state is StreamState.BROKEN
    taken = [stream.take() for _ in range(2 * WINDOW)]
    assert taken == [b"x" * 10] * (2 * WINDOW)
    with pytest.raises(StreamBroken):
        stream.take()


def test_closing_bit_ends_the_stream() -> None:
    """The closing bit is queued after the data and ends the stream."""
    stream = responder(Role.RECEIVE)
    send(stream, "chunk", **chunk(b"a"))
    send(stream, "chunk", **chunk(None))
    assert stream.state is StreamState.ENDED
    assert [stream.take(), stream.take()] == [b"a", CLOSING]


def test_keepalive_answer_turns_false_after_the_end() -> None:
    """After the closing bit we answer keepAlive false so the initiator stops."""
    stream = responder(Role.RECEIVE)
    send(stream, "chunk", **chunk(None))
    assert send(stream, "keepAlive", keep_alive=True).response["keepAlive"] is False


def test_undecodable_chunk_breaks_the_stream() -> None:
    """A chunk that is no binary form breaks the stream."""
    stream = responder(Role.RECEIVE)
    send(stream, "chunk", chunk_data={"type": "Buffer", "data": [999]})
    with pytest.raises(StreamBroken, match="undecodable"):
        stream.take()


def test_initiator_stopping_before_the_end_breaks_the_stream() -> None:
    """keepAlive false before the closing bit means the initiator gave up."""
    stream = responder(Role.RECEIVE)
    send(stream, "keepAlive", keep_alive=False)
    with pytest.raises(StreamBroken, match="stopped"):
        stream.take()


def test_silence_longer_than_the_idle_timeout_breaks_the_stream() -> None:
    """No frame for idle_timeout seconds breaks an open stream (injected clock)."""
    stream = responder(Role.RECEIVE)
    send(stream, "keepAlive", now=5.0, keep_alive=True)
    stream.expire(15.0)
    before = stream.state
    stream.expire(15.1)
    assert (before, stream.state) == (StreamState.OPEN, StreamState.BROKEN)


def test_ended_stream_does_not_break_on_silence() -> None:
    """Final states do not move: an ended stream stays ended after the idle timeout."""
    stream = responder(Role.RECEIVE)
    send(stream, "chunk", **chunk(None))
    stream.expire(100.0)
    assert stream.state is StreamState.ENDED


def test_abandoned_stream_discards_chunks_and_answers_keepalive_false() -> None:
    """Nobody reads: chunks are dropped without backpressure and keepAlive is false."""
    stream = responder(Role.RECEIVE)
    stream.abandon(1.0)
    for _ in range(3 * WINDOW):
        assert send(stream, "chunk", **chunk(b"x")).response["backpressure"] is False
    assert send(stream, "keepAlive", keep_alive=True).response["keepAlive"] is False


def test_read_is_answered_with_the_next_chunk_and_next() -> None:
    """SEND role: read gets a chunk package with chunkData and next."""
    stream = responder(Role.SEND)
    stream.offer(b"one")
    answer = send(stream, "read")
    assert answer.response["mainPurpose"] == "chunk"
    assert wire(answer.response["chunkData"]) == {"type": "Buffer", "data": list(b"one")}
    assert answer.response["next"] is True  # open: more may come


def test_read_on_an_empty_open_stream_is_parked_until_data() -> None:
    """A read that finds nothing waits; the next offer returns its answer."""
    stream = responder(Role.SEND)
    assert stream.handle(*frame("read", cycle="r1"), 1.0) is None
    [released] = envelopes(stream.offer(b"late"))
    assert released.response["cycleId"] == "r1"
    assert wire(released.response["chunkData"])["data"] == list(b"late")


def test_parked_read_is_answered_empty_after_the_park_timeout() -> None:
    """Past park_timeout a parked read gets a feedback answer with next true."""
    stream = responder(Role.SEND)
    stream.handle(*frame("read", cycle="r1"), 1.0)
    assert stream.expire(1.5) == []
    [released] = envelopes(stream.expire(2.0))
    assert released.response["mainPurpose"] == "feedback"
    assert released.response["next"] is True


def held(cycle: str = "f1") -> ResponderStream:
    """A stream we receive whose reader is not ready, with one probe waiting on it."""
    stream = responder(Role.RECEIVE)
    stream.hold()
    assert stream.handle(*frame("feedback", cycle=cycle), 1.0) is None
    return stream


def test_a_probe_on_a_held_stream_waits_for_its_reader() -> None:
    """`read_now` answers the waiting probe: no backpressure, and it invites the next chunk."""
    stream = held()
    [answer] = stream.read_now()
    assert (answer.envelope.response["cycleId"], answer.envelope.response["backpressure"]) == (
        "f1",
        False,
    )
    assert answer.invites


def test_a_probe_on_a_full_queue_is_answered_at_once() -> None:
    """Only a held stream parks a probe: one whose queue is full says backpressure at once
    (its reader empties it within milliseconds; the sender probes again)."""
    stream = responder(Role.RECEIVE)
    send(stream, "chunk", **chunk(b"a"))
    send(stream, "chunk", cycle="k2", **chunk(b"b"))
    assert send(stream, "feedback", cycle="f1").response["backpressure"] is True


def test_a_waiting_probe_says_backpressure_after_the_park_timeout() -> None:
    """Still held at `park_timeout`, the probe is answered backpressure (it probes again)."""
    stream = held()
    assert stream.next_wakeup() == 1.0 + SETTINGS.park_timeout
    assert stream.expire(1.5) == []
    [answer] = stream.expire(2.0)
    assert answer.envelope.response["backpressure"] is True
    assert not answer.invites


def test_at_most_window_probes_wait_and_one_more_answers_the_oldest() -> None:
    """A peer that probes without waiting keeps at most `window` probes parked."""
    stream = held("f0")
    for index in range(1, WINDOW):
        assert stream.handle(*frame("feedback", cycle=f"f{index}"), 1.0) is None
    answer = stream.handle(*frame("feedback", cycle="over"), 1.0)
    assert answer is not None
    assert (answer.envelope.response["cycleId"], answer.envelope.response["backpressure"]) == (
        "f0",
        True,
    )


def test_abandoning_or_breaking_a_stream_answers_its_waiting_probes() -> None:
    """A probe never outlives its stream's reader: abandon and abort answer it."""
    abandoned, aborted = held(), held()
    assert [a.envelope.response["cycleId"] for a in abandoned.abandon(2.0)] == ["f1"]
    assert [a.envelope.response["cycleId"] for a in aborted.abort("local", 2.0)] == ["f1"]


def test_a_registration_with_a_waiting_probe_is_not_finished() -> None:
    """The stream stays registered while a probe waits on it, so its answer can still go."""
    stream = held()
    stream.handle(*frame("keepAlive", cycle="k", keep_alive=False), 2.0)  # broken, f1 waits
    assert stream.state is StreamState.BROKEN
    assert not stream.finished(100.0)
    assert [a.envelope.response["cycleId"] for a in stream.expire(100.0)] == ["f1"]
    assert stream.finished(100.0)


def test_closing_bit_is_delivered_last_then_the_stream_ends() -> None:
    """close() queues the closing bit after the data; delivering it ends the stream."""
    stream = responder(Role.SEND)
    stream.offer(b"a")
    stream.close()
    assert send(stream, "read").response["next"] is True
    last = send(stream, "read").response
    assert (last["chunkData"], last["next"]) == (CLOSING_BIT, False)
    assert stream.state is StreamState.ENDED
    assert send(stream, "keepAlive", keep_alive=True).response["keepAlive"] is False


def test_offer_on_a_full_send_queue_raises_and_changes_nothing() -> None:
    """The producer must wait for has_space(); offering anyway is refused."""
    stream = responder(Role.SEND)
    stream.offer(b"1")
    stream.offer(b"2")
    assert not stream.has_space()
    with pytest.raises(InvalidState):
        stream.offer(b"3")
    assert wire(send(stream, "read").response["chunkData"])["data"] == list(b"1")


def test_offer_after_abort_raises_stream_broken() -> None:
    """A broken send stream refuses more data."""
    stream = responder(Role.SEND)
    stream.abort("gone", 1.0)
    with pytest.raises(StreamBroken):
        stream.offer(b"x")


def test_finished_registration_lingers_then_may_go() -> None:
    """An ended stream is kept for `idle_timeout` seconds after its last frame."""
    stream = responder(Role.RECEIVE)
    send(stream, "chunk", now=1.0, **chunk(None))
    stream.take()
    assert not stream.finished(5.0)
    assert stream.finished(11.0)


# --- pipelined receive: large chunks are answered before they are decoded --------------------


def pipelined(window: int = 4, window_bytes: int = 1000) -> ResponderStream:
    """A receiving stream that leaves every raw chunk (any size) for the driver to decode."""
    settings = replace(SETTINGS, window=window, window_bytes=window_bytes, inline_decode_max=0)
    return ResponderStream("s1", Role.RECEIVE, settings, now=0.0)


def raw(data: bytes, frame_bytes: int = 100) -> dict[str, Any]:
    """A Buffer-form chunk as the frame splitter hands it over (`frame_bytes` of frame)."""
    text = orjson.dumps(list(data))
    return {"chunk_data": RawChunk("buffer", memoryview(text), frame_bytes)}


def received(stream: ResponderStream) -> list[PendingChunk]:
    return stream.take_to_decode()


def test_large_chunk_is_answered_before_it_is_decoded() -> None:
    """The answer goes out at once; the consumer sees nothing until the chunk is settled."""
    stream = pipelined()
    answer = send(stream, "chunk", **raw(b"ab"))
    assert answer.response["mainPurpose"] == "feedback"
    [pending] = received(stream)
    assert stream.take() is None
    stream.settle(pending, pending.decode(), 1.0)
    assert stream.take() == b"ab"


def settle_all(stream: ResponderStream) -> list[Envelope]:
    """Decode and settle every chunk handed out; the answers of the frames that waited."""
    answers: list[Envelope] = []
    while chunks := received(stream):
        for pending in chunks:
            stream.settle(pending, pending.decode(), 1.0)
        answers += envelopes(stream.release())
    return answers


def test_a_frame_arriving_while_a_chunk_decodes_waits_for_it() -> None:
    """The stream's next frame is answered only once the chunk before it is settled, in order."""
    stream = pipelined()
    send(stream, "chunk", **raw(b"1"))
    assert stream.handle(*frame("chunk", cycle="k2", **raw(b"2")), 1.0) is None
    assert stream.handle(*frame("keepAlive", cycle="k3", keep_alive=True), 1.0) is None
    assert stream.waiting == 2
    [first] = received(stream)
    stream.settle(first, first.decode(), 1.0)
    [chunk_answer] = envelopes(
        stream.release()
    )  # the second chunk: now it waits for its own decode
    assert chunk_answer.response["cycleId"] == "k2"
    [keepalive_answer] = settle_all(stream)
    assert keepalive_answer.response["cycleId"] == "k3"
    assert [stream.take(), stream.take(), stream.take()] == [b"1", b"2", None]


def test_a_chunk_that_does_not_decode_breaks_the_stream_after_the_good_ones() -> None:
    """What came before the bad chunk is delivered; it and what came after it are not, and the
    frame that waited for it already hears that the stream is over."""
    stream = pipelined()
    send(stream, "chunk", **raw(b"ok"))
    settle_all(stream)
    send(stream, "chunk", **{"chunk_data": RawChunk("buffer", memoryview(b"[1,256]"), 100)})
    assert stream.handle(*frame("chunk", cycle="k2", **raw(b"later")), 1.0) is None
    assert stream.handle(*frame("keepAlive", cycle="k3", keep_alive=True), 1.0) is None
    [bad] = received(stream)
    with pytest.raises(RemoteProtocolError) as caught:
        bad.decode()
    stream.settle(bad, caught.value, 1.0)
    assert stream.state is StreamState.BROKEN
    assert stream.broken_reason.startswith("undecodable chunk: ")
    _, keepalive = envelopes(stream.release())
    assert keepalive.response["keepAlive"] is False
    assert received(stream) == []  # the later chunk was dropped, not handed out
    with pytest.raises(RemoteProtocolError, match="dropped"):
        bad.decode()  # settled: nothing left to decode
    assert stream.take() == b"ok"
    with pytest.raises(StreamBroken, match="undecodable chunk"):
        stream.take()


def test_after_a_bad_chunk_the_next_keepalive_is_answered_false() -> None:
    """The peer's next frame after the bad chunk already hears that the stream is over."""
    stream = pipelined()
    send(stream, "chunk", **{"chunk_data": RawChunk("buffer", memoryview(b"[x]"), 100)})
    [bad] = received(stream)
    stream.settle(bad, RemoteProtocolError("chunkData.data is not a JSON array"), 1.0)
    assert send(stream, "keepAlive", keep_alive=True).response["keepAlive"] is False


def test_closing_bit_behind_an_undecoded_chunk_ends_once_it_decoded() -> None:
    """The closing bit waits for the chunk before it; then the stream ends."""
    stream = pipelined()
    send(stream, "chunk", **raw(b"last"))
    assert stream.handle(*frame("chunk", cycle="k2", **chunk(None)), 1.0) is None
    assert stream.state is StreamState.OPEN
    settle_all(stream)
    assert stream.state is StreamState.ENDED
    assert [stream.take(), stream.take()] == [b"last", CLOSING]


def test_a_break_drops_the_chunks_not_decoded_yet() -> None:
    """An idle timeout with an undecoded chunk queued delivers the decoded ones only, and
    answers what waited."""
    stream = pipelined()
    send(stream, "chunk", **raw(b"a"))
    settle_all(stream)
    send(stream, "chunk", cycle="k2", **raw(b"b"))
    assert stream.handle(*frame("keepAlive", cycle="k3", keep_alive=True), 1.0) is None
    [second] = received(stream)
    stream.expire(20.0)
    assert stream.state is StreamState.BROKEN
    [keepalive] = envelopes(stream.release())
    assert keepalive.response["keepAlive"] is False
    stream.settle(second, b"b", 20.0)  # too late: ignored
    assert stream.take() == b"a"
    with pytest.raises(StreamBroken):
        stream.take()


def test_a_flood_of_frames_behind_an_undecoded_chunk_breaks_the_stream() -> None:
    """More than 2 x window frames waiting for one chunk means the initiator does not wait
    for answers: the stream breaks."""
    stream = pipelined(window=2)
    send(stream, "chunk", **raw(b"a"))
    for cycle in ("b", "c", "d", "e"):
        stream.handle(*frame("keepAlive", cycle=cycle, keep_alive=True), 1.0)
    assert stream.state is StreamState.OPEN
    stream.handle(*frame("keepAlive", cycle="f", keep_alive=True), 1.0)
    assert stream.broken_reason == "the initiator ignored backpressure"
    assert len(stream.release()) == 5


def test_the_byte_window_reports_backpressure_at_window_bytes() -> None:
    """A queued chunk counts its frame until decoded, then its bytes; at `window_bytes`
    queued the answers report backpressure."""
    stream = pipelined(window=16, window_bytes=1000)
    big = bytes(600)
    assert send(stream, "chunk", **raw(big, frame_bytes=700)).response["backpressure"] is False
    assert stream.queued_bytes == 700
    settle_all(stream)
    assert stream.queued_bytes == 600
    assert send(stream, "chunk", cycle="k2", **raw(big)).response["backpressure"] is False
    settle_all(stream)
    assert send(stream, "chunk", cycle="k3", **raw(b"x")).response["backpressure"] is True
    settle_all(stream)
    stream.take()
    assert send(stream, "feedback", cycle="k4").response["backpressure"] is False


def test_a_sender_past_twice_the_byte_window_breaks_the_stream() -> None:
    """Chunks beyond 2 x window_bytes queued mean the initiator ignored backpressure."""
    stream = pipelined(window=16, window_bytes=1000)
    for cycle in ("a", "b", "c", "d", "e"):  # 4 x 600 queued, then the fifth breaks it
        send(stream, "chunk", cycle=cycle, **raw(bytes(600)))
        settle_all(stream)
    assert stream.state is StreamState.BROKEN
    assert stream.broken_reason == "the initiator ignored backpressure"


def test_small_chunks_are_still_decoded_at_once() -> None:
    """Below `inline_decode_max` a raw chunk is decoded on arrival, as before."""
    stream = responder(Role.RECEIVE)
    send(stream, "chunk", **{"chunk_data": RawChunk("buffer", memoryview(b"[5]"), 100)})
    assert stream.take_to_decode() == []
    assert stream.take() == b"\x05"


# --- what the byte budget draws for -----------------------------------------------------------


def test_a_stream_we_receive_on_keeps_its_chunks() -> None:
    assert responder(Role.RECEIVE).keeps_chunks


def test_a_stream_we_send_on_keeps_no_chunks() -> None:
    assert not responder(Role.SEND).keeps_chunks


def test_a_stream_that_is_over_keeps_no_chunks() -> None:
    stream = responder(Role.RECEIVE)
    stream.abort("the test stopped it", 1.0)
    assert not stream.keeps_chunks
