"""The two binary chunk payloads as text <-> bytes: the Buffer form's int array and base64.

Chosen at import, reported by `codec_backends()` (and in the agent's start-up line):

- **Buffer form** (`[1,2,..]`, JSON ints 0..255): the optional C extension `agent._bufferform`
  (`native`) when it was built: one pass over the text, the GIL released, so a worker thread
  decodes while the event loop keeps serving. Without it, pysimdjson parses the array into a
  uint64 buffer (`simdjson`), else the pure path alone decodes (`orjson`).
  Whatever decodes, the verdict is the pure path's (`pure_int_array`), which is JSON's: an
  array of integers 0..255 or booleans (0/1, as in a `Uint8Array`). The native decoder and
  simdjson answer only text they know is a plain array of bytes and hand anything else
  (`true`, `-0`, `1.0`, a leading zero, 256, ...) to the pure path. That reads the array in
  comma-cut slices (orjson, with stdlib `json` deciding whatever orjson refuses), so refusing a
  bad array costs one slice of memory, never a Python int per value, and no verdict depends on
  orjson's parse pool. tests/protocol/test_bytearrays.py checks all of it differentially, on
  generated, malformed and large arrays, against the stdlib `json` + `bytes()`.
- **base64** (EncodedBuffer's payload): `pybase64` (SIMD, ~25x `binascii` here) with
  `validate=True`; when it refuses, `binascii.a2b_base64(strict_mode=True)` is asked again and
  its verdict stands. The two differ only where pybase64 is stricter (padding after a complete
  quantum, `AAAA=`, which binascii's strict mode lets through), so the result is exactly
  binascii's, at pybase64's speed for every valid payload.

Encoding is the reverse (the native encoder writes what `JSON.stringify` writes for a Buffer's
`data`); both directions work on any bytes-like object, memoryviews included (no copy).
"""

from __future__ import annotations

import binascii
import json
import re
import sys
import threading
from types import ModuleType
from typing import Final

import orjson
import pybase64

from agent.errors import RemoteProtocolError

__all__ = [
    "BUFFER_BACKEND",
    "codec_backends",
    "decode_base64",
    "decode_int_array",
    "encode_base64",
    "encode_int_array",
]

_native: ModuleType | None
try:
    import agent._bufferform as _native
except ImportError:  # pragma: no cover - built wherever a C compiler was; tests assert it is
    _native = None

simdjson: ModuleType | None
try:
    import simdjson
except ImportError:  # pragma: no cover - a dependency; the orjson path still works without it
    simdjson = None

# The low byte of a uint64 is its first byte only on a little-endian machine.
_LITTLE_ENDIAN: Final = sys.byteorder == "little"
_local = threading.local()  # a simdjson parser is not thread-safe; reusing one halves parse time

# The pure path: JSON whitespace, an array's opening, the commas it is cut at, and whitespace
# between two token characters (two tokens with no comma between them, or one split in two).
_JSON_WS: Final = b" \t\n\r"
_HEAD: Final = re.compile(rb"[ \t\n\r]*\[")
_COMMA: Final = re.compile(rb",")
_SPLIT_TOKEN: Final = re.compile(rb"[0-9A-Za-z.+\-][ \t\n\r]+[0-9A-Za-z.+\-]")
_SLICE: Final = 1 << 16  # characters per slice: ~1 MB of Python objects at most, then freed

BUFFER_BACKEND: Final = (
    "native"
    if _native is not None
    else ("simdjson" if simdjson is not None and _LITTLE_ENDIAN else "orjson")
)
_BASE64_BACKEND: Final = (
    "pybase64-c" if "C extension active" in str(pybase64.get_version()) else "pybase64-python"
)


def codec_backends() -> dict[str, str]:
    """Which decoder serves each form: `buffer` native/simdjson/orjson, `base64` pybase64-c."""
    return {"buffer": BUFFER_BACKEND, "base64": _BASE64_BACKEND}


def decode_int_array(text: bytes | memoryview) -> bytes:
    """The bytes the JSON array `text` stands for; `RemoteProtocolError` unless it is an array
    of integers 0..255 (JSON booleans pass as 0/1)."""
    if _native is not None:
        data: bytes | None = _native.decode(text)
        if data is not None:
            return data
    elif simdjson is not None and _LITTLE_ENDIAN:
        data = _simdjson_bytes(simdjson, text)
        if data is not None:
            return data
    return pure_int_array(text)


def pure_int_array(text: bytes | memoryview) -> bytes:
    """`decode_int_array` without the accelerators: the verdict every path must match.

    The verdict is JSON's: `text` is one array whose items are integers 0..255 (`-0` is 0) or
    booleans (0/1, as in a `Uint8Array`), with JSON whitespace where JSON allows it. The array
    is read in slices of about `_SLICE` characters cut at commas, so what a refusal costs is
    bounded by one slice, whatever the frame's size (a whole 15 MiB array of values above 255
    once became millions of Python ints), and reading stops at the first slice that is no list
    of bytes. Each slice is read by orjson with its whitespace taken out (orjson runs out of its
    parse pool on some valid arrays with whitespace in them); whatever orjson refuses, the
    stdlib `json` decides, so no verdict on valid JSON depends on orjson's pool.
    """
    view = memoryview(text)
    head = _HEAD.match(view)
    if head is None:
        raise RemoteProtocolError("chunkData.data is not a JSON array")
    end, pos = len(view), head.end()
    parts: list[bytes] = []
    while True:
        cut = _COMMA.search(view, pos + _SLICE) if pos + _SLICE < end else None
        if cut is None:
            last = view[pos:].tobytes().rstrip(_JSON_WS)
            if not last.endswith(b"]"):
                raise RemoteProtocolError("chunkData.data is not a JSON array")
            if not parts and not last[:-1].strip(_JSON_WS):
                return b""  # `[]`
            parts.append(_slice_bytes(last[:-1]))
            return b"".join(parts)
        parts.append(_slice_bytes(view[pos : cut.start()].tobytes()))
        pos = cut.end()


def _slice_bytes(items: bytes) -> bytes:
    """The bytes of `items`, a comma-separated part of an array; `RemoteProtocolError` unless
    every item is a byte (and there is at least one)."""
    compact = items.translate(None, _JSON_WS)
    if not compact or (len(compact) != len(items) and _SPLIT_TOKEN.search(items)):
        # No item, or whitespace inside a token (`1 2`, `tr ue`): taking the whitespace out
        # would join what JSON keeps apart.
        raise RemoteProtocolError("chunkData.data is not a JSON array")
    text = b"[" + compact + b"]"
    try:
        values = orjson.loads(text)
    except orjson.JSONDecodeError:
        try:  # orjson's refusal is not the verdict: its parse pool can fail on valid JSON
            values = json.loads(text.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            raise RemoteProtocolError("chunkData.data is not a JSON array") from exc
    try:
        # bytes() checks every item is an int in 0..255 (bool passes as 0/1, as in a Uint8Array).
        return bytes(values)
    except (TypeError, ValueError) as exc:
        raise RemoteProtocolError("chunkData.data holds a value that is no byte") from exc


def encode_int_array(data: bytes | bytearray | memoryview) -> bytes:
    """The JSON array text of `data` (`[1,2,3]`), as `JSON.stringify` writes a Buffer's data."""
    if _native is not None:
        text: bytes = _native.encode(data)
        return text
    return orjson.dumps(list(data))


def decode_base64(text: bytes | memoryview | str) -> bytes:
    """Strict base64 (`binascii`'s strict verdict); raises `RemoteProtocolError`."""
    try:
        return pybase64.b64decode(text, validate=True)
    except (binascii.Error, ValueError, TypeError):
        pass  # refused: binascii decides (it also accepts padding after a complete quantum)
    try:
        return binascii.a2b_base64(text, strict_mode=True)
    except (binascii.Error, ValueError) as exc:
        raise RemoteProtocolError("EncodedBuffer data is not valid base64") from exc


def encode_base64(data: bytes | bytearray | memoryview) -> bytes:
    """Standard base64 with padding, no line breaks."""
    encoded: bytes = pybase64.b64encode(data)
    return encoded


def _simdjson_bytes(lib: ModuleType, text: bytes | memoryview) -> bytes | None:
    """The bytes of a JSON array of ints 0..255 via simdjson, or `None` for anything else."""
    parser = getattr(_local, "parser", None)
    if parser is None:
        parser = _local.parser = lib.Parser()
    raw = bytes(text)
    # `as_buffer` flattens nested arrays (`[[1,2],[3]]` would read as three bytes): only a flat
    # array, whose one `[` opens it, is simdjson's to read; anything else goes to the pure path.
    if raw.count(b"[") != 1:
        return None
    try:
        doc = parser.parse(raw)
        try:
            words = memoryview(doc.as_buffer(of_type="u")).cast("B")
        finally:
            del doc  # the parser refuses to parse again while a proxy of its document lives
    except Exception:  # noqa: BLE001 - any failure of the accelerator means: ask orjson
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
