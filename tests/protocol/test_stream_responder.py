"""The responder side of a VirtualStream: answers as typedrequest 3.3.0, plus `read`."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from agent.errors import InvalidState, RemoteProtocolError, StreamBroken
from agent.protocol.chunks import CLOSING, CLOSING_BIT, EncodedChunk, RawChunk, encode_chunk
from agent.protocol.envelope import Envelope
from agent.protocol.stream_frames import StreamPackage, package_from_json, stream_frame
from agent.protocol.stream_responder import PendingChunk, ResponderStream, Role, StreamState

WINDOW = 2


def responder(role: Role) -> ResponderStream:
    return ResponderStream("s1", role, now=0.0, window=WINDOW, idle_timeout=10.0, park_timeout=1.0)


def frame(purpose: str, cycle: str = "k1", **fields: Any) -> tuple[Envelope, StreamPackage]:
    package = StreamPackage("s1", cycle, "request", purpose, **fields)  # type: ignore[arg-type]
    return stream_frame(package), package


def send(stream: ResponderStream, purpose: str, now: float = 1.0, **fields: Any) -> Envelope:
    answer = stream.handle(*frame(purpose, **fields), now)
    assert answer is not None
    return answer


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
    assert answer == Envelope(
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
    released = stream.offer(b"late")
    assert released is not None
    assert released.response["cycleId"] == "r1"
    assert wire(released.response["chunkData"])["data"] == list(b"late")


def test_parked_read_is_answered_empty_after_the_park_timeout() -> None:
    """Past park_timeout a parked read gets a feedback answer with next true."""
    stream = responder(Role.SEND)
    stream.handle(*frame("read", cycle="r1"), 1.0)
    assert stream.expire(1.5) is None
    released = stream.expire(2.0)
    assert released is not None
    assert released.response["mainPurpose"] == "feedback"
    assert released.response["next"] is True


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
    """An ended stream is kept for `linger` seconds after its last frame."""
    stream = responder(Role.RECEIVE)
    send(stream, "chunk", now=1.0, **chunk(None))
    stream.take()
    assert not stream.finished(5.0, linger=10.0)
    assert stream.finished(11.0, linger=10.0)


# --- pipelined receive: large chunks are answered before they are decoded --------------------


def pipelined(window: int = 4, window_bytes: int = 1000) -> ResponderStream:
    """A receiving stream that leaves every raw chunk (any size) for the driver to decode."""
    return ResponderStream(
        "s1",
        Role.RECEIVE,
        now=0.0,
        window=window,
        idle_timeout=10.0,
        park_timeout=1.0,
        window_bytes=window_bytes,
        inline_decode_max=0,
    )


def raw(data: bytes, frame_bytes: int = 100) -> dict[str, Any]:
    """A Buffer-form chunk as the frame splitter hands it over (`frame_bytes` of frame)."""
    text = orjson.dumps(list(data))
    return {"chunk_data": RawChunk("buffer", memoryview(text), frame_bytes)}


def received(stream: ResponderStream) -> list[PendingChunk]:
    chunks, stream.received[:] = list(stream.received), []
    return chunks


def test_large_chunk_is_answered_before_it_is_decoded() -> None:
    """The answer goes out at once; the consumer sees nothing until the chunk is settled."""
    stream = pipelined()
    answer = send(stream, "chunk", **raw(b"ab"))
    assert answer.response["mainPurpose"] == "feedback"
    [pending] = received(stream)
    assert stream.take() is None
    stream.settle(pending, pending.decode(), 1.0)
    assert stream.take() == b"ab"


def test_chunks_are_delivered_in_order_whatever_order_they_settle_in() -> None:
    """A later chunk decoded first waits behind the earlier one."""
    stream = pipelined()
    send(stream, "chunk", **raw(b"1"))
    send(stream, "chunk", **raw(b"2"))
    first, second = received(stream)
    stream.settle(second, second.decode(), 1.0)
    assert stream.take() is None
    stream.settle(first, first.decode(), 1.0)
    assert [stream.take(), stream.take(), stream.take()] == [b"1", b"2", None]


def test_a_chunk_that_does_not_decode_breaks_the_stream_after_the_good_ones() -> None:
    """What came before the bad chunk is delivered; it and what came after it are not."""
    stream = pipelined()
    send(stream, "chunk", **raw(b"ok"))
    bad = {"chunk_data": RawChunk("buffer", memoryview(b"[1,256]"), 100)}
    send(stream, "chunk", **bad)
    send(stream, "chunk", **raw(b"later"))
    good, broken, later = received(stream)
    stream.settle(good, good.decode(), 1.0)
    with pytest.raises(RemoteProtocolError) as caught:
        broken.decode()
    stream.settle(broken, caught.value, 1.0)
    assert stream.state is StreamState.BROKEN
    assert stream.broken_reason.startswith("undecodable chunk: ")
    with pytest.raises(RemoteProtocolError, match="dropped"):
        later.decode()  # dropped with the stream: nothing left to decode
    stream.settle(later, b"later", 1.0)  # too late: ignored
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


def test_closing_bit_behind_undecoded_chunks_ends_once_they_decoded() -> None:
    """The stream ends only when every chunk before the closing bit is settled."""
    stream = pipelined()
    send(stream, "chunk", **raw(b"last"))
    send(stream, "chunk", **chunk(None))
    assert stream.state is StreamState.OPEN
    send(stream, "chunk", cycle="k9", **raw(b"after the end"))  # dropped, as after an end
    [pending] = received(stream)
    stream.settle(pending, pending.decode(), 2.0)
    assert stream.state is StreamState.ENDED
    assert [stream.take(), stream.take()] == [b"last", CLOSING]


def test_a_break_drops_the_chunks_not_decoded_yet() -> None:
    """An idle timeout with an undecoded chunk queued delivers the decoded ones only."""
    stream = pipelined()
    send(stream, "chunk", **raw(b"a"))
    send(stream, "chunk", **raw(b"b"))
    first, second = received(stream)
    stream.settle(first, first.decode(), 1.0)
    stream.expire(20.0)
    assert stream.state is StreamState.BROKEN
    stream.settle(second, b"b", 20.0)
    assert stream.take() == b"a"
    with pytest.raises(StreamBroken):
        stream.take()


def test_the_byte_window_reports_backpressure_at_window_bytes_of_frames() -> None:
    """Queued frames count their size until decoded, then their bytes."""
    stream = pipelined(window=16, window_bytes=1000)
    assert send(stream, "chunk", **raw(b"x", frame_bytes=600)).response["backpressure"] is False
    assert send(stream, "chunk", **raw(b"y", frame_bytes=600)).response["backpressure"] is True
    for pending in received(stream):
        stream.settle(pending, pending.decode(), 1.0)
    assert send(stream, "feedback").response["backpressure"] is False


def test_a_sender_past_twice_the_byte_window_breaks_the_stream() -> None:
    """Frames beyond 2 x window_bytes queued mean the initiator ignored backpressure."""
    stream = pipelined(window=16, window_bytes=1000)
    for cycle in ("a", "b", "c", "d", "e"):
        send(stream, "chunk", cycle=cycle, **raw(b"z", frame_bytes=600))
    assert stream.state is StreamState.BROKEN
    assert stream.broken_reason == "the initiator ignored backpressure"


def test_small_chunks_are_still_decoded_at_once() -> None:
    """Below `inline_decode_max` a raw chunk is decoded on arrival, as before."""
    stream = responder(Role.RECEIVE)
    send(stream, "chunk", **{"chunk_data": RawChunk("buffer", memoryview(b"[5]"), 100)})
    assert stream.received == []
    assert stream.take() == b"\x05"
