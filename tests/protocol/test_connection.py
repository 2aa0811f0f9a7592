"""The sans-I/O connection: intake rules, calls, streams and time, with no transport at all.

Every test feeds frames and `now` into `Connection`s and reads what comes out
(`data_to_send()`, `events_received()`); two connections are joined by `Wire`, which moves
frames between them until both are quiet.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import replace
from itertools import count
from typing import Any, ClassVar

import orjson
import pytest

from agent.errors import (
    CallFailed,
    CallTimeout,
    InvalidState,
    LocalProtocolError,
    RemoteProtocolError,
    RestoreNotFound,
    SessionClosed,
    StreamBroken,
)
from agent.protocol.admission import Admission, stream_class
from agent.protocol.chunks import CLOSING
from agent.protocol.connection import (
    MAX_CHUNK,
    CallErrored,
    ChunkToDecode,
    Completed,
    Connection,
    ConnectionSettings,
    ConnectionState,
    RequestReceived,
    StreamBroke,
    StreamChanged,
    StreamEnded,
    StreamSettings,
)
from agent.protocol.stream_registry import ECHO_MEMORY

STREAMS = StreamSettings(park_timeout=1.0, idle_timeout=10.0, window=4)


def connection(
    methods: tuple[str, ...] = ("echo",), prefix: str = "id", **changes: Any
) -> Connection:
    """A connection on `STREAMS`; `changes` name fields of `StreamSettings` or of
    `ConnectionSettings`."""
    numbers = count(1)
    streams = {k: v for k, v in changes.items() if k in StreamSettings.__dataclass_fields__}
    own = {k: v for k, v in changes.items() if k not in streams}
    settings = ConnectionSettings(streams=replace(STREAMS, **streams), **own)
    return Connection(methods, settings, new_id=lambda: f"{prefix}{next(numbers)}")


def request(method: str, body: Any, corr: str = "c1") -> bytes:
    frame = {"method": method, "request": body, "response": None}
    return orjson.dumps(frame | {"correlation": {"id": corr, "phase": "request"}})


def sent(conn: Connection) -> list[dict[str, Any]]:
    return [orjson.loads(frame) for frame in conn.data_to_send()]


def requests(conn: Connection) -> list[RequestReceived]:
    return [e for e in conn.events_received() if isinstance(e, RequestReceived)]


def marker(stream_id: str) -> dict[str, Any]:
    return {"_isVirtualStream": True, "streamId": stream_id}


def stray(stream_id: str = "nobody", cycle_id: str = "k1") -> bytes:
    """A keep-alive for a stream nobody registered."""
    package = {
        "streamId": stream_id,
        "cycleId": cycle_id,
        "cycle": "request",
        "mainPurpose": "keepAlive",
        "keepAlive": True,
    }
    return orjson.dumps({"method": "##VirtualStream##", "request": package, "response": None})


class Wire:
    """Two connections joined in memory; `handle` answers the right side's requests."""

    def __init__(
        self,
        left: Connection,
        right: Connection,
        handle: Callable[[Connection, RequestReceived], None] | None = None,
    ) -> None:
        self.left, self.right = left, right
        self.handle = handle
        self.moved = 0
        self.events: dict[int, list[Any]] = {id(left): [], id(right): []}

    def pump(self, now: float, *, limit: int = 100_000) -> int:
        """Move frames both ways until neither side has anything to send; frames moved."""
        moved = 0
        while True:
            progress = False
            for source, target in ((self.left, self.right), (self.right, self.left)):
                for frame in source.data_to_send():
                    target.receive_frame(frame, now)
                    moved += 1
                    progress = True
                for conn in (self.left, self.right):
                    for event in conn.events_received():
                        if isinstance(event, RequestReceived) and self.handle is not None:
                            self.handle(conn, event)
                        else:
                            self.events[id(conn)].append(event)
            if not progress:
                self.moved += moved
                return moved
            assert moved < limit, "the two connections never went quiet"


class TestIntake:
    def test_a_routed_request_becomes_a_request_received_event(self) -> None:
        """A request for a routed method is handed out, and nothing is answered yet."""
        conn = connection()
        conn.receive_frame(request("echo", {"value": 1}), 0.0)
        assert requests(conn) == [RequestReceived(1, "echo", {"value": 1}, ())]
        assert conn.data_to_send() == []
        assert conn.in_flight == 1

    def test_respond_sends_the_reply_as_the_typedrequest_router_does(self) -> None:
        """The reply echoes the request, flips the phase, sets the response and localData null."""
        conn = connection()
        conn.receive_frame(request("echo", {"value": 1}), 0.0)
        [event] = requests(conn)
        assert conn.respond(event.request_id, {"echoed": 1}, 0.0) == []
        assert sent(conn) == [
            {
                "method": "echo",
                "request": {"value": 1},
                "response": {"echoed": 1},
                "correlation": {"id": "c1", "phase": "response"},
                "localData": None,
            }
        ]
        assert conn.in_flight == 0

    def test_refuse_sends_the_errors_text_and_wire_data(self) -> None:
        """An AgentError ends the request with error {text, data: {code, retryable}}."""
        conn = connection()
        conn.receive_frame(request("echo", {}), 0.0)
        [event] = requests(conn)
        conn.refuse(event.request_id, RestoreNotFound("no restore r1 on node n1"), 0.0)
        [out] = sent(conn)
        assert (out["response"], out["error"]) == (
            None,
            {
                "text": "no restore r1 on node n1",
                "data": {"code": "restore-not-found", "retryable": False},
            },
        )

    def test_an_unrouted_method_gets_the_typedrequest_text_and_unknown_method(self) -> None:
        """No route: the TS router's text, code unknown-method, no event."""
        conn = connection()
        conn.receive_frame(request("nope", {}), 0.0)
        [out] = sent(conn)
        assert out["error"] == {
            "text": "There is no available method for this call on the server side",
            "data": {"code": "unknown-method", "retryable": False},
        }
        assert requests(conn) == []

    def test_a_request_body_that_is_no_object_is_refused(self) -> None:
        """`request` must be a JSON object: anything else is invalid-request."""
        conn = connection()
        conn.receive_frame(request("echo", [1]), 0.0)
        assert sent(conn)[0]["error"]["data"] == {"code": "invalid-request", "retryable": False}

    def test_after_stop_intake_new_requests_are_shutting_down_and_running_ones_answer(
        self,
    ) -> None:
        """Stopped intake refuses new requests, retryable; one already running still answers."""
        conn = connection()
        conn.receive_frame(request("echo", {}, "running"), 0.0)
        [running] = requests(conn)
        conn.stop_intake()
        conn.receive_frame(request("echo", {}, "late"), 0.0)
        conn.respond(running.request_id, {}, 0.0)
        late, answered = sent(conn)
        assert late["error"]["data"] == {"code": "shutting-down", "retryable": True}
        assert (answered["correlation"]["id"], answered["response"]) == ("running", {})

    def test_a_request_beyond_the_concurrency_bound_is_asked_to_retry(self) -> None:
        """At `max_concurrent_requests` in flight, one more is answered `retry`, never `error`."""
        conn = connection(max_concurrent_requests=2, busy_retry_ms=250)
        for corr in ("c1", "c2", "c3"):
            conn.receive_frame(request("echo", {}, corr), 0.0)
        assert [event.request_id for event in requests(conn)] == [1, 2]
        [busy] = sent(conn)
        assert busy["correlation"] == {"id": "c3", "phase": "response"}
        assert (busy["response"], "error" in busy) == (None, False)
        assert busy["retry"]["waitForMs"] == 250

    def test_a_flood_holds_no_more_requests_than_the_bound(self) -> None:
        """Ten thousand requests at once: the bound holds, each extra one gets one small answer."""
        conn = connection(max_concurrent_requests=8)
        for number in range(10_000):
            conn.receive_frame(request("echo", {"n": number}, f"c{number}"), 0.0)
        assert conn.in_flight == 8
        answers = sent(conn)
        assert len(answers) == 10_000 - 8
        assert all("retry" in answer for answer in answers)

    def test_ending_a_request_frees_its_slot(self) -> None:
        """Once a request is answered, the next one is handled again."""
        conn = connection(max_concurrent_requests=1)
        conn.receive_frame(request("echo", {}, "c1"), 0.0)
        [first] = requests(conn)
        conn.respond(first.request_id, {}, 0.0)
        conn.receive_frame(request("echo", {}, "c2"), 0.0)
        assert [event.request_id for event in requests(conn)] == [2]

    def test_a_malformed_envelope_that_names_method_and_id_is_answered(self) -> None:
        """A request frame with a bad envelope field gets an invalid-request answer."""
        conn = connection()
        frame = {"method": "echo", "request": {}, "retry": 5}
        conn.receive_frame(
            orjson.dumps(frame | {"correlation": {"id": "c9", "phase": "request"}}), 0.0
        )
        [out] = sent(conn)
        assert out["correlation"] == {"id": "c9", "phase": "response"}
        assert out["error"]["data"]["code"] == "invalid-request"

    @pytest.mark.parametrize(
        "frame",
        [b"\x00 not json", b"[1, 2]", b'{"method": "echo", "request": {}}', b'{"request": {}}'],
        ids=["garbage", "not-an-object", "no-phase", "no-method"],
    )
    def test_a_frame_that_cannot_be_answered_is_dropped(self, frame: bytes) -> None:
        """Garbage and phase-less frames get no answer and no event; the connection goes on."""
        conn = connection()
        conn.receive_frame(frame, 0.0)
        assert (conn.data_to_send(), conn.events_received()) == ([], [])
        conn.receive_frame(request("echo", {}), 0.0)
        assert len(requests(conn)) == 1


def chunk_frame(stream_id: str, cycle_id: str, array: bytes) -> bytes:
    """A Buffer-form chunk frame, as a typedrequest initiator writes it."""
    return (
        b'{"method":"##VirtualStream##","request":{"streamId":"' + stream_id.encode()
        + b'","cycleId":"' + cycle_id.encode()
        + b'","cycle":"request","mainPurpose":"chunk","chunkData":{"type":"Buffer","data":'
        + array + b'}},"response":null}'
    )  # fmt: skip


class TestPipelinedChunks:
    def test_a_large_chunk_is_answered_and_handed_out_to_decode(self) -> None:
        """The chunk's answer goes out at once; a `ChunkToDecode` event carries its token, and
        `settle_chunk` makes its bytes readable (a stream change for its waiters)."""
        conn = connection(inline_decode_max=0)
        conn.receive_frame(request("echo", {"a": marker("s1")}), 0.0)
        [event] = requests(conn)
        conn.receive_request_stream(event.request_id, "s1", 0.0)
        conn.receive_frame(chunk_frame("s1", "k1", b"[1,2]"), 0.0)
        [answer] = sent(conn)
        assert answer["response"]["mainPurpose"] == "feedback"
        [received] = [e for e in conn.events_received() if isinstance(e, ChunkToDecode)]
        assert received.stream_id == "s1"
        assert conn.take("s1", 0.0) is None
        conn.settle_chunk("s1", received.token, received.token.decode(), 0.1)
        assert StreamChanged("s1") in conn.events_received()
        assert conn.take("s1", 0.1) == b"\x01\x02"

    def test_a_chunk_that_does_not_decode_breaks_its_stream(self) -> None:
        """Settling with the decoder's error breaks the stream, naming the chunk."""
        conn = connection(inline_decode_max=0)
        conn.receive_frame(request("echo", {"a": marker("s1")}), 0.0)
        [event] = requests(conn)
        conn.receive_request_stream(event.request_id, "s1", 0.0)
        conn.receive_frame(chunk_frame("s1", "k1", b"[1,300]"), 0.0)
        [received] = [e for e in conn.events_received() if isinstance(e, ChunkToDecode)]
        with pytest.raises(RemoteProtocolError) as caught:
            received.token.decode()
        conn.settle_chunk("s1", received.token, caught.value, 0.1)
        with pytest.raises(StreamBroken, match="undecodable chunk"):
            conn.take("s1", 0.1)

    def test_only_the_streams_own_frames_wait_for_its_chunk_to_decode(self) -> None:
        """While a chunk of s1 decodes, s1's next frame waits for it; a request and a frame of
        another stream are answered at once. Settling answers the waiting frame."""
        conn = connection(inline_decode_max=0)
        conn.receive_frame(request("echo", {"a": marker("s1"), "b": marker("s2")}), 0.0)
        requests(conn)
        conn.receive_frame(chunk_frame("s1", "k1", b"[1]"), 0.0)
        [received] = [e for e in conn.events_received() if isinstance(e, ChunkToDecode)]
        sent(conn)
        conn.receive_frame(stray("s1", "k2"), 0.0)
        assert sent(conn) == []
        conn.receive_frame(stray("s2", "k3"), 0.0)
        conn.receive_frame(request("echo", {}, "c2"), 0.0)
        [answer] = sent(conn)
        assert answer["response"]["streamId"] == "s2"
        assert len(requests(conn)) == 1
        conn.settle_chunk("s1", received.token, b"\x01", 0.1)
        [waited] = sent(conn)
        assert (waited["response"]["cycleId"], waited["response"]["keepAlive"]) == ("k2", True)

    def test_small_chunks_are_decoded_on_arrival(self) -> None:
        """Below `inline_decode_max` no event: the bytes are there at once."""
        conn = connection()
        conn.receive_frame(request("echo", {"a": marker("s1")}), 0.0)
        [event] = requests(conn)
        conn.receive_request_stream(event.request_id, "s1", 0.0)
        conn.receive_frame(chunk_frame("s1", "k1", b"[7]"), 0.0)
        assert not [e for e in conn.events_received() if isinstance(e, ChunkToDecode)]
        assert conn.take("s1", 0.0) == b"\x07"

    def test_a_settled_chunk_of_a_forgotten_stream_is_ignored(self) -> None:
        """The session closed while the chunk decoded: settling changes nothing."""
        conn = connection(inline_decode_max=0)
        conn.receive_frame(request("echo", {"a": marker("s1")}), 0.0)
        conn.receive_frame(chunk_frame("s1", "k1", b"[1]"), 0.0)
        [received] = [e for e in conn.events_received() if isinstance(e, ChunkToDecode)]
        conn.connection_lost(SessionClosed(1006, "gone"), 0.05)
        conn.settle_chunk("s1", received.token, b"\x01", 0.1)
        conn.settle_chunk("nobody", received.token, b"\x01", 0.1)
        assert conn.data_to_send() == []


class TestRequestStreams:
    def test_each_marker_in_a_request_registers_a_stream_its_handler_reads(self) -> None:
        """The event lists the request's stream ids; the handler opens each once."""
        conn = connection()
        conn.receive_frame(request("echo", {"a": marker("s1"), "b": [marker("s2")]}), 0.0)
        [event] = requests(conn)
        assert event.stream_ids == ("s1", "s2")
        conn.receive_request_stream(event.request_id, "s1", 0.0)
        assert conn.take("s1", 0.0) is None  # open, nothing arrived yet
        with pytest.raises(LocalProtocolError, match="not an unopened stream"):
            conn.receive_request_stream(event.request_id, "s1", 0.0)

    def test_a_duplicate_stream_id_refuses_the_request_and_unregisters_its_streams(self) -> None:
        """Rollback: a request whose second marker repeats an id leaves no stream behind."""
        conn = connection()
        conn.receive_frame(request("echo", {"a": marker("s1")}, "c1"), 0.0)
        conn.receive_frame(request("echo", {"a": marker("s2"), "b": marker("s1")}, "c2"), 0.0)
        assert len(requests(conn)) == 1
        [refused] = sent(conn)
        assert refused["error"]["data"]["code"] == "invalid-request"
        conn.receive_frame(stray("s2", "k1"), 0.0)  # s2 must be unknown again: its frame is echoed
        [echo] = sent(conn)
        assert echo["request"]["streamId"] == "s2"

    def test_ending_a_request_releases_its_streams(self) -> None:
        """After the answer nobody reads the request's streams: keep-alives answer false."""
        conn = connection()
        conn.receive_frame(request("echo", {"a": marker("s1")}), 0.0)
        [event] = requests(conn)
        conn.respond(event.request_id, {}, 0.0)
        conn.data_to_send()
        conn.receive_frame(stray("s1", "k1"), 0.0)
        [answer] = sent(conn)
        assert answer["response"]["keepAlive"] is False

    def test_only_reply_streams_announced_in_the_response_start(self) -> None:
        """`respond` returns the announced reply streams and aborts the one left out."""
        conn = connection()
        conn.receive_frame(request("echo", {}), 0.0)
        [event] = requests(conn)
        kept = conn.open_reply_stream(event.request_id, 0.0)
        forgotten = conn.open_reply_stream(event.request_id, 0.0)
        assert conn.respond(event.request_id, {"data": marker(kept)}, 0.0) == [kept]
        assert conn.stream_outcome(kept) is None
        assert isinstance(conn.stream_outcome(forgotten), StreamBroke)
        with pytest.raises(StreamBroken):
            conn.write(forgotten, b"late", 0.0)

    def test_a_refused_request_aborts_its_reply_streams(self) -> None:
        """A request that ends in an error announces nothing: its reply streams break."""
        conn = connection()
        conn.receive_frame(request("echo", {}), 0.0)
        [event] = requests(conn)
        stream = conn.open_reply_stream(event.request_id, 0.0)
        conn.refuse(event.request_id, RestoreNotFound("gone"), 0.0)
        assert isinstance(conn.stream_outcome(stream), StreamBroke)


def feedback_frame(stream_id: str, cycle_id: str) -> bytes:
    """The `feedback` probe a typedrequest initiator sends before a chunk and while paused."""
    package = {"streamId": stream_id, "cycleId": cycle_id, "cycle": "request"}
    package |= {"mainPurpose": "feedback", "next": True, "backpressure": False}
    return orjson.dumps({"method": "##VirtualStream##", "request": package, "response": None})


class TestHeldStreams:
    def test_a_held_stream_answers_backpressure_to_every_frame(self) -> None:
        """While its handler holds it (waiting for a transfer slot), the stream's answers to a
        keep-alive and a chunk say backpressure, the keep-alive says alive, and a probe waits
        (`park_timeout`) and then says backpressure too."""
        conn = connection()
        conn.receive_frame(request("echo", {"a": marker("s1")}), 0.0)
        [event] = requests(conn)
        conn.hold_request_stream(event.request_id, "s1")
        conn.receive_frame(feedback_frame("s1", "f1"), 0.0)
        conn.receive_frame(stray("s1", "k1"), 0.0)
        conn.receive_frame(chunk_frame("s1", "c1", b"[7]"), 0.0)
        conn.advance(conn.settings.streams.park_timeout)
        answers = [frame["response"] for frame in sent(conn)]
        assert [a["cycleId"] for a in answers] == ["k1", "c1", "f1"]
        assert [a["backpressure"] for a in answers] == [True, True, True]
        assert answers[0]["keepAlive"] is True

    def test_reading_a_held_stream_answers_its_waiting_probe_at_once(self) -> None:
        """The probe that waited while the stream was held is answered by the read itself:
        the initiator sends the moment the handler reads, not a probe interval later."""
        conn = connection()
        conn.receive_frame(request("echo", {"a": marker("s1")}), 0.0)
        [event] = requests(conn)
        conn.hold_request_stream(event.request_id, "s1")
        conn.receive_frame(feedback_frame("s1", "f1"), 0.0)
        assert sent(conn) == []
        conn.receive_request_stream(event.request_id, "s1", 0.3)
        [answer] = sent(conn)
        assert (answer["response"]["cycleId"], answer["response"]["backpressure"]) == ("f1", False)

    def test_reading_a_held_stream_ends_the_hold(self) -> None:
        """Once the handler reads it, the next probe is told to send, and what came while it
        was held is there to take."""
        conn = connection()
        conn.receive_frame(request("echo", {"a": marker("s1")}), 0.0)
        [event] = requests(conn)
        conn.hold_request_stream(event.request_id, "s1")
        conn.receive_frame(chunk_frame("s1", "c1", b"[7]"), 0.0)
        sent(conn)
        conn.receive_request_stream(event.request_id, "s1", 0.0)
        conn.receive_frame(feedback_frame("s1", "f2"), 1.0)
        [answer] = sent(conn)
        assert answer["response"]["backpressure"] is False
        assert conn.take("s1", 1.0) == b"\x07"

    def test_a_held_stream_kept_alive_by_its_initiator_outlives_the_idle_timeout(self) -> None:
        """Holding sets no deadline: a stream held for ten idle timeouts, probed meanwhile, is
        still open and readable."""
        conn = connection()
        conn.receive_frame(request("echo", {"a": marker("s1")}), 0.0)
        [event] = requests(conn)
        conn.hold_request_stream(event.request_id, "s1")
        for second in range(1, 101):
            conn.receive_frame(feedback_frame("s1", f"f{second}"), float(second))
            conn.advance(float(second))
        assert conn.stream_outcome("s1") is None
        conn.receive_request_stream(event.request_id, "s1", 0.0)
        assert conn.take("s1", 100.0) is None

    def test_only_an_unread_stream_of_the_request_can_be_held(self) -> None:
        """Holding a stream the handler reads already, or one of another request, is a bug."""
        conn = connection()
        conn.receive_frame(request("echo", {"a": marker("s1")}), 0.0)
        [event] = requests(conn)
        conn.receive_request_stream(event.request_id, "s1", 0.0)
        with pytest.raises(LocalProtocolError, match="not an unopened stream"):
            conn.hold_request_stream(event.request_id, "s1")
        with pytest.raises(LocalProtocolError, match="not an unopened stream"):
            conn.hold_request_stream(event.request_id, "other")


class TestEchoSuppression:
    def test_a_frame_for_an_unknown_stream_is_echoed_once_as_typedrequest_does(self) -> None:
        """The first stray frame comes back unchanged with localData null."""
        conn = connection()
        conn.receive_frame(stray(), 0.0)
        assert sent(conn) == [orjson.loads(stray()) | {"localData": None}]

    def test_our_echo_coming_back_is_never_answered(self) -> None:
        """The same cycle id again is our own answer returning: no second answer."""
        conn = connection()
        conn.receive_frame(stray(), 0.0)
        conn.data_to_send()
        conn.receive_frame(stray(), 0.0)
        assert conn.data_to_send() == []

    def test_two_echoing_peers_stop_after_one_round_trip(self) -> None:
        """The loop a stray keep-alive used to start between two echoing peers ends at once."""
        left, right = connection(prefix="l"), connection(prefix="r")
        wire = Wire(left, right)
        right.receive_frame(stray(), 0.0)  # as if the left side had sent it
        assert wire.pump(0.0) <= 2

    def test_the_echo_memory_is_bounded(self) -> None:
        """Distinct stray ids are remembered up to ECHO_MEMORY; the oldest go first."""
        conn = connection()
        for number in range(ECHO_MEMORY + 1):
            conn.receive_frame(stray(cycle_id=f"k{number}"), 0.0)
        conn.data_to_send()
        conn.receive_frame(stray(cycle_id=f"k{ECHO_MEMORY}"), 0.0)  # remembered: no answer
        assert conn.data_to_send() == []
        conn.receive_frame(stray(cycle_id="k0"), 0.0)  # forgotten: answered once more
        assert len(conn.data_to_send()) == 1


class TestCalls:
    def test_a_call_completes_on_its_response(self) -> None:
        """The request frame goes out; the matching response becomes a Completed event."""
        conn = connection(prefix="u")
        call_id = conn.call("echo", {"v": 1}, now=0.0, timeout=5.0)
        [out] = sent(conn)
        assert out["correlation"] == {"id": call_id, "phase": "request"}
        answer = out | {"correlation": {"id": call_id, "phase": "response"}, "response": {"ok": 1}}
        conn.receive_frame(orjson.dumps(answer), 1.0)
        assert conn.events_received() == [Completed(call_id, {"ok": 1})]

    def test_a_call_fails_with_call_timeout_when_time_passes_its_deadline(self) -> None:
        """No answer by `timeout`: advance() ends the call with CallTimeout."""
        conn = connection()
        call_id = conn.call("echo", {}, now=0.0, timeout=5.0)
        assert conn.next_deadline() == 5.0
        conn.advance(4.9)
        assert conn.events_received() == []
        conn.advance(5.0)
        [event] = conn.events_received()
        assert isinstance(event, CallErrored)
        assert (event.call_id, type(event.error)) == (call_id, CallTimeout)
        assert conn.next_deadline() is None

    def test_retry_advice_sends_the_identical_bytes_again_when_due(self) -> None:
        """A `retry` answer schedules the byte-identical frame for `waitForMs` later."""
        conn = connection()
        call_id = conn.call("echo", {"v": 1}, now=0.0, timeout=5.0)
        [first] = conn.data_to_send()
        answer = orjson.loads(first) | {
            "correlation": {"id": call_id, "phase": "response"},
            "retry": {"waitForMs": 250, "reason": "busy"},
        }
        conn.receive_frame(orjson.dumps(answer), 1.0)
        assert conn.next_deadline() == 1.25
        conn.advance(1.2)
        assert conn.data_to_send() == []
        conn.advance(1.25)
        assert conn.data_to_send() == [first]

    def test_closing_fails_every_pending_call_with_session_closed(self) -> None:
        """The transport gone: pending calls end SessionClosed, nothing more is sent."""
        conn = connection()
        first = conn.call("echo", {}, now=0.0, timeout=5.0)
        second = conn.call("echo", {}, now=0.0, timeout=5.0)
        conn.connection_lost(SessionClosed(1006, "gone"), 0.0)
        events = conn.events_received()
        assert [(e.call_id, type(e.error)) for e in events if isinstance(e, CallErrored)] == [
            (first, SessionClosed),
            (second, SessionClosed),
        ]
        assert conn.data_to_send() == []
        assert conn.state is ConnectionState.CLOSED

    def test_nothing_can_be_started_on_a_closed_connection(self) -> None:
        """After close, a call or a stream raises SessionClosed instead of queueing frames."""
        conn = connection()
        conn.connection_lost(SessionClosed(1000, "bye"), 0.0)
        with pytest.raises(SessionClosed):
            conn.call("echo", {}, now=0.0, timeout=1.0)
        with pytest.raises(SessionClosed):
            conn.open_send_stream()

    def test_an_error_answer_fails_the_call_with_its_text_and_data(self) -> None:
        """error {text, data} becomes CallFailed carrying both."""
        conn = connection()
        call_id = conn.call("echo", {}, now=0.0, timeout=5.0)
        [out] = sent(conn)
        answer = out | {
            "correlation": {"id": call_id, "phase": "response"},
            "error": {"text": "gone", "data": {"code": "x"}},
        }
        conn.receive_frame(orjson.dumps(answer), 0.5)
        [event] = conn.events_received()
        assert isinstance(event, CallErrored)
        assert isinstance(event.error, CallFailed)
        assert (event.error.text, event.error.error_data) == ("gone", {"code": "x"})


class Uploads:
    """A handler for the right side: opens each request's stream and keeps it to be read."""

    def __init__(self) -> None:
        self.readers: list[tuple[Connection, int, str]] = []  # (side, request id, stream id)

    def __call__(self, conn: Connection, event: RequestReceived) -> None:
        conn.receive_request_stream(event.request_id, event.stream_ids[0], 0.0)
        self.readers.append((conn, event.request_id, event.stream_ids[0]))


class TestStreams:
    def test_stream_frames_never_overtake_the_request_carrying_the_marker(self) -> None:
        """A sender that wrote before the call: the request frame is first in the outbox."""
        conn = connection(prefix="l")
        stream = conn.open_send_stream()
        conn.write(stream, b"early", 0.0)
        assert conn.data_to_send() == []  # PENDING until the marker goes out
        conn.call("upload", {"data": marker(stream)}, now=0.0, timeout=5.0)
        methods = [orjson.loads(frame)["method"] for frame in conn.data_to_send()]
        assert methods[0] == "upload"
        assert set(methods[1:]) == {"##VirtualStream##"}

    def test_bytes_cross_a_pair_intact_and_the_request_is_answered(self) -> None:
        """200 KB through the codec, initiator to responder, end to end without a transport."""
        payload = hashlib.sha256(b"x").digest() * 6400
        uploads = Uploads()
        left, right = connection(prefix="l"), connection(("upload",), prefix="r")
        wire = Wire(left, right, uploads)
        sender = left.open_send_stream()
        call_id = left.call("upload", {"data": marker(sender)}, now=0.0, timeout=60.0)
        pieces = [payload[i : i + 10_000] for i in range(0, len(payload), 10_000)]
        got = bytearray()
        now, closed = 0.0, False
        while True:
            while pieces and left.can_write(sender):
                left.write(sender, pieces.pop(0), now)
            if not pieces and not closed and left.can_write(sender):
                left.end_stream(sender, now)
                closed = True
            wire.pump(now)
            [(conn, request_id, reader)] = uploads.readers
            while (item := conn.take(reader, now)) not in (None, CLOSING):
                assert isinstance(item, bytes)
                got += item
            if item is CLOSING:
                conn.respond(request_id, {"size": len(got)}, now)
                wire.pump(now)
                break
            now += 0.01
            left.advance(now)
            right.advance(now)
            assert now < 30, "the transfer stalled"
        assert bytes(got) == payload
        assert Completed(call_id, {"size": len(payload)}) in wire.events[id(left)]

    def test_a_stream_change_is_reported_for_its_waiters(self) -> None:
        """Closing a stream we send on reports it changed (its sink waits on that)."""
        conn = connection()
        stream = conn.open_send_stream()
        conn.end_stream(stream, 0.0)
        assert StreamChanged(stream) in conn.events_received()

    def test_take_on_a_stream_we_send_on_is_a_local_error(self) -> None:
        """Misuse of the local side raises InvalidState and changes nothing."""
        conn = connection()
        stream = conn.open_send_stream()
        with pytest.raises(InvalidState):
            conn.take(stream, 0.0)
        assert (conn.stream_outcome(stream), conn.data_to_send()) == (None, [])


class TestStreamsById:
    def test_a_write_is_cut_into_chunks_of_at_most_max_chunk(self) -> None:
        """2.5 MiB written at once arrive as chunks of 1 MiB, 1 MiB and the rest, in order."""
        uploads = Uploads()
        left = connection(prefix="l")
        right = connection(("upload",), prefix="r", inline_decode_max=1 << 30)
        wire = Wire(left, right, uploads)
        sender = left.open_send_stream()
        left.call("upload", {"data": marker(sender)}, now=0.0, timeout=60.0)
        data = hashlib.sha256(b"y").digest() * (5 * MAX_CHUNK // 64)
        assert left.write(sender, data, 0.0) == len(data)
        left.end_stream(sender, 0.0)
        wire.pump(0.0)
        [(conn, _, reader)] = uploads.readers
        items = []
        while (item := conn.take(reader, 0.0)) not in (None, CLOSING):
            items.append(item)
            wire.pump(0.0)
        assert item is CLOSING
        assert [len(piece) for piece in items] == [MAX_CHUNK, MAX_CHUNK, MAX_CHUNK // 2]
        assert b"".join(items) == data

    def test_a_write_takes_what_the_window_has_room_for(self) -> None:
        """Room for four chunks: of 5.5 MiB four are taken; a full window refuses the next."""
        conn = connection()
        sender = conn.open_send_stream()  # no call yet: nothing leaves, the window fills
        assert conn.write(sender, bytes(5 * MAX_CHUNK + MAX_CHUNK // 2), 0.0) == 4 * MAX_CHUNK
        assert not conn.can_write(sender)
        with pytest.raises(InvalidState, match="full send queue"):
            conn.write(sender, b"x", 0.0)

    def test_a_stream_that_breaks_says_so_once_with_its_reason(self) -> None:
        """Idle past `idle_timeout`: one `StreamBroke` naming why; its outcome says the same."""
        conn = connection()
        conn.receive_frame(request("echo", {"a": marker("s1")}), 0.0)
        [event] = requests(conn)
        conn.receive_request_stream(event.request_id, "s1", 0.0)
        conn.advance(10.5)
        reason = "no frame from the initiator within 10 s"
        assert conn.events_received() == [StreamBroke("s1", reason)]
        conn.advance(11.0)
        assert not [e for e in conn.events_received() if isinstance(e, StreamBroke)]
        assert conn.stream_outcome("s1") == StreamBroke("s1", reason)

    def test_a_send_stream_ends_once_its_closing_bit_is_taken_and_is_remembered(self) -> None:
        """The responder acknowledged the closing bit: `StreamEnded`; the outcome still reads
        ended after the connection let the stream go."""
        left, right = connection(prefix="l"), connection(("upload",), prefix="r")
        wire = Wire(left, right, Uploads())
        sender = left.open_send_stream()
        left.call("upload", {"data": marker(sender)}, now=0.0, timeout=60.0)
        left.end_stream(sender, 0.0)
        wire.pump(0.0)
        assert StreamEnded(sender) in wire.events[id(left)]
        assert left.next_deadline() == 60.0  # only the call: the stream is gone
        assert left.stream_outcome(sender) == StreamEnded(sender)

    def test_a_late_write_on_a_forgotten_stream_says_why_it_broke(self) -> None:
        """A producer back after its stream broke and was let go gets the stream's reason."""
        left, right = connection(prefix="l"), connection(("upload",), prefix="r")
        wire = Wire(left, right, Uploads())
        sender = left.open_send_stream()
        left.call("upload", {"data": marker(sender)}, now=0.0, timeout=60.0)
        left.abort_stream(sender, "the producer failed", 0.0)
        wire.pump(0.0)
        assert left.next_deadline() == 60.0
        with pytest.raises(StreamBroken, match="broke: the producer failed"):
            left.write(sender, b"late", 0.0)

    def test_a_stream_we_read_keeps_what_came_before_its_end_until_it_is_taken(self) -> None:
        """A response stream that ended (and said farewell) while nothing was taken yet still
        hands out every chunk, then its end."""

        def serve(conn: Connection, event: RequestReceived) -> None:
            stream_id = conn.open_reply_stream(event.request_id, 0.0)
            conn.respond(event.request_id, {"data": marker(stream_id)}, 0.0)
            for piece in (b"a", b"b", b"c"):
                conn.write(stream_id, piece, 0.0)
            conn.end_stream(stream_id, 0.0)

        left, right = connection(prefix="l"), connection(("download",), prefix="r")
        wire = Wire(left, right, serve)
        call_id = left.call("download", {}, now=0.0, timeout=60.0)
        wire.pump(0.0)
        [answer] = [e for e in wire.events[id(left)] if isinstance(e, Completed)]
        assert answer.call_id == call_id
        stream_id = answer.response["data"]["streamId"]
        left.receive_response_stream(stream_id, 0.0)
        wire.pump(0.0)
        assert StreamEnded(stream_id) in wire.events[id(left)]
        taken = [left.take(stream_id, 0.0) for _ in range(4)]
        assert taken == [b"a", b"b", b"c", CLOSING]
        assert left.stream_outcome(stream_id) == StreamEnded(stream_id)

    def test_a_reader_that_stops_early_lets_go_of_what_arrives(self) -> None:
        """`stop_reading` on a response stream drops what it queued and breaks it; on a
        request stream the peer's next keep-alive is answered false."""
        left, right = connection(prefix="l"), connection(("download",), prefix="r")

        def serve(conn: Connection, event: RequestReceived) -> None:
            stream_id = conn.open_reply_stream(event.request_id, 0.0)
            conn.respond(event.request_id, {"data": marker(stream_id)}, 0.0)
            conn.write(stream_id, b"a", 0.0)

        wire = Wire(left, right, serve)
        left.call("download", {}, now=0.0, timeout=60.0)
        wire.pump(0.0)
        [answer] = [e for e in wire.events[id(left)] if isinstance(e, Completed)]
        stream_id = answer.response["data"]["streamId"]
        left.receive_response_stream(stream_id, 0.0)
        wire.pump(0.0)
        left.stop_reading(stream_id, 0.0)
        assert left.stream_outcome(stream_id) == StreamBroke(stream_id, "the reader stopped")
        with pytest.raises(StreamBroken, match="the reader stopped"):
            left.take(stream_id, 0.0)

        conn = connection()
        conn.receive_frame(request("echo", {"a": marker("s1")}), 0.0)
        [event] = requests(conn)
        conn.receive_request_stream(event.request_id, "s1", 0.0)
        conn.stop_reading("s1", 0.0)
        conn.receive_frame(stray("s1", "k1"), 0.0)
        [keepalive] = sent(conn)
        assert keepalive["response"]["keepAlive"] is False

    def test_a_write_after_the_end_is_a_local_error_even_once_the_stream_is_gone(self) -> None:
        """The closing bit acknowledged and the stream let go: writing is `InvalidState`."""
        left, right = connection(prefix="l"), connection(("upload",), prefix="r")
        wire = Wire(left, right, Uploads())
        sender = left.open_send_stream()
        left.call("upload", {"data": marker(sender)}, now=0.0, timeout=60.0)
        left.end_stream(sender, 0.0)
        wire.pump(0.0)
        with pytest.raises(InvalidState, match="is over"):
            left.write(sender, b"late", 0.0)

    def test_an_unknown_stream_reads_as_broken(self) -> None:
        """An id the connection never had: no room to wait for, its outcome is broken."""
        conn = connection()
        assert conn.can_write("nobody")
        assert isinstance(conn.stream_outcome("nobody"), StreamBroke)
        with pytest.raises(StreamBroken):
            conn.take("nobody", 0.0)

    def test_settle_chunk_takes_only_a_token_it_handed_out(self) -> None:
        """A token that did not come from a `ChunkToDecode` event is a local error."""

        class Forged:
            def decode(self) -> bytes:
                return b""

        with pytest.raises(LocalProtocolError, match="ChunkToDecode"):
            connection().settle_chunk("s1", Forged(), b"", 0.0)

    def test_events_come_out_in_the_order_they_happened(self) -> None:
        """A stream frame, then a call's answer: `StreamChanged` before `Completed`."""
        conn = connection()
        conn.receive_frame(request("echo", {"a": marker("s1")}), 0.0)
        requests(conn)
        call_id = conn.call("echo", {}, now=0.0, timeout=5.0)
        [out] = [frame for frame in sent(conn) if frame["method"] == "echo"]
        conn.receive_frame(stray("s1", "k1"), 0.0)  # a keep-alive of the request's stream
        answer = out | {"correlation": {"id": call_id, "phase": "response"}, "response": {}}
        conn.receive_frame(orjson.dumps(answer), 0.0)
        assert conn.events_received() == [StreamChanged("s1"), Completed(call_id, {})]


class TestTime:
    def test_an_idle_connection_has_no_deadline(self) -> None:
        """Nothing pending, nothing streaming: no timer is needed."""
        assert connection().next_deadline() is None

    def test_advance_consumes_every_deadline_it_reaches(self) -> None:
        """After advance(now), the next deadline lies after now: a driver never spins."""
        left, right = connection(prefix="l"), connection(("upload",), prefix="r")
        wire = Wire(left, right, lambda conn, event: None)
        sender = left.open_send_stream()
        left.call("upload", {"data": marker(sender)}, now=0.0, timeout=30.0)
        now = 0.0
        for _ in range(200):
            wire.pump(now)
            deadline = left.next_deadline()
            assert deadline is not None
            now = deadline
            left.advance(now)
            right.advance(now)
            after = left.next_deadline()
            assert after is None or after > now
            if after is None:
                break


class TestRequestClasses:
    """Intake rule 4 by class: control and stream requests have their own seats."""

    ADMISSIONS: ClassVar = {"stage": stream_class("node"), "status": Admission(answers_now=True)}

    def classed(self, **changes: Any) -> Connection:
        settings = ConnectionSettings(streams=STREAMS, busy_retry_ms=250, **changes)
        numbers = count(1)
        return Connection(
            ("stage", "echo", "status"),
            settings,
            new_id=lambda: f"id{next(numbers)}",
            admissions=self.ADMISSIONS,
        )

    def test_a_control_request_is_handled_while_every_stream_seat_is_taken(self) -> None:
        """Stream requests at their bound: the next stage is deferred, a control request runs."""
        conn = self.classed(max_stream_requests=3, max_stream_requests_per_node=3)
        for number in range(4):
            conn.receive_frame(request("stage", {"node": f"n{number}"}, f"s{number}"), 0.0)
        conn.receive_frame(request("echo", {}, "control"), 0.0)
        assert [event.method for event in requests(conn)] == ["stage"] * 3 + ["echo"]
        [busy] = sent(conn)
        assert busy["correlation"]["id"] == "s3"
        assert busy["retry"] == {
            "waitForMs": 250,
            "reason": "the agent is busy with 3 stream requests; send it again",
        }

    def test_one_nodes_flood_does_not_defer_another_nodes_stage(self) -> None:
        """A node past its share is deferred; another node's stage is handled."""
        conn = self.classed(max_stream_requests=16, max_stream_requests_per_node=2)
        for number in range(5):
            conn.receive_frame(request("stage", {"node": "a"}, f"a{number}"), 0.0)
        conn.receive_frame(request("stage", {"node": "b"}, "b0"), 0.0)
        handled = [event.request["node"] for event in requests(conn)]
        assert handled == ["a", "a", "b"]
        assert [answer["correlation"]["id"] for answer in sent(conn)] == ["a2", "a3", "a4"]

    def test_a_deferral_is_counted_against_its_class(self) -> None:
        """Each `retry` of a full class counts in the connection's seats, by class."""
        conn = self.classed(max_concurrent_requests=1)
        conn.receive_frame(request("echo", {}, "c1"), 0.0)
        conn.receive_frame(request("echo", {}, "c2"), 0.0)
        assert conn.seats.refused == {"control": 1, "stream": 0}

    def test_ending_a_request_gives_its_seat_back(self) -> None:
        """The seats held are read off the connection; an answered request holds none."""
        conn = self.classed()
        conn.receive_frame(request("stage", {"node": "a"}, "s1"), 0.0)
        conn.receive_frame(request("stage", {"node": "b"}, "s2"), 0.0)
        first = requests(conn)[0]
        conn.respond(first.request_id, {}, 0.0)
        assert (conn.seats.in_flight("stream"), conn.seats.in_flight("control")) == (1, 0)

    def test_a_request_answered_from_memory_is_handled_with_every_seat_taken(self) -> None:
        """A route that may answer from memory is let in without a seat."""
        conn = self.classed(max_concurrent_requests=1, max_stream_requests=1)
        conn.receive_frame(request("echo", {}, "c1"), 0.0)
        conn.receive_frame(request("stage", {"node": "a"}, "s1"), 0.0)
        conn.receive_frame(request("status", {}, "st"), 0.0)
        assert [event.method for event in requests(conn)] == ["echo", "stage", "status"]
        assert sent(conn) == []

    def test_one_that_needs_its_handler_with_control_full_is_asked_to_retry(self) -> None:
        """`seat()` for a request let in without a seat, control full: `retry`, and it is over."""
        conn = self.classed(max_concurrent_requests=1)
        conn.receive_frame(request("echo", {}, "c1"), 0.0)
        conn.receive_frame(request("status", {}, "st"), 0.0)
        status = requests(conn)[-1]
        assert conn.seat(status.request_id, 0.0) is False
        [busy] = sent(conn)
        assert busy["correlation"]["id"] == "st"
        assert "control requests" in busy["retry"]["reason"]
        conn.respond(status.request_id, {}, 0.0)
        assert sent(conn) == []

    def test_one_that_needs_its_handler_takes_a_control_seat(self) -> None:
        """`seat()` with room: True, and the request holds a control seat until it ends."""
        conn = self.classed(max_concurrent_requests=1)
        conn.receive_frame(request("status", {}, "st"), 0.0)
        status = requests(conn)[-1]
        assert conn.seat(status.request_id, 0.0) is True
        conn.receive_frame(request("echo", {}, "c1"), 0.0)
        [busy] = sent(conn)
        assert busy["correlation"]["id"] == "c1"
