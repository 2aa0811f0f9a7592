"""Cutting a chunk frame's payload out without parsing it: Buffer-form and base64 chunk frames.

A 1 MiB chunk in the Buffer form (`"chunkData":{"type":"Buffer","data":[1,2,..]}`) is ~3.7 MB
of JSON, in the base64 form ~1.4 MB; `orjson.loads` of the whole frame would build a million-int
list (or a 1.4 MB string) on the event loop. Here the payload is found by its pattern and cut
out as a `RawChunk` (a view into the frame, no copy); only the few hundred bytes around it go
through orjson, and the payload is decoded later -- by the responder's consumer, off the event
loop (`agent.protocol.stream_responder`), or at once on the initiator's side.

The result is the object `orjson.loads(frame)` would give, except that the `chunkData` of
`request` (a chunk we receive as a responder) or of `response` (the answer to a `read` we sent as
the initiator reading a stream) is the `RawChunk`. Every step is checked and anything unexpected
returns `None`, so the caller takes the plain orjson path:
- the payload is the first raw `"chunkData":{"type":"Buffer","data":[` (or
  `..."type":"EncodedBuffer","data":"`); its opening quote is not preceded by a backslash, so it
  opens a key (an unescaped quote inside a string is invalid JSON). An int array ends at the
  first `]` (it holds none; anything nested makes the array text invalid, which its decoder
  refuses); a base64 string at the first `"`, and one holding a backslash (a JSON escape, legal
  but never written by an encoder) is left to orjson;
- the rest is parsed twice, with an empty payload and with a probe (`[]`/`[0]`, `""`/`"0"`)
  spliced in: `request.chunkData` (or `response.chunkData`) must follow the splice, which proves
  the cut-out payload is the one the frame's `chunkData` resolves to (not another object with the
  same text, nor one hidden by a duplicate key).

What is NOT checked here is the payload itself: its decoder is the judge (`RawChunk.decode()`),
so a frame whose payload is no array of bytes, or no valid base64, is taken and its stream
breaks when the chunk is decoded (`undecodable chunk`), where orjson would have dropped the
whole frame as invalid JSON.
"""

from __future__ import annotations

from typing import Any, Final

import orjson

from agent.protocol.chunks import ChunkForm, RawChunk

__all__ = ["split_chunk_frame"]

_BUFFER: Final = b'"chunkData":{"type":"Buffer","data":['
_BASE64: Final = b'"chunkData":{"type":"EncodedBuffer","data":"'
_COMMON: Final = b'"chunkData":{"type":"'  # how both begin
_SPLICES: Final[dict[ChunkForm, tuple[bytes, bytes, Any, Any]]] = {
    "buffer": (b"[]", b"[0]", {"type": "Buffer", "data": []}, {"type": "Buffer", "data": [0]}),
    "base64": (
        b'""',
        b'"0"',
        {"type": "EncodedBuffer", "data": ""},
        {"type": "EncodedBuffer", "data": "0"},
    ),
}


def split_chunk_frame(frame: bytes, method: str) -> dict[str, Any] | None:
    """`orjson.loads(frame)` with its `chunkData` as a `RawChunk`, or `None`.

    `None` means the fast path does not apply: parse with orjson. Only frames whose `method`
    equals `method` are split.
    """
    found = _locate(frame)
    if found is None:
        return None
    form, start, close_at = found
    if start <= 0 or frame[start - 1] == 0x5C:  # a backslash: the quote may be escaped
        return None
    if close_at < 0:
        return None
    if form == "buffer":
        open_at = start + len(_BUFFER) - 1  # the `[`
        text_from, text_to = open_at, close_at + 1
    else:
        open_at = start + len(_BASE64) - 1  # the opening quote
        text_from, text_to = open_at + 1, close_at
        if frame.find(b"\\", text_from, text_to) >= 0:
            return None
    empty, probe_text, empty_value, probe_value = _SPLICES[form]
    head, tail = frame[:open_at], frame[close_at + 1 :]
    obj = _loads(head + empty + tail)
    probe = _loads(head + probe_text + tail)
    if obj is None or probe is None or obj.get("method") != method:
        return None
    for side in ("request", "response"):
        if _chunk_data(obj, side) == empty_value and _chunk_data(probe, side) == probe_value:
            view = memoryview(frame)[text_from:text_to]
            obj[side]["chunkData"] = RawChunk(form, view, len(frame))
            return obj
    return None


def _locate(frame: bytes) -> tuple[ChunkForm, int, int] | None:
    """Where the payload's pattern starts, the first Buffer-form one, else the first base64
    one (None: neither), and where its payload ends: the array's first `]` after its `[`, the
    string's first `"` after its opening quote (-1: none).

    Found with one search for what both patterns begin with, which in a chunk frame stops
    near its start: searching for the Buffer pattern first read a whole base64 frame in vain.
    When that first start is a base64 pattern, a Buffer pattern can still only come after the
    string's closing quote (the string holds no quote), so only the rest of the frame after it
    is searched; anything unusual is searched for as the rule says."""
    start = frame.find(_COMMON)
    if start < 0:
        return None
    if frame.startswith(_BUFFER, start):
        return "buffer", start, frame.find(b"]", start + len(_BUFFER))
    if frame.startswith(_BASE64, start):
        close_at = frame.find(b'"', start + len(_BASE64))
        if close_at >= 0 and frame.find(_BUFFER, close_at) < 0:
            return "base64", start, close_at
    start = frame.find(_BUFFER, start)  # anything unusual: the rule as it reads
    if start >= 0:
        return "buffer", start, frame.find(b"]", start + len(_BUFFER))
    start = frame.find(_BASE64)
    if start < 0:
        return None
    return "base64", start, frame.find(b'"', start + len(_BASE64))


def _loads(text: bytes) -> dict[str, Any] | None:
    try:
        obj = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def _chunk_data(obj: dict[str, Any], side: str) -> Any:
    package = obj.get(side)
    return package.get("chunkData") if isinstance(package, dict) else None
