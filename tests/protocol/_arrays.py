"""Buffer-form array texts for the codec tests and the fuzz targets: generated, spaced,
mutated, hostile comma runs and large arrays, and the verdicts to compare (JSON's by the
stdlib, the pure path's, the chosen decoder's)."""

from __future__ import annotations

import json
import random

import orjson
from hypothesis import strategies as st

from agent.errors import RemoteProtocolError
from agent.protocol import bytearrays
from agent.protocol.bytearrays import decode_int_array, pure_int_array

__all__ = [
    "ALPHABET",
    "SLICE",
    "combined",
    "comma_digit_runs",
    "large_arrays",
    "mutated_arrays",
    "near_canonical_arrays",
    "oracle",
    "pure",
    "spaced_arrays",
]


def pure(text: bytes) -> bytes | None:
    """The pure path's verdict: the bytes, or None where it refuses."""
    try:
        return pure_int_array(text)
    except RemoteProtocolError:
        return None


def oracle(text: bytes) -> bytes | None:
    """JSON's verdict by the stdlib alone (no orjson, no pool): `json.loads` + `bytes()`."""
    try:
        values = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(values, list):
        return None
    try:
        return bytes(values)
    except (TypeError, ValueError):
        return None


def combined(text: bytes) -> bytes | None:
    """`decode_int_array`'s verdict in the same shape."""
    try:
        return decode_int_array(text)
    except RemoteProtocolError:
        return None


WS = st.sampled_from(["", "", "", " ", "\n", "\t", "\r\n", "  "])


@st.composite
def spaced_arrays(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """A JSON array of bytes with JSON whitespace anywhere it may go, and the bytes."""
    values = draw(st.lists(st.integers(0, 255), max_size=200))
    parts = [draw(WS), "[", draw(WS)]
    for index, value in enumerate(values):
        if index:
            parts += [draw(WS), ",", draw(WS)]
        parts.append(str(value))
    parts += [draw(WS), "]", draw(WS)]
    return "".join(parts).encode(), bytes(values)


ALPHABET = b'0123456789,[] \t\n\r-+.eEtrufalsn"{}:x\x00\xff'


@st.composite
def mutated_arrays(draw: st.DrawFn) -> bytes:
    """A canonical array with a few characters replaced, inserted or deleted."""
    text = bytearray(orjson.dumps(draw(st.lists(st.integers(0, 300), max_size=80))))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(text)))
        kind = draw(st.sampled_from(["replace", "insert", "delete"]))
        char = draw(st.sampled_from(list(ALPHABET)))
        if kind == "insert":
            text.insert(at, char)
        elif at < len(text):
            if kind == "replace":
                text[at] = char
            else:
                del text[at]
    return bytes(text)


@st.composite
def comma_digit_runs(draw: st.DrawFn) -> bytes:
    """Bracketed runs of commas and digits long enough for the native decoder's 64-character
    block path, commas often dense: arrays, near-arrays and hostile comma floods."""
    alphabet = draw(st.sampled_from([b",", b",,,0", b",0123456789", b"0123456789,,,,"]))
    body = draw(st.lists(st.sampled_from(list(alphabet)), min_size=60, max_size=700))
    return b"[" + bytes(body) + b"]"


@st.composite
def near_canonical_arrays(draw: st.DrawFn) -> bytes:
    """Canonical arrays of 15 to 200 values, most of them bytes, a few of up to four digits,
    with a few leading zeros, doubled commas or stray characters put in: the text the native
    decoder's block kernels judge, with their faults anywhere relative to a block's edge. The
    stray characters are ones every path refuses (no whitespace, sign or literal, which the
    native decoder leaves to the pure path)."""
    rng = random.Random(draw(st.integers(0, 2**32)))
    rare = rng.random() * 0.03
    values = [
        rng.randrange(256, 10_000) if rng.random() < rare else rng.choice(_BYTE_VALUES)(rng)
        for _ in range(draw(st.integers(15, 200)))
    ]
    text = bytearray(("[" + ",".join(map(str, values)) + "]").encode())
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(1, len(text) - 1))
        text[at:at] = draw(st.sampled_from([b"0", b"00", b",", b"x", b"]", b".", b"1", b"9999"]))
    return bytes(text)


_BYTE_VALUES = [
    lambda rng: rng.randrange(256),
    lambda rng: rng.randrange(10),
    lambda rng: rng.randrange(250, 256),
    lambda rng: rng.choice([0, 10, 99, 100, 199, 200, 255]),
]


SLICE = bytearrays._SLICE
STYLES = {
    "canonical": (b"[", b",", b"]"),
    "spaced": (b"[", b", ", b"]"),
    "indented": (b"[\n  ", b",\n  ", b"\n]"),
    "pool": (b"[  ", b",", b"]"),  # orjson 3.13 runs out of its parse pool on this one
}


@st.composite
def large_arrays(draw: st.DrawFn) -> bytes:
    """Arrays of up to 400,000 values (random, or one value repeated: dense), in one of four
    layouts, sometimes with one character replaced, inserted or deleted -- often right at a
    slice boundary of the pure path."""
    rng = random.Random(draw(st.integers(0, 2**32)))
    size = draw(st.sampled_from([0, 1, 1_000, 5_000, SLICE // 3, SLICE, 100_000, 400_000]))
    size = max(0, size + draw(st.integers(-50, 50)))
    repeated = draw(st.sampled_from([None, 0, 7, 255]))
    data = rng.randbytes(size) if repeated is None else bytes([repeated]) * size
    opening, comma, closing = STYLES[draw(st.sampled_from(sorted(STYLES)))]
    text = bytearray(opening + comma.join(str(b).encode() for b in data) + closing)
    if draw(st.booleans()):
        near = draw(st.sampled_from([0, SLICE, 2 * SLICE, len(text) // 2, len(text) - 1]))
        at = min(max(0, near + draw(st.integers(-4, 4))), len(text))
        char = draw(st.sampled_from(list(ALPHABET)))
        kind = draw(st.sampled_from(["replace", "insert", "delete"]))
        if kind == "insert":
            text.insert(at, char)
        elif at < len(text):
            if kind == "replace":
                text[at] = char
            else:
                del text[at]
    return bytes(text)
