"""The Buffer-form and base64 payload codecs: the native and pybase64 paths give exactly the pure
path's verdict (orjson + `bytes()`, `binascii` strict), on generated and malformed input."""

from __future__ import annotations

import binascii
import importlib.util
import shutil
import sysconfig
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from agent.errors import RemoteProtocolError
from agent.protocol import bytearrays
from agent.protocol.bytearrays import (
    codec_backends,
    decode_base64,
    decode_int_array,
    encode_base64,
    encode_int_array,
    pure_int_array,
)

native = bytearrays._native
needs_native = pytest.mark.skipif(
    native is None, reason="agent._bufferform is not built (no C compiler at install time)"
)


def pure(text: bytes) -> bytes | None:
    """The pure path's verdict: the bytes, or None where it refuses."""
    try:
        return pure_int_array(text)
    except RemoteProtocolError:
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


class TestBufferForm:
    @given(st.binary(max_size=5000))
    def test_canonical_arrays_decode_to_their_bytes(self, data: bytes) -> None:
        """`JSON.stringify`'s array of any bytes decodes to exactly those bytes."""
        assert decode_int_array(orjson.dumps(list(data))) == data

    @given(spaced_arrays())
    def test_whitespace_anywhere_json_allows_it_decodes(self, case: tuple[bytes, bytes]) -> None:
        """Arrays with JSON whitespace around values and commas decode as orjson reads them."""
        text, data = case
        assert decode_int_array(text) == data == pure(text)

    @settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
    @given(st.one_of(mutated_arrays(), st.binary(max_size=40), st.sampled_from(ALPHABET)))
    def test_any_text_gets_the_pure_paths_verdict(self, text: bytes | int) -> None:
        """Malformed or odd text is accepted or refused exactly as orjson + bytes() do."""
        raw = bytes([text]) if isinstance(text, int) else text
        assert combined(raw) == pure(raw)

    @pytest.mark.parametrize(
        ("text", "data"),
        [
            (b"[]", b""),
            (b" [ ] ", b""),
            (b"[0,9,10,99,100,199,200,249,250,255]", bytes([0, 9, 10, 99, 100, 199, 200, 249, 250,
                                                            255])),
            (b"[true,false]", b"\x01\x00"),
            (b"[-0]", b"\x00"),
        ],
    )  # fmt: skip
    def test_edge_values_decode_as_orjson_reads_them(self, text: bytes, data: bytes) -> None:
        """Every digit count, the range's ends, booleans and `-0` decode as the pure path says."""
        assert decode_int_array(text) == data == pure(text)

    @pytest.mark.parametrize(
        "text",
        [b"[256]", b"[1000]", b"[01]", b"[00]", b"[1.0]", b"[1e2]", b"[-1]", b"[1,]", b"[,1]",
         b"[1 2]", b"[1,,2]", b"[null]", b'["1"]', b"[[1]]", b"[1]]", b"[1", b"1", b"", b"{}",
         b"[1]x", b"[\xc2\xa01]", b"[1\x00]"],
    )  # fmt: skip
    def test_non_arrays_of_bytes_are_refused(self, text: bytes) -> None:
        """Out-of-range, non-integer, malformed or trailing text is a `RemoteProtocolError`."""
        with pytest.raises(RemoteProtocolError):
            decode_int_array(text)

    def test_a_view_into_a_frame_decodes_without_a_copy_of_its_own(self) -> None:
        """A memoryview slice (what the frame splitter hands over) decodes like bytes."""
        frame = b'{"data":[1,2,3]}'
        assert decode_int_array(memoryview(frame)[8:15]) == b"\x01\x02\x03"

    @given(st.binary(max_size=5000))
    def test_encoding_writes_what_json_stringify_writes(self, data: bytes) -> None:
        """The encoder's text is orjson's (and `JSON.stringify`'s) for the same list."""
        assert encode_int_array(data) == orjson.dumps(list(data))


class TestNative:
    def test_the_native_codec_is_built_where_a_c_compiler_is(self) -> None:
        """CI has gcc and the Python headers: the extension must be there, so a broken build
        cannot silently fall back to the slow path."""
        headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
        if shutil.which("cc") is None and shutil.which("gcc") is None:
            pytest.skip("no C compiler on this machine: the pure path is expected")
        if not headers.exists():
            pytest.skip("no Python headers on this machine: the pure path is expected")
        assert importlib.util.find_spec("agent._bufferform") is not None
        assert codec_backends()["buffer"] == "native"

    @needs_native
    @settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
    @given(st.one_of(mutated_arrays(), st.binary(max_size=40), spaced_arrays().map(lambda c: c[0])))
    def test_native_answers_only_what_the_pure_path_accepts(self, text: bytes) -> None:
        """The native decoder's answer, when it gives one, is the pure path's bytes; it never
        accepts what the pure path refuses."""
        assert native is not None
        got = native.decode(text)
        if got is not None:
            assert got == pure(text)

    @needs_native
    @settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
    @given(comma_digit_runs())
    def test_native_gives_the_pure_verdict_on_long_comma_digit_runs(self, text: bytes) -> None:
        """Through the block path too: arrays decode, anything else is left to the pure path."""
        assert native is not None
        got = native.decode(text)
        assert got == pure(text)

    @needs_native
    @pytest.mark.parametrize("commas", [1, 2, 63, 64, 65, 66, 67, 130, 100_000, 4_000_000])
    def test_native_refuses_a_flood_of_commas_within_its_buffer(self, commas: int) -> None:
        """More commas than the output holds values (one per two characters) is refused, not
        written past the buffer (this crashed the process once)."""
        assert native is not None
        assert native.decode(b"[" + b"," * commas + b"]") is None

    @needs_native
    def test_native_leaves_the_rare_json_forms_to_the_pure_path(self) -> None:
        """Booleans and `-0` are JSON the native decoder does not read: it answers None."""
        assert native is not None
        assert native.decode(b"[true]") is None
        assert native.decode(b"[-0]") is None

    @needs_native
    def test_native_decodes_a_large_canonical_array(self) -> None:
        """A 1 MiB chunk of every byte value (the 64-character block path and its tail)."""
        assert native is not None
        data = bytes(range(256)) * 4096 + b"\x07\x08\x09"
        assert native.decode(orjson.dumps(list(data))) == data


B64_EDGES = [
    b"", b"AA==", b"AAA=", b"AAAA", b"AB+/", b"=", b"==", b"A", b"AA", b"AAA", b"A===", b"AAAA=",
    b"AAAA====", b"AA==AA==", b"AA=A", b" AAAA", b"AAAA\n", b"AA AA", b"====", b"AAAAA",
    b"A-_A", b"AAA=A", b"\x00AAA", b"AAAA\x00", b"AB==",
]  # fmt: skip


def binascii_verdict(text: bytes) -> bytes | None:
    try:
        return binascii.a2b_base64(text, strict_mode=True)
    except (binascii.Error, ValueError):
        return None


def base64_verdict(text: bytes) -> bytes | None:
    try:
        return decode_base64(text)
    except RemoteProtocolError:
        return None


class TestBase64:
    @pytest.mark.parametrize("text", B64_EDGES)
    def test_edge_cases_get_binascii_strict_verdict(self, text: bytes) -> None:
        """Padding, whitespace, non-alphabet characters and length % 4: binascii's verdict."""
        assert base64_verdict(text) == binascii_verdict(text)

    @settings(max_examples=500)
    @given(st.text(alphabet="AB/+=- \n\x00", max_size=14).map(str.encode))
    def test_any_text_gets_binascii_strict_verdict(self, text: bytes) -> None:
        """Short texts over the alphabet's edge characters: binascii's verdict, always."""
        assert base64_verdict(text) == binascii_verdict(text)

    @given(st.binary(max_size=3000))
    def test_round_trip(self, data: bytes) -> None:
        """Encoding is standard padded base64 and decodes back."""
        encoded = encode_base64(data)
        assert encoded == binascii.b2a_base64(data, newline=False)
        assert decode_base64(encoded) == data


def test_the_backends_are_reported() -> None:
    """`codec_backends()` names the decoder of each form (the start-up line carries it)."""
    backends = codec_backends()
    assert set(backends) == {"buffer", "base64"}
    assert backends["buffer"] in {"native", "simdjson", "orjson"}
    assert backends["base64"] in {"pybase64-c", "pybase64-python"}


@pytest.mark.parametrize("backend", ["simdjson", "orjson"])
def test_the_fallback_paths_give_the_same_verdicts(
    monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    """Without the native codec (simdjson, or orjson alone) every verdict is the same."""
    monkeypatch.setattr(bytearrays, "_native", None)
    if backend == "orjson":
        monkeypatch.setattr(bytearrays, "simdjson", None)
    texts = [orjson.dumps(list(bytes(range(256)) * 4)), b"[ 1 ,2 ]", b"[true]", b"[256]",
             b"[01]", b"[1.0]", b"[1,]", b"[]", b"[1", b"[-0]"]  # fmt: skip
    for text in texts:
        assert combined(text) == pure(text)
