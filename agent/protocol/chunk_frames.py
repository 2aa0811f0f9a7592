"""Fast decode of a Buffer-form chunk frame: the byte array parsed natively, not as Python ints.

A 1 MiB chunk in the Buffer form (`"chunkData":{"type":"Buffer","data":[1,2,..]}`) is ~3.7 MB
of JSON; `orjson.loads` builds a million-int list that `bytes()` then walks. Here only the int
array is handed to simdjson, which writes it into a uint64 buffer without creating Python ints,
and the small rest of the frame goes to orjson with the array spliced out.

The result is the object `orjson.loads(frame)` would give, except that the `chunkData` of
`request` (a chunk we receive as a responder) or of `response` (the answer to a `read` we sent
as the initiator reading a stream) is a `DecodedBuffer` holding the bytes the int list stands
for. Every step is checked and anything
unexpected returns `None`, so the caller takes the plain orjson path:
- the array is the first raw `"chunkData":{"type":"Buffer","data":[`; its opening quote is not
  preceded by a backslash, so it opens a key (an unescaped quote inside a string is invalid
  JSON), and the array ends at the first `]` (an int array holds none; anything nested makes
  the slice invalid JSON, which simdjson rejects);
- simdjson must read the slice as unsigned integers, each 0..255;
- the rest is parsed twice, with `[]` and with `[0]` spliced in: `request.chunkData.data` (or
  `response.chunkData.data`) must follow the splice, which proves the spliced array is the one
  the frame's `chunkData` resolves to (not another object with the same text, nor one hidden by
  a duplicate key). This check alone settles where the array sits; the backslash test above is
  a cheap early exit.

Without simdjson installed (`simdjson` is `None`) the fast path is off.
"""

from __future__ import annotations

import sys
import threading
from types import ModuleType
from typing import Any, Final

import orjson

from agent.protocol.chunks import DecodedBuffer

simdjson: ModuleType | None
try:
    import simdjson
except ImportError:  # pragma: no cover - the agent still runs on the orjson path
    simdjson = None

__all__ = ["decode_buffer_frame"]

_PATTERN: Final = b'"chunkData":{"type":"Buffer","data":['
_EMPTY: Final = {"type": "Buffer", "data": []}
_PROBE: Final = {"type": "Buffer", "data": [0]}
# The low byte of a uint64 is its first byte only on a little-endian machine.
_LITTLE_ENDIAN: Final = sys.byteorder == "little"
_local = threading.local()  # a simdjson parser is not thread-safe; reusing one halves parse time


def decode_buffer_frame(frame: bytes, method: str) -> dict[str, Any] | None:
    """`orjson.loads(frame)` with its `chunkData` as a `DecodedBuffer`, or `None`.

    `None` means the fast path does not apply (or simdjson is missing): parse with orjson.
    Only frames whose `method` equals `method` are decoded.
    """
    if simdjson is None or not _LITTLE_ENDIAN:
        return None
    start = frame.find(_PATTERN)
    if start <= 0 or frame[start - 1] == 0x5C:  # a backslash: the quote may be escaped
        return None
    open_at = start + len(_PATTERN) - 1
    close_at = frame.find(b"]", open_at)
    if close_at < 0:
        return None
    data = _byte_array(simdjson, frame[open_at : close_at + 1])
    if data is None:
        return None
    head, tail = frame[:open_at], frame[close_at + 1 :]
    obj = _loads(head + b"[]" + tail)
    probe = _loads(head + b"[0]" + tail)
    if obj is None or probe is None or obj.get("method") != method:
        return None
    for side in ("request", "response"):
        if _chunk_data(obj, side) == _EMPTY and _chunk_data(probe, side) == _PROBE:
            obj[side]["chunkData"] = DecodedBuffer(data)
            return obj
    return None


def _byte_array(lib: ModuleType, text: bytes) -> bytes | None:
    """The bytes a JSON array of ints 0..255 stands for, or `None` if `text` is anything else."""
    parser = getattr(_local, "parser", None)
    if parser is None:
        parser = _local.parser = lib.Parser()
    try:
        doc = parser.parse(text)
        try:
            # as_buffer would flatten nested arrays, but the slice cannot hold one: it ends at
            # the first `]`, so an inner `[` would leave the outer array open (a parse error).
            # The buffer is simdjson's own copy; it is viewed, never copied again.
            words = memoryview(doc.as_buffer(of_type="u")).cast("B")
        finally:
            del doc  # the parser refuses to parse again while a proxy of its document lives
    except Exception:  # noqa: BLE001 - any failure of the accelerator means: use orjson
        return None
    with words:
        return _low_bytes(words)


def _low_bytes(words: memoryview) -> bytes | None:
    """The low byte of every uint64 in `words`, or `None` if any value is above 255."""
    low = words[::8].tobytes()
    # Every value is 0..255 exactly when each 8-byte word is its low byte and seven zeros.
    # The zeroed template is kept per thread (chunk sizes repeat); only every 8th byte of it is
    # ever written, so the other bytes stay zero.
    template: bytearray | None = getattr(_local, "template", None)
    if template is None or len(template) != len(words):
        template = _local.template = bytearray(len(words))
    template[::8] = low
    if template != words:
        return None
    return low


def _loads(text: bytes) -> dict[str, Any] | None:
    try:
        obj = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def _chunk_data(obj: dict[str, Any], side: str) -> Any:
    package = obj.get(side)
    return package.get("chunkData") if isinstance(package, dict) else None
