"""The TypedRequest envelope codec and dispatch rule (wire.md §1)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from agent.errors import RemoteProtocolError
from agent.protocol.envelope import (
    MAX_DEPTH,
    Correlation,
    Envelope,
    FrameKind,
    RetryAdvice,
    answerable,
    classify,
    decode_envelope,
    encode_envelope,
    encode_reply,
    envelope_from_json,
    error_reply,
    nests_deeper,
    parse_frame,
    reply,
)
from agent.secret import Secret

REQUEST = (
    b'{"method":"echo","request":{"value":"hi"},"response":null,'
    b'"correlation":{"id":"uni_af6bab7e783067b666e71654","phase":"request"}}'
)
REPLY = (
    b'{"method":"echo","request":{"value":"hi"},"response":{"echoed":"hi"},'
    b'"correlation":{"id":"uni_af6bab7e783067b666e71654","phase":"response"},"localData":null}'
)


def test_decode_reads_every_field_of_a_captured_request() -> None:
    """A frame captured from typedrequest 3.3.0 decodes into method, request and correlation."""
    env = decode_envelope(REQUEST)
    assert env == Envelope(
        method="echo",
        request={"value": "hi"},
        response=None,
        correlation=Correlation("uni_af6bab7e783067b666e71654", "request"),
    )


def test_reply_encodes_byte_for_byte_like_the_ts_router() -> None:
    """The reply is the same envelope with response set, phase response and localData null."""
    assert encode_envelope(reply(decode_envelope(REQUEST), {"echoed": "hi"})) == REPLY


def test_outgoing_request_carries_no_local_data() -> None:
    """Requests we send have no localData key (SmartServe writes into it)."""
    assert encode_envelope(decode_envelope(REQUEST)) == REQUEST


def test_unknown_envelope_keys_are_tolerated_and_never_echoed() -> None:
    """authInfo/serverData/localData are accepted on input and absent from the reply."""
    frame = orjson.loads(REQUEST)
    frame |= {"authInfo": {"jwt": "eyJ.secret.jwt"}, "serverData": {"jwtValid": True}}
    frame |= {"localData": {"peer": 1}, "somethingNew": 2}
    out = encode_envelope(reply(decode_envelope(orjson.dumps(frame)), {"echoed": "hi"}))
    assert out == REPLY
    assert b"eyJ" not in out


def test_error_reply_has_error_and_null_response_and_no_retry() -> None:
    """A refusal answers error {text, data} with response null and never retry."""
    out = orjson.loads(encode_envelope(error_reply(decode_envelope(REQUEST), "no", {"code": "x"})))
    assert out["error"] == {"text": "no", "data": {"code": "x"}}
    assert out["response"] is None
    assert "retry" not in out
    assert out["correlation"]["phase"] == "response"


def test_reply_replaces_stream_markers_under_request() -> None:
    """Markers in the echoed request become the _OBMITTED_VIRTUAL_STREAM object."""
    env = Envelope(
        "up",
        {"a": [{"_isVirtualStream": True, "streamId": "s1"}]},
        None,
        Correlation("c", "request"),
    )
    echoed = orjson.loads(encode_envelope(reply(env, {})))["request"]["a"][0]
    assert echoed["_OBMITTED_VIRTUAL_STREAM"] is True
    assert "streamId" not in echoed


def test_retry_is_decoded_with_its_wait_and_reason() -> None:
    """retry {waitForMs, reason} decodes into RetryAdvice."""
    frame = orjson.loads(REQUEST) | {"retry": {"waitForMs": 250, "reason": "busy"}}
    assert decode_envelope(orjson.dumps(frame)).retry == RetryAdvice(250.0, "busy")


@pytest.mark.parametrize(
    ("frame", "kind"),
    [
        ({"method": "##VirtualStream##", "request": {}, "response": None}, FrameKind.STREAM),
        (
            {"method": "##VirtualStream##", "correlation": {"id": "c", "phase": "response"}},
            FrameKind.STREAM,
        ),
        ({"method": "m", "correlation": {"id": "c", "phase": "request"}}, FrameKind.REQUEST),
        ({"method": "m", "correlation": {"id": "c", "phase": "response"}}, FrameKind.RESPONSE),
        ({"method": "m", "correlation": {"id": "c", "phase": "other"}}, FrameKind.WEIRD),
        ({"method": "m", "request": {}}, FrameKind.WEIRD),
    ],
)
def test_dispatch_rule_follows_the_ts_router(frame: dict[str, object], kind: FrameKind) -> None:
    """Stream method first, then phase request, then phase response, else weird."""
    assert classify(decode_envelope(orjson.dumps(frame))) is kind


@pytest.mark.parametrize(
    "frame",
    [
        b"not json",
        b"\xff\xfe",
        b"[1, 2]",
        b'{"request": {}}',
        b'{"method": 5}',
        b'{"method": "m", "correlation": "c"}',
        b'{"method": "m", "correlation": {"id": 5, "phase": "request"}}',
        b'{"method": "m", "correlation": {"id": "c", "phase": null}}',
        b'{"method": "m", "error": {"text": 5}}',
        b'{"method": "m", "retry": {"waitForMs": -1, "reason": "r"}}',
        b'{"method": "m", "retry": {"waitForMs": true, "reason": "r"}}',
        b'{"method": "m", "retry": {"waitForMs": 5, "reason": 7}}',
    ],
)
def test_malformed_frames_raise_remote_protocol_error(frame: bytes) -> None:
    """Frames that are no valid envelope raise RemoteProtocolError, nothing else."""
    with pytest.raises(RemoteProtocolError):
        decode_envelope(frame)


def test_malformed_request_with_method_and_id_is_answerable() -> None:
    """A request frame with a bad field still names whom to answer."""
    obj = parse_frame(
        b'{"method": "m", "retry": 5, "correlation": {"id": "c", "phase": "request"}}'
    )
    assert answerable(obj) == ("m", "c")


@pytest.mark.parametrize(
    "frame",
    [
        b'{"method": "m", "correlation": {"id": "c", "phase": "response"}}',
        b'{"method": "##VirtualStream##", "correlation": {"id": "c", "phase": "request"}}',
        b'{"correlation": {"id": "c", "phase": "request"}}',
        b'{"method": "m", "correlation": {"id": 3, "phase": "request"}}',
    ],
)
def test_frames_without_a_request_identity_are_not_answerable(frame: bytes) -> None:
    """Responses, stream frames and frames without method or id get no answer."""
    assert answerable(parse_frame(frame)) is None


def test_encoding_a_secret_fails_without_revealing_it() -> None:
    """orjson refuses a Secret (no str() fallback), and the error text has no secret."""
    env = Envelope("m", {"token": Secret("hunter2")}, None, Correlation("c", "request"))
    with pytest.raises(TypeError) as caught:
        encode_envelope(env)
    assert "hunter2" not in str(caught.value)


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def test_a_reply_whose_echo_does_not_encode_carries_request_null() -> None:
    """An echo orjson cannot write (here 300 levels) is left out: the reply still goes out."""
    env = Envelope("m", {"x": _nested(300)}, None, Correlation("c1", "request"))
    assert orjson.loads(encode_reply(reply(env, {"ok": True}))) == {
        "method": "m",
        "request": None,
        "response": {"ok": True},
        "correlation": {"id": "c1", "phase": "response"},
        "localData": None,
    }


def test_a_reply_whose_own_response_does_not_encode_still_raises() -> None:
    """The fallback is for the peer's echo only; our own non-JSON response is our bug."""
    env = Envelope("m", {"x": 1}, None, Correlation("c1", "request"))
    with pytest.raises(TypeError):
        encode_reply(reply(env, {"x": object()}))


@pytest.mark.parametrize(
    ("value", "depth"),
    [(1, 0), ({}, 1), ([], 1), ({"a": [{}]}, 3), ([1, [2, [3]], "x"], 3), ({"a": 1, "b": [[]]}, 3)],
)
def test_nesting_depth_counts_arrays_and_objects(value: Any, depth: int) -> None:
    """`nests_deeper(value, n)` holds exactly when more than n containers nest."""
    assert not nests_deeper(value, depth)
    assert depth == 0 or nests_deeper(value, depth - 1)


def test_a_frame_past_the_depth_bound_is_no_envelope() -> None:
    """`envelope_from_json` refuses a frame nesting more than MAX_DEPTH levels."""
    ok = {"method": "m", "request": _nested(MAX_DEPTH - 1)}  # the envelope is one level
    assert envelope_from_json(ok).request == _nested(MAX_DEPTH - 1)
    with pytest.raises(RemoteProtocolError, match="deeper than"):
        envelope_from_json({"method": "m", "request": _nested(MAX_DEPTH)})
