"""Binary chunk forms inside `chunkData` (wire.md §4.5) and the closing bit.

Accepted on input, whatever the sender's JSON serialiser made of its bytes:
- `{"type": "Buffer", "data": [0..255, ...]}`: a Node `Buffer` through `JSON.stringify`;
- `{"0": 1, "1": 2, ...}`: a `Uint8Array` through `JSON.stringify` (slow: one key per byte);
- `{"type": "EncodedBuffer", "data": "base64:..."}`: smartjson's form (typedserver HTTP);
- the closing-bit string, which ends the stream.

Sent: the Buffer form by default, the only one a plain `JSON.parse` TS peer turns back into
bytes; `"base64"` sends EncodedBuffer, which only a smartjson-parsing peer revives.
`encode_chunk` hands back an `EncodedChunk`: the chunkData's JSON text, made by
`agent.protocol.bytearrays` (the native encoder when built) and spliced into the frame as it is.

Speed (bench/codec.py): a Buffer-form or base64 frame arriving as bytes has its payload cut out
without parsing it (`chunk_frames`), as a `RawChunk` that `decode_chunk` turns into bytes later
(`bytearrays`: native or pybase64) -- off the event loop, for a large chunk (the responder
queues it undecoded; `agent.protocol.stream_responder`), unless a quick decoder takes it at
once (`RawChunk.decode_quick`: the native wide kernel, pybase64). Any other frame is parsed by
orjson as a whole and `bytes(list)` builds the chunk.
"""

from __future__ import annotations

import enum
from functools import lru_cache
from typing import Any, Final, Literal

import orjson

from agent.errors import RemoteProtocolError
from agent.protocol.bytearrays import (
    decode_base64,
    decode_int_array,
    encode_base64,
    encode_int_array,
    quick_base64,
    quick_int_array,
)

__all__ = [
    "CLOSING",
    "CLOSING_BIT",
    "ChunkForm",
    "Closing",
    "EncodedChunk",
    "RawChunk",
    "decode_chunk",
    "encode_chunk",
]

CLOSING_BIT: Final = "#############CLOSING BIT#############"
ChunkForm = Literal["buffer", "base64"]
_BASE64_PREFIX: Final = "base64:"
_BASE64_PREFIX_BYTES: Final = b"base64:"


class Closing(enum.Enum):
    """The end-of-stream marker, as a value distinct from every `bytes`."""

    CLOSING = "closing"


CLOSING: Final = Closing.CLOSING


class RawChunk:
    """A Buffer-form or base64 `chunkData` cut out of its frame, not decoded yet.

    `text` is a view into the frame (no copy): the int array (`[..]`, form `buffer`) or the
    EncodedBuffer string's content (`base64:..`, form `base64`). `frame_bytes` is the size of
    the frame it keeps alive, what a receive window counts. `decode()` (pure, thread-safe) gives
    the bytes or raises `RemoteProtocolError`. It has no JSON form: its text is the peer's and
    unchecked, and nothing we send carries it back (the encoder refuses it like any non-JSON
    value).
    """

    __slots__ = ("form", "frame_bytes", "text")

    def __init__(self, form: ChunkForm, text: memoryview, frame_bytes: int) -> None:
        self.form: Final = form
        self.text: Final = text
        self.frame_bytes: Final = frame_bytes

    def __repr__(self) -> str:
        return f"RawChunk({self.form}, {len(self.text)} characters)"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RawChunk) and (other.form, other.text) == (self.form, self.text)

    def __hash__(self) -> int:
        return hash((self.form, bytes(self.text)))

    def decode(self) -> bytes:
        """The bytes it stands for; raises `RemoteProtocolError`."""
        if self.form == "buffer":
            return decode_int_array(self.text)
        if self.text[: len(_BASE64_PREFIX_BYTES)].tobytes() != _BASE64_PREFIX_BYTES:
            raise RemoteProtocolError("EncodedBuffer data lacks the base64: prefix")
        return decode_base64(self.text[len(_BASE64_PREFIX_BYTES) :])

    def decode_quick(self) -> bytes | None:
        """The bytes, when a quick decoder takes the payload at once (`quick_int_array`,
        `quick_base64`: cheaper on the event loop than a hand-over to a worker thread); else
        None, and `decode()` decides. Never another answer than `decode()`'s."""
        if self.form == "buffer":
            return quick_int_array(self.text)
        if self.text[: len(_BASE64_PREFIX_BYTES)].tobytes() != _BASE64_PREFIX_BYTES:
            return None
        return quick_base64(self.text[len(_BASE64_PREFIX_BYTES) :])


class EncodedChunk:
    """A `chunkData` already written as JSON text (`json`), spliced into a frame unchanged."""

    __slots__ = ("json",)

    def __init__(self, json: bytes) -> None:
        self.json: Final = json

    def __repr__(self) -> str:
        return f"EncodedChunk({len(self.json)} characters)"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, EncodedChunk) and other.json == self.json

    def __hash__(self) -> int:
        return hash(self.json)

    def to_json(self) -> orjson.Fragment:
        """The text, for orjson to embed."""
        return orjson.Fragment(self.json)


def decode_chunk(value: Any) -> bytes | Closing:
    """The bytes (or `CLOSING`) a `chunkData` value stands for; raises `RemoteProtocolError`."""
    if isinstance(value, RawChunk):
        return value.decode()
    if isinstance(value, EncodedChunk):  # our own chunk, handed over in-process
        value = orjson.loads(value.json)
    if value == CLOSING_BIT:
        return CLOSING
    if not isinstance(value, dict):
        raise RemoteProtocolError("chunkData is neither a binary form nor the closing bit")
    kind = value.get("type")
    if kind == "Buffer" and isinstance(value.get("data"), list):
        return _from_ints(value["data"])
    if kind == "EncodedBuffer" and isinstance(value.get("data"), str):
        return _from_base64(value["data"])
    return _from_index_object(value)


def encode_chunk(data: bytes | Closing, form: ChunkForm = "buffer") -> EncodedChunk | str:
    """The `chunkData` for `data` in `form`: JSON text to splice in, or the closing-bit string."""
    if data is CLOSING:
        return CLOSING_BIT
    assert isinstance(data, bytes | bytearray | memoryview)
    if form == "base64":
        return EncodedChunk(
            b'{"type":"EncodedBuffer","data":"base64:' + encode_base64(data) + b'"}'
        )
    if form == "buffer":
        return EncodedChunk(b'{"type":"Buffer","data":' + encode_int_array(data) + b"}")
    raise ValueError(f"unknown chunk form {form!r}")


def _from_ints(values: list[Any]) -> bytes:
    try:
        # bytes() checks every item is an int in 0..255 (bool passes as 0/1, as in a Uint8Array).
        return bytes(values)
    except (TypeError, ValueError) as exc:
        raise RemoteProtocolError("chunkData.data holds a value that is no byte") from exc


def _from_base64(text: str) -> bytes:
    if not text.startswith(_BASE64_PREFIX):
        raise RemoteProtocolError("EncodedBuffer data lacks the base64: prefix")
    return decode_base64(text[len(_BASE64_PREFIX) :])


def _from_index_object(value: dict[str, Any]) -> bytes:
    if not value:
        return b""  # an empty Uint8Array serialises to {}
    keys = list(value)
    if keys != _index_keys(len(keys)):
        # JSON.stringify writes indices in order; accept any other order of exactly 0..n-1.
        try:
            by_index = {_index(key): item for key, item in value.items()}
        except ValueError as exc:
            raise RemoteProtocolError("chunkData has a key that is no byte index") from exc
        if sorted(by_index) != list(range(len(keys))):
            raise RemoteProtocolError("chunkData byte indices are not 0..n-1")
        return _from_ints([by_index[i] for i in range(len(keys))])
    return _from_ints(list(value.values()))


def _index(key: str) -> int:
    if not (key.isascii() and key.isdigit()):
        raise ValueError(key)
    return int(key)


@lru_cache(maxsize=4)
def _index_keys(length: int) -> list[str]:
    # Chunk sizes repeat within a stream, so the expected key list is built once per size.
    return [str(i) for i in range(length)]
