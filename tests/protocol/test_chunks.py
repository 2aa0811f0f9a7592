"""Binary chunk forms and the closing bit (wire.md §4.5)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from agent.errors import RemoteProtocolError
from agent.protocol.chunks import (
    CLOSING,
    CLOSING_BIT,
    EncodedChunk,
    decode_chunk,
    encode_chunk,
)
from agent.protocol.envelope import encode_envelope
from agent.protocol.stream_frames import StreamPackage, stream_frame

DATA = bytes([104, 101, 108, 108, 111, 0, 255])


def test_buffer_form_decodes() -> None:
    """{"type":"Buffer","data":[..]} (a Node Buffer through JSON) decodes to its bytes."""
    assert decode_chunk({"type": "Buffer", "data": list(DATA)}) == DATA


def test_uint8array_index_object_decodes() -> None:
    """{"0":..,"1":..} (a Uint8Array through JSON) decodes to its bytes."""
    assert decode_chunk({str(i): b for i, b in enumerate(DATA)}) == DATA


def test_index_object_in_any_key_order_decodes() -> None:
    """Index keys out of order still give the bytes in index order."""
    assert decode_chunk({"2": 3, "0": 1, "1": 2}) == b"\x01\x02\x03"


def test_empty_index_object_is_an_empty_chunk() -> None:
    """An empty Uint8Array serialises to {} and decodes to b""."""
    assert decode_chunk({}) == b""


def test_encoded_buffer_form_decodes() -> None:
    """smartjson's {"type":"EncodedBuffer","data":"base64:.."} decodes to its bytes."""
    assert decode_chunk({"type": "EncodedBuffer", "data": "base64:aGVsbG8A/w=="}) == DATA


def test_closing_bit_decodes_to_closing() -> None:
    """The closing-bit string is the end marker."""
    assert decode_chunk(CLOSING_BIT) is CLOSING


def test_buffer_form_is_sent_by_default_as_json_stringify_writes_it() -> None:
    """encode_chunk writes the Buffer form a JSON.parse peer rebuilds, byte for byte as
    `JSON.stringify(buffer)` does, and it round-trips."""
    encoded = encode_chunk(DATA)
    assert isinstance(encoded, EncodedChunk)
    assert encoded.json == b'{"type":"Buffer","data":[104,101,108,108,111,0,255]}'
    assert decode_chunk(orjson.loads(encoded.json)) == DATA
    assert decode_chunk(encoded) == DATA


def test_base64_form_round_trips() -> None:
    """The EncodedBuffer form is smartjson's text and round-trips."""
    encoded = encode_chunk(DATA, "base64")
    assert isinstance(encoded, EncodedChunk)
    assert encoded.json == b'{"type":"EncodedBuffer","data":"base64:aGVsbG8A/w=="}'
    assert decode_chunk(orjson.loads(encoded.json)) == DATA


def test_encoded_chunks_splice_into_a_frame_unchanged() -> None:
    """The envelope encoder embeds an encoded chunk's JSON text as it is."""
    package = StreamPackage("s", "c", "request", "chunk", chunk_data=encode_chunk(b"\x01"))
    frame = encode_envelope(stream_frame(package))
    assert b'"chunkData":{"type":"Buffer","data":[1]}' in frame


def test_closing_encodes_to_the_closing_bit_string() -> None:
    """CLOSING goes on the wire as the literal closing-bit string."""
    assert encode_chunk(CLOSING) == "#############CLOSING BIT#############"


def test_unknown_form_name_is_refused() -> None:
    """An unknown chunk form is a programming error."""
    with pytest.raises(ValueError, match="unknown chunk form"):
        encode_chunk(DATA, "hex")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "value",
    [
        None,
        "some string",
        [1, 2, 3],
        {"type": "Buffer", "data": [1, 256]},
        {"type": "Buffer", "data": [1, -1]},
        {"type": "Buffer", "data": [1, "2"]},
        {"type": "Buffer", "data": [1.5]},
        {"type": "EncodedBuffer", "data": "aGVsbG8="},
        {"type": "EncodedBuffer", "data": "base64:!!!"},
        {"0": 1, "2": 2},
        {"0": 1, "x": 2},
        {"0": 1, "1": 300},
    ],
)
def test_values_that_are_no_chunk_raise_remote_protocol_error(value: Any) -> None:
    """Anything that is no binary form or is out of byte range is refused."""
    with pytest.raises(RemoteProtocolError):
        decode_chunk(value)
