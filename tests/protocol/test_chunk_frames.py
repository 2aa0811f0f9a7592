"""Splitting chunk frames: the payload cut out undecoded, the rest exactly orjson's reading, or
the splitter steps aside; decoding the payload gives orjson's verdict."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest
from hypothesis import given, settings, strategies as st

from agent.errors import RemoteProtocolError
from agent.protocol import chunk_frames
from agent.protocol.chunks import CLOSING, RawChunk, decode_chunk, encode_chunk
from agent.protocol.envelope import (
    STREAM_METHOD,
    Envelope,
    decode_envelope,
    encode_envelope,
    parse_frame,
)
from agent.protocol.stream_frames import StreamPackage, package_from_json, stream_frame

HEAD = (
    b'{"method":"##VirtualStream##","request":{"streamId":"uni_a","cycleId":"uni_b",'
    b'"cycle":"request","mainPurpose":"chunk","next":true,"backpressure":false,'
)
TAIL = b'},"response":null}'


def chunk_frame(data: bytes) -> bytes:
    """The frame our own encoder (and TS `JSON.stringify`) writes for one Buffer-form chunk."""
    package = StreamPackage(
        "uni_a", "uni_b", "request", "chunk", next=True, chunk_data=encode_chunk(data)
    )
    return encode_envelope(stream_frame(package))


def fast(frame: bytes) -> dict[str, Any] | None:
    return chunk_frames.split_chunk_frame(frame, STREAM_METHOD)


def assert_same_as_orjson(frame: bytes, side: str = "request") -> bytes:
    """The fast path applies and equals orjson's reading; returns the decoded chunk (the
    `chunkData` of `side`)."""
    got = fast(frame)
    assert got is not None, "fast path did not apply"
    want = orjson.loads(frame)
    got_chunk = got[side].pop("chunkData")
    want_chunk = want[side].pop("chunkData")
    assert isinstance(got_chunk, RawChunk)
    assert got_chunk.frame_bytes == len(frame)
    assert got == want
    decoded = decode_chunk(got_chunk)
    assert decoded == decode_chunk(want_chunk)
    assert isinstance(decoded, bytes)
    return decoded


def assert_falls_back(frame: bytes) -> None:
    """The fast path steps aside and `parse_frame` gives orjson's reading (or its error)."""
    assert fast(frame) is None
    try:
        want = orjson.loads(frame)
    except orjson.JSONDecodeError:
        with pytest.raises(RemoteProtocolError):
            parse_frame(frame)
        return
    assert parse_frame(frame) == want


random_chunks = st.one_of(
    st.binary(max_size=1024),
    st.builds(
        lambda size, seed: random.Random(seed).randbytes(size),
        st.integers(0, 64 * 1024),
        st.integers(0, 2**32),
    ),
)


@settings(max_examples=60, deadline=None)
@given(random_chunks)
def test_random_chunks_decode_as_orjson_does(data: bytes) -> None:
    """Any chunk of 0..64 KiB is split and decodes to the bytes and object orjson gives."""
    assert assert_same_as_orjson(chunk_frame(data)) == data


def test_every_byte_value_decodes() -> None:
    """All 256 byte values survive the round trip."""
    data = bytes(range(256)) * 3
    assert assert_same_as_orjson(chunk_frame(data)) == data


def test_empty_array_decodes_to_an_empty_chunk() -> None:
    """`data: []` is an empty chunk on the fast path too."""
    assert assert_same_as_orjson(HEAD + b'"chunkData":{"type":"Buffer","data":[]}' + TAIL) == b""


def test_whitespace_inside_the_array_and_around_the_frame_decodes() -> None:
    """JSON whitespace inside the array and outside the marker pattern keeps the split."""
    frame = (
        b'{ "method" : "##VirtualStream##" ,\n "request" : {"streamId":"uni_a","cycleId":"uni_b",'
        b'"cycle":"request","mainPurpose":"chunk",\t"chunkData":{"type":"Buffer","data":'
        b"[ 1 ,\n2\t,\r\n255 ] } } ,\r\n"
        b' "response" : null }'
    )
    assert assert_same_as_orjson(frame) == b"\x01\x02\xff"


def test_whitespace_inside_the_marker_pattern_falls_back() -> None:
    """`"chunkData": {"type": "Buffer", ...` (spaced) is left to orjson."""
    frame = HEAD + b'"chunkData": {"type": "Buffer", "data": [1, 2]}' + TAIL
    assert_falls_back(frame)
    assert decode_chunk(parse_frame(frame)["request"]["chunkData"]) == b"\x01\x02"


def test_pattern_in_an_earlier_nested_object_falls_back() -> None:
    """A Buffer object under another key, before the real chunkData, is not taken for it."""
    frame = (
        HEAD + b'"meta":{"chunkData":{"type":"Buffer","data":[9,9]}},'
        b'"chunkData":{"type":"Buffer","data":[]}' + TAIL
    )
    assert_falls_back(frame)


def test_pattern_in_a_later_nested_object_keeps_its_ints() -> None:
    """A Buffer object after the real chunkData stays an int list; the chunk decodes fast."""
    frame = (
        HEAD + b'"chunkData":{"type":"Buffer","data":[7]}},'
        b'"response":{"x":{"chunkData":{"type":"Buffer","data":[8]}}}}'
    )
    assert assert_same_as_orjson(frame) == b"\x07"


def test_the_chunk_of_a_read_answer_is_decoded_like_orjson() -> None:
    """`response.chunkData` (the answer to a `read` we sent) takes the fast path too."""
    frame = (
        b'{"method":"##VirtualStream##","response":{"chunkData":{"type":"Buffer","data":[1,2]}},'
        b'"request":{"mainPurpose":"read"}}'
    )
    assert assert_same_as_orjson(frame, "response") == b"\x01\x02"


def test_pattern_outside_request_and_response_falls_back() -> None:
    """A Buffer chunkData under neither `request` nor `response` leaves the frame to orjson."""
    frame = (
        b'{"method":"##VirtualStream##","other":{"chunkData":{"type":"Buffer","data":[1]}},'
        b'"request":null,"response":null}'
    )
    assert_falls_back(frame)


def test_duplicate_chunk_data_key_falls_back() -> None:
    """A later duplicate `chunkData` (orjson keeps the last) leaves the frame to orjson."""
    frame = (
        HEAD + b'"chunkData":{"type":"Buffer","data":[1]},'
        b'"chunkData":{"type":"Buffer","data":[]}' + TAIL
    )
    assert_falls_back(frame)


def test_duplicate_data_key_falls_back() -> None:
    """A later duplicate `data` inside chunkData (written escaped) leaves the frame to orjson."""
    frame = HEAD + b'"chunkData":{"type":"Buffer","data":[1],"d\\u0061ta":[]}' + TAIL
    assert_falls_back(frame)


def test_duplicate_request_key_falls_back() -> None:
    """A later duplicate `request` hides the first; the frame is left to orjson."""
    frame = (
        HEAD + b'"chunkData":{"type":"Buffer","data":[1]}},'
        b'"request":{"chunkData":{"type":"Buffer","data":[]}},"response":null}'
    )
    assert_falls_back(frame)


def test_escaped_quote_before_the_pattern_falls_back() -> None:
    """`"x\\"chunkData":{..}` is a key named x"chunkData, not chunkData."""
    frame = (
        HEAD + b'"x\\"chunkData":{"type":"Buffer","data":[1]},'
        b'"chunkData":{"type":"Buffer","data":[]}' + TAIL
    )
    assert_falls_back(frame)


def orjson_verdict(frame: bytes) -> bytes | None:
    """The chunk the plain orjson path reads from `frame`, or None where it refuses."""
    try:
        return decode_chunk(orjson.loads(frame)["request"]["chunkData"])  # type: ignore[return-value]
    except (orjson.JSONDecodeError, RemoteProtocolError):
        return None


@pytest.mark.parametrize(
    "array",
    [b"[256]", b"[1,-1]", b"[1.5]", b"[1.0]", b"[1e2]", b"[null]", b'["1"]',
     b"[18446744073709551616]", b"[01]", b"[1,]", b"[,1]", b"[1 2]", b"[1,,2]"],
)  # fmt: skip
def test_arrays_of_non_bytes_are_cut_out_and_refused_when_decoded(array: bytes) -> None:
    """Anything but ints 0..255 is taken from the frame and refused by its decoder, as orjson
    refuses it (where the frame is invalid JSON, orjson refused the whole frame)."""
    frame = HEAD + b'"chunkData":{"type":"Buffer","data":' + array + b"}" + TAIL
    got = fast(frame)
    assert got is not None
    with pytest.raises(RemoteProtocolError):
        decode_chunk(got["request"]["chunkData"])
    assert orjson_verdict(frame) is None


@pytest.mark.parametrize(
    ("array", "data"), [(b"[true,false]", b"\x01\x00"), (b"[-0]", b"\x00"), (b"[ 7 ]", b"\x07")]
)
def test_arrays_orjson_reads_as_bytes_decode_alike(array: bytes, data: bytes) -> None:
    """Booleans (0/1, as in a Uint8Array), `-0` and spaced arrays decode as orjson reads them."""
    frame = HEAD + b'"chunkData":{"type":"Buffer","data":' + array + b"}" + TAIL
    assert assert_same_as_orjson(frame) == data == orjson_verdict(frame)


@pytest.mark.parametrize("array", [b"[[1],[2]]", b"[1,[2]]", b"[1"])
def test_nested_or_unclosed_arrays_fall_back(array: bytes) -> None:
    """A nested or unclosed array leaves the rest no valid JSON: orjson decides the frame."""
    frame = HEAD + b'"chunkData":{"type":"Buffer","data":' + array + b"}" + TAIL
    assert_falls_back(frame)


def test_base64_chunk_frames_are_cut_out_too() -> None:
    """An EncodedBuffer chunk is split like a Buffer one and decodes to orjson's reading."""
    data = random.Random(7).randbytes(5000)
    package = StreamPackage(
        "uni_a", "uni_b", "request", "chunk", chunk_data=encode_chunk(data, "base64")
    )
    frame = encode_envelope(stream_frame(package))
    assert assert_same_as_orjson(frame) == data


def test_base64_with_a_json_escape_falls_back() -> None:
    """`\\/` (a legal JSON escape of `/`) is left to orjson, which reads the same bytes."""
    frame = HEAD + b'"chunkData":{"type":"EncodedBuffer","data":"base64:AB\\/A"}' + TAIL
    assert_falls_back(frame)
    assert decode_chunk(parse_frame(frame)["request"]["chunkData"]) == b"\x00\x1f\xc0"


@pytest.mark.parametrize("text", [b"AQI", b"AQI=A", b"AQ I=", b"A\xffI="])
def test_bad_base64_is_cut_out_and_refused_when_decoded(text: bytes) -> None:
    """Invalid base64 (or bytes no JSON string may hold) is refused by its decoder."""
    frame = HEAD + b'"chunkData":{"type":"EncodedBuffer","data":"base64:' + text + b'"}' + TAIL
    got = fast(frame)
    assert got is not None
    with pytest.raises(RemoteProtocolError, match="not valid base64"):
        decode_chunk(got["request"]["chunkData"])
    assert orjson_verdict(frame) is None


def test_base64_without_its_prefix_is_refused_when_decoded() -> None:
    """EncodedBuffer data without `base64:` is refused, as on the orjson path."""
    frame = HEAD + b'"chunkData":{"type":"EncodedBuffer","data":"AQI="}' + TAIL
    got = fast(frame)
    assert got is not None
    with pytest.raises(RemoteProtocolError, match="prefix"):
        decode_chunk(got["request"]["chunkData"])
    assert orjson_verdict(frame) is None


def test_closing_bit_frame_falls_back() -> None:
    """The closing-bit string has no array to decode: orjson reads it."""
    frame = HEAD + b'"chunkData":"#############CLOSING BIT#############"' + TAIL
    assert_falls_back(frame)
    assert decode_chunk(parse_frame(frame)["request"]["chunkData"]) is CLOSING


def test_other_methods_fall_back() -> None:
    """Only `##VirtualStream##` frames take the fast path."""
    frame = chunk_frame(b"\x01").replace(b"##VirtualStream##", b"benchUpload")
    assert_falls_back(frame)


def test_text_frames_take_the_orjson_path() -> None:
    """A `str` frame is parsed by orjson: chunkData stays the int-list object."""
    frame = chunk_frame(b"\x01\x02").decode()
    assert parse_frame(frame)["request"]["chunkData"] == {"type": "Buffer", "data": [1, 2]}


def test_parse_frame_uses_the_fast_path_for_chunk_frames() -> None:
    """`parse_frame` hands back a RawChunk that the stream package and decoder accept."""
    package = package_from_json(decode_envelope(chunk_frame(b"\x00\x10\xff")).request)
    assert isinstance(package.chunk_data, RawChunk)
    assert decode_chunk(package.chunk_data) == b"\x00\x10\xff"


def test_a_cut_out_chunk_is_never_written_back() -> None:
    """A payload cut out undecoded is the peer's unchecked text: the encoder refuses it."""
    frame = chunk_frame(bytes(range(256))).replace(b"[0,1,", b"[0,\xff\xfe,1,")
    env = decode_envelope(frame)
    assert isinstance(env.request["chunkData"], RawChunk)
    with pytest.raises(TypeError):
        encode_envelope(Envelope(env.method, env.request, None, is_reply=True))


def test_unserialisable_payloads_still_raise_type_error() -> None:
    """The encoder's chunk hook refuses every other non-JSON type."""
    with pytest.raises(TypeError):
        encode_envelope(Envelope("m", request={"x": object()}))


PIECES = [
    b'"chunkData":{"type":"Buffer","data":[1,2]}',
    b'"chunkData":{"type":"EncodedBuffer","data":"base64:AQI="}',
    b'"chunkData":{"type":"Other","data":[1]}',
    b'"chunkData":{"type":"',
    b'"',
    b"[",
    b'{"a":1},',
    b"x",
]


@settings(max_examples=500)
@given(st.lists(st.sampled_from(PIECES), max_size=8))
def test_the_payload_is_found_where_the_rule_says(pieces: list[bytes]) -> None:
    """The payload's pattern is the first Buffer-form one, else the first base64 one, wherever
    others lie around it (one search for their common start finds it in a chunk frame), and
    its payload ends at the first `]` or `"` after it opened."""
    frame = b"".join(pieces)
    buffer_at = frame.find(chunk_frames._BUFFER)
    base64_at = frame.find(chunk_frames._BASE64)
    if buffer_at >= 0:
        end = frame.find(b"]", buffer_at + len(chunk_frames._BUFFER))
        want: tuple[str, int, int] | None = ("buffer", buffer_at, end)
    elif base64_at >= 0:
        end = frame.find(b'"', base64_at + len(chunk_frames._BASE64))
        want = ("base64", base64_at, end)
    else:
        want = None
    assert chunk_frames._locate(frame) == want
