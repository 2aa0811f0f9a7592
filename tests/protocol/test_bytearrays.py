"""The Buffer-form and base64 payload codecs: the native and pybase64 paths give exactly the pure
path's verdict, which is JSON's (the stdlib `json` + `bytes()`) and `binascii`'s strict one, on
generated, malformed and large input; refusing a large bad array costs one slice of memory."""

from __future__ import annotations

import binascii
import importlib.util
import shutil
import sysconfig
import tracemalloc
from collections.abc import Iterator
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
from tests.protocol._arrays import (
    ALPHABET,
    combined,
    comma_digit_runs,
    large_arrays,
    mutated_arrays,
    oracle,
    pure,
    spaced_arrays,
)

native = bytearrays._native
needs_native = pytest.mark.skipif(
    native is None, reason="agent._bufferform is not built (no C compiler at install time)"
)


BACKENDS = ("native", "simdjson", "orjson")


@pytest.fixture(scope="class", params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> Iterator[str]:
    """The Buffer-form decoder the class's tests run on: each backend an install may have
    (without the native codec: simdjson; without simdjson too: the pure path alone)."""
    name: str = request.param
    if name == "native" and native is None:
        pytest.skip("agent._bufferform is not built (no C compiler at install time)")
    if name == "simdjson" and bytearrays.simdjson is None:
        pytest.skip("pysimdjson is not installed")
    with pytest.MonkeyPatch.context() as patch:
        if name != "native":
            patch.setattr(bytearrays, "_native", None)
        if name == "orjson":
            patch.setattr(bytearrays, "simdjson", None)
        yield name


@pytest.mark.usefixtures("backend")
class TestBufferForm:
    """The decoder's contract, on every backend: the same bytes, the same refusals."""

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
         b"[1 2]", b"[1,,2]", b"[null]", b'["1"]', b"[[1]]", b"[[1,2],[3]]", b"[1,[2]]",
         b"[[]]", b"[1]]", b"[1", b"1", b"", b"{}", b"[1]x", b"[\xc2\xa01]", b"[1\x00]"],
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


class TestPureVerdict:
    @settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
    @given(st.one_of(mutated_arrays(), st.binary(max_size=40), spaced_arrays().map(lambda c: c[0])))
    def test_the_pure_verdict_is_jsons(self, text: bytes) -> None:
        """Accepted or refused exactly as the stdlib's `json.loads` + `bytes()` would."""
        assert pure(text) == oracle(text)

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(large_arrays())
    def test_large_arrays_get_jsons_verdict_on_every_path(self, text: bytes) -> None:
        """Up to 400,000 values, across the pure path's slice boundaries: the pure path, the
        chosen decoder and the native one (when it answers) all give JSON's verdict."""
        verdict = oracle(text)
        assert pure(text) == verdict
        assert combined(text) == verdict
        if native is not None and (got := native.decode(text)) is not None:
            assert got == verdict

    @pytest.mark.parametrize("values", [939, 100_000, 4_000_000])
    def test_a_dense_array_after_two_whitespace_characters_decodes_without_accelerators(
        self, monkeypatch: pytest.MonkeyPatch, values: int
    ) -> None:
        """`[  0,0,...]` is valid JSON that orjson 3.13 refuses (its parse pool runs out); an
        install with neither the native codec nor simdjson decodes it all the same."""
        monkeypatch.setattr(bytearrays, "_native", None)
        monkeypatch.setattr(bytearrays, "simdjson", None)
        text = b"[  " + b"0," * (values - 1) + b"0]"
        assert decode_int_array(text) == bytes(values)

    def test_orjsons_refusal_is_not_the_verdict(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Where orjson refuses, the stdlib `json` decides: valid arrays still decode."""

        def refuse(text: bytes) -> object:
            raise orjson.JSONDecodeError("pool exhausted", "", 0)

        monkeypatch.setattr(bytearrays.orjson, "loads", refuse)
        assert pure_int_array(b"[ 1, 2 ,true,-0]") == b"\x01\x02\x01\x00"
        with pytest.raises(RemoteProtocolError):
            pure_int_array(b"[1, 256]")

    @pytest.mark.parametrize("backend", ["native", "orjson"])
    @pytest.mark.parametrize("bad_at", ["start", "end"])
    def test_refusing_a_15_mib_array_of_values_above_255_costs_one_slice(
        self, monkeypatch: pytest.MonkeyPatch, backend: str, bad_at: str
    ) -> None:
        """Refusing a 15 MiB chunk allocates no more than the bytes an array of its size could
        decode to (one per two characters) and one slice: it took ~300 MB of Python ints per
        frame, which the process kept. Whether the first value is bad or the last."""
        if backend == "orjson":
            monkeypatch.setattr(bytearrays, "_native", None)
            monkeypatch.setattr(bytearrays, "simdjson", None)
        elif native is None:
            pytest.skip("agent._bufferform is not built")
        if bad_at == "start":
            text = b"[" + b"1000," * (3 << 20) + b"1]"
        else:
            text = b"[" + b"100," * (15 << 18) + b"1000]"
        frame = memoryview(b'{"data":' + text + b"}")[8:-1]  # a view, as the splitter hands it
        tracemalloc.start()
        try:
            with pytest.raises(RemoteProtocolError):
                decode_int_array(frame)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert len(text) > 15 << 20
        assert peak < len(text) // 2 + (2 << 20)


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
