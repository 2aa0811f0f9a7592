"""Nothing a peer sends makes the connection raise or send bytes that are not JSON: frames past
the depth bound, stream markers nested deep, undecodable chunk payloads echoed, and any JSON
of any depth, size and type (a property test)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from agent.protocol.connection import Connection, ConnectionSettings, RequestReceived
from agent.protocol.envelope import MAX_DEPTH, STREAM_METHOD
from tests.protocol._hostile import Driver, deep, frames

METHODS = ("echo", "pushClusterConfig")


def connection() -> Connection:
    return Connection(
        METHODS, ConnectionSettings(), new_id=iter(f"id{n}" for n in range(99)).__next__
    )


def dumps_deep(depth: int, inner: bytes = b"1") -> bytes:
    """`depth` nested arrays around `inner`, written by hand (orjson writes only 255 levels)."""
    return b"[" * depth + inner + b"]" * depth


def request_frame(method: str, body: bytes, corr: str = "c1") -> bytes:
    return (
        b'{"method":"' + method.encode() + b'","request":{"x":' + body + b'},"response":null,'
        b'"correlation":{"id":"' + corr.encode() + b'","phase":"request"}}'
    )


def served(conn: Connection) -> list[dict[str, Any]]:
    """Answer every request `{}` as a handler would, then what was sent (each frame parsed)."""
    for event in conn.events_received():
        if isinstance(event, RequestReceived):
            conn.respond(event.request_id, {}, 0.0)
    return [orjson.loads(frame) for frame in conn.data_to_send()]


MARKER = b'{"_isVirtualStream":true,"streamId":"s1"}'


class TestDepthBound:
    @pytest.mark.parametrize("method", ["echo", "pushClusterConfig", "nobodyRoutesThis"])
    @pytest.mark.parametrize("depth", [MAX_DEPTH, 253, 300, 1000])
    @pytest.mark.parametrize("inner", [b"1", MARKER], ids=["value", "marker"])
    def test_a_request_past_the_bound_is_refused_without_its_body(
        self, method: str, depth: int, inner: bytes
    ) -> None:
        """Any method, any depth past the bound, a marker at the bottom or not: one
        `invalid-request` answer, `request: null`, and nothing raises."""
        conn = connection()
        conn.receive_frame(request_frame(method, dumps_deep(depth, inner)), 0.0)
        [answer] = served(conn)
        assert answer["correlation"] == {"id": "c1", "phase": "response"}
        assert answer["request"] is None
        assert answer["error"]["data"] == {"code": "invalid-request", "retryable": False}
        assert f"deeper than {MAX_DEPTH} levels" in answer["error"]["text"]
        assert conn.in_flight == 0

    def test_a_request_at_the_bound_is_served_and_echoed(self) -> None:
        """The envelope, `request`, `x` and 125 arrays: 128 levels, taken and echoed whole."""
        conn = connection()
        conn.receive_frame(request_frame("echo", dumps_deep(MAX_DEPTH - 3)), 0.0)
        [answer] = served(conn)
        assert answer["response"] == {}
        assert answer["request"] == {"x": deep(1, MAX_DEPTH - 3)}

    @pytest.mark.parametrize("depth", [253, 300, 1000])
    def test_a_stream_frame_past_the_bound_is_dropped(self, depth: int) -> None:
        """A `##VirtualStream##` frame for an unknown stream, nested deep: no correlation to
        answer, so it is dropped; it used to be echoed and the echo failed to encode."""
        conn = connection()
        frame = (
            b'{"method":"##VirtualStream##","request":{"streamId":"nobody","cycleId":"k1",'
            b'"cycle":"request","mainPurpose":"keepAlive","x":' + dumps_deep(depth) + b"}}"
        )
        conn.receive_frame(frame, 0.0)
        assert conn.data_to_send() == []

    def test_a_frame_past_orjsons_read_limit_is_dropped(self) -> None:
        """Past 1,024 levels the frame is no JSON orjson reads: dropped, nothing raises."""
        conn = connection()
        conn.receive_frame(request_frame("echo", dumps_deep(5000)), 0.0)
        assert conn.data_to_send() == []


def stream_frame(stream_id: str, purpose: str, chunk: bytes, cycle: str = "k1") -> bytes:
    return (
        b'{"method":"##VirtualStream##","request":{"streamId":"' + stream_id.encode() + b'",'
        b'"cycleId":"'
        + cycle.encode()
        + b'","cycle":"request","mainPurpose":"'
        + purpose.encode()
        + b'","keepAlive":true,"chunkData":'
        + chunk
        + b'},"response":null}'
    )


BAD_CHUNKS = [
    b'{"type":"Buffer","data":[1,\xff\xfe,2]}',
    b'{"type":"EncodedBuffer","data":"base64:\xff\xfe"}',
]


class TestAnswersCarryNoPayload:
    @pytest.mark.parametrize("chunk", BAD_CHUNKS, ids=["buffer", "base64"])
    @pytest.mark.parametrize("purpose", ["keepAlive", "feedback", "read", "start", "end", "chunk"])
    def test_an_unknown_streams_echo_is_json_without_the_payload(
        self, purpose: str, chunk: bytes
    ) -> None:
        """The one echo of an unknown stream's frame carries its package, never its bytes."""
        conn = connection()
        conn.receive_frame(stream_frame("nobody", purpose, chunk), 0.0)
        [echo] = [orjson.loads(frame) for frame in conn.data_to_send()]
        assert echo == {
            "method": STREAM_METHOD,
            "request": {
                "streamId": "nobody",
                "cycleId": "k1",
                "cycle": "request",
                "mainPurpose": purpose,
                "keepAlive": True,
            },
            "response": None,
            "localData": None,
        }

    @pytest.mark.parametrize("chunk", BAD_CHUNKS, ids=["buffer", "base64"])
    @pytest.mark.parametrize("purpose", ["keepAlive", "feedback", "read", "start", "end"])
    def test_a_live_streams_answer_is_json_without_the_payload(
        self, purpose: str, chunk: bytes
    ) -> None:
        """keepAlive/feedback/read/start/end on a stream we read echo the package as we read it;
        the payload the peer put into the frame stays out of the answer."""
        conn = connection()
        conn.receive_frame(request_frame("echo", MARKER), 0.0)
        assert [type(e) for e in conn.events_received()] == [RequestReceived]
        conn.receive_frame(stream_frame("s1", purpose, chunk), 0.0)
        [answer] = [orjson.loads(frame) for frame in conn.data_to_send()]
        assert "chunkData" not in answer["request"]
        assert answer["request"]["cycleId"] == answer["response"]["cycleId"] == "k1"


class TestPackageFieldsOfAnyType:
    """A stream package field of any JSON type is refused like any malformed package: the
    frame is dropped or answered, never raised out of the connection. (Found by the guided fuzz
    target: `"mainPurpose": {}` raised `TypeError: unhashable type` from the set lookup.)"""

    FIELDS = ("streamId", "cycleId", "cycle", "mainPurpose", "keepAlive", "next", "backpressure")
    VALUES = ({}, [], {"a": [1]}, [["x"]], 1, 1.5, None, True, "", "x")

    @pytest.mark.parametrize("field", FIELDS)
    @pytest.mark.parametrize("value", VALUES, ids=repr)
    @pytest.mark.parametrize("stream_id", ["s1", "nobody"], ids=["live stream", "unknown stream"])
    def test_the_frame_is_answered_or_dropped_never_raised(
        self, field: str, value: Any, stream_id: str
    ) -> None:
        conn = connection()
        conn.receive_frame(request_frame("echo", MARKER), 0.0)
        conn.events_received()
        package: dict[str, Any] = {
            "streamId": stream_id,
            "cycleId": "k1",
            "cycle": "request",
            "mainPurpose": "feedback",
            field: value,
        }
        frame = {"method": STREAM_METHOD, "request": package, "response": None}
        conn.receive_frame(orjson.dumps(frame), 0.0)
        for sent in conn.data_to_send():
            assert isinstance(orjson.loads(sent), dict)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.lists(frames(), min_size=1, max_size=8))
def test_no_frame_makes_the_connection_raise_or_answer_twice(batch: list[bytes]) -> None:
    """Any JSON of any depth, size and type, any envelope, stream frame or raw bytes:
    receive_frame never raises, every frame sent is UTF-8 JSON, each request correlation is
    answered at most once per time it was asked."""
    driver = Driver()
    for frame in batch:
        driver.feed(frame)
