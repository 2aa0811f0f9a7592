"""What a hostile or careless peer may send, as hypothesis strategies, and a driver that feeds it
to a `Connection` and checks what comes out.

Shared by the property tests (tests/protocol/test_hostile_frames.py) and the fuzz targets
(tests/fuzz/): frames of any JSON depth, size and type, envelopes with odd fields, requests
with stream markers at any depth, stream frames for known and unknown streams with every
chunk form, and raw byte splices that only the undecoded-chunk fast path reads.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import orjson
from hypothesis import strategies as st

from agent.errors import InvalidRequest, StreamBroken
from agent.protocol.connection import (
    ChunkToDecode,
    Connection,
    ConnectionSettings,
    RequestReceived,
    StreamSettings,
)
from agent.protocol.envelope import STREAM_METHOD

__all__ = [
    "METHODS",
    "STREAM_IDS",
    "Driver",
    "deep",
    "frames",
    "json_values",
]

METHODS = ("echo", "pushClusterConfig")
STREAM_IDS = ("s1", "s2", "theirs", "nobody")
CORRELATIONS = ("c1", "c2", "c3", "id1", "setup")
PURPOSES = ("start", "chunk", "read", "end", "feedback", "keepAlive", "bogus")

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=8), children, max_size=6)
    ),
    max_leaves=25,
)


def deep(value: Any, depth: int, *, in_objects: bool = False) -> Any:
    """`value` wrapped in `depth` arrays (or one-key objects)."""
    for _ in range(depth):
        value = {"k": value} if in_objects else [value]
    return value


def marker(stream_id: str) -> dict[str, Any]:
    return {"_isVirtualStream": True, "streamId": stream_id}


@st.composite
def payloads(draw: st.DrawFn) -> Any:
    """A request or response body: small JSON, markers, deep nesting, huge arrays."""
    kind = draw(st.sampled_from(["json", "marker", "deep", "deep-marker", "huge", "object"]))
    if kind == "json":
        return draw(json_values)
    if kind == "marker":
        return {"a": marker(draw(st.sampled_from(STREAM_IDS))), "b": draw(json_values)}
    if kind == "huge":
        item = draw(st.sampled_from([0, 255, 1000, "x", None, [], {}]))
        return [item] * draw(st.integers(0, 100_000))
    if kind == "object":
        return draw(st.dictionaries(st.text(max_size=8), json_values, max_size=8))
    depth = draw(st.one_of(st.integers(0, 140), st.integers(240, 270), st.integers(990, 1030)))
    inner = marker(draw(st.sampled_from(STREAM_IDS))) if kind == "deep-marker" else 1
    return {"x": deep(inner, depth, in_objects=draw(st.booleans()))}


# chunkData as JSON values, and as raw text spliced into the frame bytes (the fast path cuts the
# Buffer or base64 payload out without parsing it, so any bytes may sit there).
CHUNK_VALUES = st.one_of(
    st.just("#############CLOSING BIT#############"),
    st.binary(max_size=64).map(lambda b: {"type": "Buffer", "data": list(b)}),
    st.binary(max_size=64).map(lambda b: {str(i): v for i, v in enumerate(b)}),
    st.just({"type": "EncodedBuffer", "data": "base64:AAEC"}),
    json_values,
)
RAW_CHUNKS = st.one_of(
    st.sampled_from(
        [
            b'{"type":"Buffer","data":[1,\xff\xfe,2]}',
            b'{"type":"Buffer","data":[1,256,2]}',
            b'{"type":"Buffer","data":[  0,0,0]}',
            b'{"type":"EncodedBuffer","data":"base64:\xff\xfe"}',
            b'{"type":"EncodedBuffer","data":"nope"}',
        ]
    ),
    st.binary(max_size=40).map(lambda b: b'{"type":"Buffer","data":[' + b + b"]}"),
    st.binary(max_size=40).map(lambda b: b'{"type":"EncodedBuffer","data":"base64:' + b + b'"}'),
    st.integers(0, 300_000).map(lambda n: b'{"type":"Buffer","data":[' + b"7," * n + b"300]}"),
)
_HOLE = "\x00chunk-hole\x00"


@st.composite
def packages(draw: st.DrawFn, cycle: str | None = None) -> dict[str, Any]:
    """A stream package, mostly well formed, some fields odd."""
    package: dict[str, Any] = {
        "streamId": draw(st.sampled_from(STREAM_IDS)),
        "cycleId": draw(st.sampled_from(["k1", "k2", "k3", "id1", "id2", "id3"])),
        "cycle": cycle if draw(st.integers(0, 9)) else draw(st.sampled_from(["request", "x"])),
        "mainPurpose": draw(st.sampled_from(PURPOSES)),
    }
    if draw(st.integers(0, 9)) == 0:  # a field of another JSON type: an object, an array, ...
        package[draw(st.sampled_from(sorted(package)))] = draw(json_values)
    for key in ("keepAlive", "next", "backpressure"):
        if draw(st.booleans()):
            package[key] = draw(st.booleans()) if draw(st.integers(0, 9)) else draw(scalars)
    if draw(st.booleans()):
        package["chunkData"] = _HOLE if draw(st.booleans()) else draw(CHUNK_VALUES)
    if draw(st.integers(0, 5)) == 0:
        package[draw(st.text(max_size=6))] = draw(payloads())
    return package


@st.composite
def envelopes(draw: st.DrawFn) -> dict[str, Any]:
    """A TypedRequest envelope: requests, responses to our calls, stream frames, odd fields."""
    kind = draw(st.sampled_from(["request", "response", "stream", "chunk", "answer", "odd"]))
    if kind == "chunk":  # the common case: data on a stream the handler reads
        package = {
            "streamId": draw(st.sampled_from(["s1", "s1", "s2"])),
            "cycleId": draw(st.sampled_from(["k1", "k2", "k3", "k4"])),
            "cycle": "request",
            "mainPurpose": "chunk",
            "chunkData": _HOLE if draw(st.booleans()) else draw(CHUNK_VALUES),
        }
        return {"method": STREAM_METHOD, "request": package, "response": None}
    if kind in ("stream", "answer"):
        package = draw(packages("request" if kind == "stream" else "response"))
        frame: dict[str, Any] = {"method": STREAM_METHOD}
        if kind == "stream":
            frame |= {"request": package, "response": draw(st.none() | json_values)}
        else:
            frame |= {"request": draw(st.none() | json_values), "response": package}
        return frame
    method = draw(st.sampled_from([*METHODS, "remote", "nobodyRoutes", ""]))
    phase = "request" if kind == "request" else draw(st.sampled_from(["response", "weird"]))
    frame = {
        "method": method,
        "request": draw(payloads()),
        "response": draw(st.none() | payloads()),
        "correlation": {"id": draw(st.sampled_from(CORRELATIONS)), "phase": phase},
    }
    if kind == "odd" or draw(st.integers(0, 4)) == 0:
        key = draw(st.sampled_from(["error", "retry", "correlation", "localData", "authInfo"]))
        frame[key] = draw(st.one_of(json_values, payloads()))
    return frame


def _dumps(frame: Any) -> bytes:
    try:
        return orjson.dumps(frame)
    except TypeError:  # deeper than orjson writes, or an integer past 64 bits: by hand
        return _write_deep(frame)


def _write_deep(value: Any) -> bytes:
    out: list[bytes] = []
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, bytes):
            out.append(item)
        elif isinstance(item, dict):
            parts: list[Any] = [b"{"]
            for index, (key, inner) in enumerate(item.items()):
                parts += [b"," if index else b"", orjson.dumps(key) + b":", inner]
            stack.extend(reversed([*parts, b"}"]))
        elif isinstance(item, list):
            parts = [b"["]
            for index, inner in enumerate(item):
                parts += [b"," if index else b"", inner]
            stack.extend(reversed([*parts, b"]"]))
        else:
            out.append(json.dumps(item).encode())
    return b"".join(out)


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    """One text frame as a peer might send it (not always JSON, not always UTF-8)."""
    kind = draw(st.sampled_from(["envelope"] * 6 + ["json", "bytes", "mutated"]))
    if kind == "json":
        return _dumps(draw(payloads()))
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    frame = _dumps(draw(envelopes()))
    hole = orjson.dumps(_HOLE)
    while hole in frame:
        frame = frame.replace(hole, draw(RAW_CHUNKS), 1)
    if kind == "mutated" and frame:
        at = draw(st.integers(0, len(frame) - 1))
        frame = frame[:at] + draw(st.binary(min_size=1, max_size=3)) + frame[at + 1 :]
    return frame


@dataclass
class Driver:
    """A `Connection` as the agent's driver uses it: it answers every request (respond, a reply
    stream, or refuse), settles every received chunk, reads and writes its streams, lets time
    pass. `feed` checks every frame that comes out and counts answers per correlation id."""

    conn: Connection = field(
        default_factory=lambda: Connection(
            METHODS,
            ConnectionSettings(
                streams=StreamSettings(window=2, inline_decode_max=8), max_concurrent_requests=3
            ),
            new_id=_ids(),
        )
    )
    now: float = 0.0
    asked: Counter[str] = field(default_factory=Counter)  # request frames fed, per corr id
    answered: Counter[str] = field(default_factory=Counter)  # replies sent, per corr id
    turn: int = 0

    reading: str | None = None  # the id of the request stream the driver reads
    decoding: list[ChunkToDecode] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.conn.call("remote", {"a": 1}, now=self.now, timeout=30.0)  # id1: a pending call
        # We receive a stream the peer answers for.
        self.conn.receive_response_stream("theirs", self.now)
        self.check(self.conn.data_to_send())
        # A request in flight whose handler reads stream s1 (s2 it never opens).
        setup = {"in": [marker("s1"), marker("s2")]}
        self._count_request(orjson.dumps(_request("echo", setup, "setup")))
        self.conn.receive_frame(orjson.dumps(_request("echo", setup, "setup")), self.now)
        [event] = [e for e in self.conn.events_received() if isinstance(e, RequestReceived)]
        self.conn.receive_request_stream(event.request_id, "s1", 0.0)
        self.reading = "s1"

    def feed(self, frame: bytes) -> None:
        """Hand `frame` to the connection, act on its events, check what it sends."""
        self._count_request(frame)
        self.conn.receive_frame(frame, self.now)
        self.turn += 1
        self._act()
        if self.turn % 3 == 0:
            self.now += 0.7
            self.conn.advance(self.now)
            self._act()

    def _act(self) -> None:
        if self.reading is not None:
            try:
                while self.conn.take(self.reading, self.now) is not None:
                    pass
            except StreamBroken:
                self.reading = None
        for event in self.conn.events_received():
            if isinstance(event, RequestReceived):
                self._answer(event)
            elif isinstance(event, ChunkToDecode):
                self.decoding.append(event)
        if self.turn % 2 == 0:  # chunks settle a frame late: the stream's next frame waits
            for chunk in self.decoding:
                try:
                    outcome: Any = chunk.token.decode()
                except Exception as exc:  # the decoder's verdict, whatever it is
                    outcome = exc
                self.conn.settle_chunk(chunk.stream_id, chunk.token, outcome, self.now)
            self.decoding.clear()
        self.check(self.conn.data_to_send())

    def _answer(self, event: RequestReceived) -> None:
        choice = (event.request_id + self.turn) % 4
        for stream_id in event.stream_ids[: choice % 2]:
            self.conn.receive_request_stream(event.request_id, stream_id, 0.0)
            try:
                while self.conn.take(stream_id, self.now) is not None:
                    pass
            except StreamBroken:
                pass  # the handler's request would be refused (invalid-request if undecodable)
        if choice == 0:
            self.conn.refuse(event.request_id, InvalidRequest("refused by the driver"), self.now)
        elif choice == 1:
            sink = self.conn.open_reply_stream(event.request_id, self.now)
            self.conn.respond(event.request_id, {"out": marker(sink)}, self.now)
            self.conn.write(sink, b"abc", self.now)
            self.conn.end_stream(sink, self.now)
        elif choice == 2:
            self.conn.respond(event.request_id, {"ok": True}, self.now)
        # choice 3: left in flight (the concurrency bound fills up)

    def _count_request(self, frame: bytes) -> None:
        try:
            obj = orjson.loads(frame)
        except orjson.JSONDecodeError:
            obj = None
        if isinstance(obj, dict):
            corr = obj.get("correlation")
            if isinstance(corr, dict) and corr.get("phase") == "request":
                self.asked[str(corr.get("id"))] += 1
        # A frame only the fast path reads is no JSON here: it cannot be a request anyway
        # (the fast path splits only `##VirtualStream##` frames, which carry no correlation).

    def check(self, sent: list[bytes]) -> None:
        """Every frame is UTF-8 JSON (an object); a correlation is answered at most as often as
        it was asked."""
        for frame in sent:
            obj = orjson.loads(frame)  # raises on anything that is not UTF-8 JSON
            assert isinstance(obj, dict), frame[:200]
            corr = obj.get("correlation")
            reply = isinstance(corr, dict) and corr.get("phase") == "response"
            if obj.get("method") != STREAM_METHOD and reply:
                self.answered[corr["id"]] += 1
                assert self.answered[corr["id"]] <= self.asked[corr["id"]], corr


def _request(method: str, body: Any, corr: str) -> dict[str, Any]:
    return {
        "method": method,
        "request": body,
        "response": None,
        "correlation": {"id": corr, "phase": "request"},
    }


def _ids() -> Any:
    numbers = iter(range(1, 1 << 30))
    return lambda: f"id{next(numbers)}"
