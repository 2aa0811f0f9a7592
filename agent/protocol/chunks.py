"""Binary chunk forms inside `chunkData` (wire.md §4.5) and the closing bit.

Accepted on input, whatever the sender's JSON serialiser made of its bytes:
- `{"type": "Buffer", "data": [0..255, ...]}`: a Node `Buffer` through `JSON.stringify`;
- `{"0": 1, "1": 2, ...}`: a `Uint8Array` through `JSON.stringify` (slow: one key per byte);
- `{"type": "EncodedBuffer", "data": "base64:..."}`: smartjson's form (typedserver HTTP);
- the closing-bit string, which ends the stream.

Sent: the Buffer form by default, the only one a plain `JSON.parse` TS peer turns back into
bytes; `"base64"` sends EncodedBuffer, which only a smartjson-parsing peer revives.

Speed (bench/codec.py): a Buffer-form frame arriving as bytes has its int array parsed natively
by `chunk_frames` (simdjson), which hands `decode_chunk` a `DecodedBuffer`; any other frame is
parsed by orjson as a whole and `bytes(list)` builds the chunk. Measured pure-Python
alternatives (slicing the array text and parsing it with orjson, `split` plus a lookup table,
regexes) were slower than orjson, so there is no hand-written parser to get wrong.
"""

from __future__ import annotations

import binascii
import enum
from functools import lru_cache
from typing import Any, Final, Literal

from agent.errors import RemoteProtocolError

__all__ = [
    "CLOSING",
    "CLOSING_BIT",
    "ChunkForm",
    "Closing",
    "DecodedBuffer",
    "decode_chunk",
    "encode_chunk",
]

CLOSING_BIT: Final = "#############CLOSING BIT#############"
ChunkForm = Literal["buffer", "base64"]
_BASE64_PREFIX: Final = "base64:"


class Closing(enum.Enum):
    """The end-of-stream marker, as a value distinct from every `bytes`."""

    CLOSING = "closing"


CLOSING: Final = Closing.CLOSING


class DecodedBuffer:
    """A Buffer-form `chunkData` whose int array the frame decoder already turned into bytes.

    A plain class, not a dataclass: orjson would serialise a dataclass as `{"data": bytes}`
    instead of asking the encoder's `default` hook (which writes `to_json()`).
    """

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data: Final = data

    def __repr__(self) -> str:
        return f"DecodedBuffer({len(self.data)} bytes)"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DecodedBuffer) and other.data == self.data

    def __hash__(self) -> int:
        return hash(self.data)

    def to_json(self) -> dict[str, Any]:
        """The Buffer form it was decoded from, for a frame that echoes it back."""
        return {"type": "Buffer", "data": list(self.data)}


def decode_chunk(value: Any) -> bytes | Closing:
    """The bytes (or `CLOSING`) a `chunkData` value stands for; raises `RemoteProtocolError`."""
    if isinstance(value, DecodedBuffer):
        return value.data
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


def encode_chunk(data: bytes | Closing, form: ChunkForm = "buffer") -> Any:
    """The JSON-ready `chunkData` for `data` in `form`."""
    if data is CLOSING:
        return CLOSING_BIT
    assert isinstance(data, bytes | bytearray | memoryview)
    if form == "base64":
        return {"type": "EncodedBuffer", "data": _BASE64_PREFIX + _b64(data)}
    if form == "buffer":
        return {"type": "Buffer", "data": list(data)}
    raise ValueError(f"unknown chunk form {form!r}")


def _b64(data: bytes | bytearray | memoryview) -> str:
    return binascii.b2a_base64(data, newline=False).decode("ascii")


def _from_ints(values: list[Any]) -> bytes:
    try:
        # bytes() checks every item is an int in 0..255 (bool passes as 0/1, as in a Uint8Array).
        return bytes(values)
    except (TypeError, ValueError) as exc:
        raise RemoteProtocolError("chunkData.data holds a value that is no byte") from exc


def _from_base64(text: str) -> bytes:
    if not text.startswith(_BASE64_PREFIX):
        raise RemoteProtocolError("EncodedBuffer data lacks the base64: prefix")
    try:
        return binascii.a2b_base64(text[len(_BASE64_PREFIX) :], strict_mode=True)
    except (binascii.Error, ValueError) as exc:
        raise RemoteProtocolError("EncodedBuffer data is not valid base64") from exc


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
