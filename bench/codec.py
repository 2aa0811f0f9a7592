"""Chunk-frame codec throughput per binary form: MB/s of payload, encode and decode.

Measures the full path a stream chunk takes: building the `##VirtualStream##` frame
(`encode_chunk` + `encode_envelope`) and reading it back (`decode_envelope` + `decode_chunk`:
the frame split, then the payload decoded). The index-object form (`{"0":..}`, a JSON-serialised
Uint8Array) is only ever received, so only its decode is measured. Besides the decoders the
agent chose (`agent.protocol.bytearrays.codec_backends()`), the same process measures the
fallbacks side by side: the Buffer form without the native codec (`buffer-simdjson`: pysimdjson,
today's pure path) and without either (`buffer-orjson`), and base64 with `binascii` (the
decoder before pybase64).

    .venv/bin/python bench/codec.py [--size-mib 1] [--rounds 20] [--quick]
"""

from __future__ import annotations

import argparse
import binascii
import contextlib
import os
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import orjson

from agent.protocol import bytearrays
from agent.protocol.chunks import ChunkForm, decode_chunk, encode_chunk
from agent.protocol.envelope import decode_envelope, encode_envelope
from agent.protocol.stream_frames import StreamPackage, stream_frame


def frame_for(chunk_data: object) -> bytes:
    package = StreamPackage(
        stream_id="uni_" + "a" * 24,
        cycle_id="uni_" + "b" * 24,
        cycle="request",
        main_purpose="chunk",
        backpressure=False,
        next=True,
        chunk_data=chunk_data,
    )
    return encode_envelope(stream_frame(package))


def rate(size: int, rounds: int, work: Callable[[], object]) -> float:
    """MB/s of payload over `rounds` runs of `work` (after one warm-up run)."""
    work()
    start = time.perf_counter()
    for _ in range(rounds):
        work()
    return size * rounds / (time.perf_counter() - start) / 1e6


def encode(data: bytes, form: ChunkForm) -> bytes:
    return frame_for(encode_chunk(data, form))


def decode(frame: bytes) -> bytes:
    env = decode_envelope(frame)
    out = decode_chunk(env.request["chunkData"])
    assert isinstance(out, bytes)
    return out


@contextlib.contextmanager
def without(**modules: Any) -> Iterator[None]:
    """Switch codec backends off (`_native=None`, `simdjson=None`, ...) for the block."""
    saved = {name: getattr(bytearrays, name) for name in modules}
    for name, value in modules.items():
        setattr(bytearrays, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(bytearrays, name, value)


class _Binascii:
    """pybase64's two functions as binascii does them (the decoder before pybase64)."""

    class Error(ValueError):
        pass

    @staticmethod
    def b64decode(text: Any, validate: bool = True) -> bytes:
        raise _Binascii.Error("use binascii")  # decode_base64 then asks binascii

    @staticmethod
    def b64encode(data: Any) -> bytes:
        return binascii.b2a_base64(data, newline=False)


def figures(size: int, rounds: int) -> list[dict[str, Any]]:
    """One row per form and decoder: frame bytes, encode MB/s, decode MB/s."""
    data = os.urandom(size)
    rows: list[dict[str, Any]] = []
    forms: list[ChunkForm] = ["buffer", "base64"]
    for form in forms:
        frame = frame_for(encode_chunk(data, form))
        assert decode(frame) == data
        rows.append(
            {
                "form": form,
                "decoder": bytearrays.codec_backends()[form],
                "frame_bytes": len(frame),
                "encode_mb_s": rate(size, rounds, partial(encode, data, form)),
                "decode_mb_s": rate(size, rounds, partial(decode, frame)),
            }
        )
    frame = frame_for(encode_chunk(data, "buffer"))
    for name, off in (
        ("simdjson", {"_native": None}),
        ("orjson", {"_native": None, "simdjson": None}),
    ):
        with without(**off):
            assert decode(frame) == data
            rows.append(
                {
                    "form": f"buffer-{name}",
                    "decoder": name,
                    "frame_bytes": len(frame),
                    "encode_mb_s": rate(
                        size, max(1, rounds // 4), lambda: orjson.dumps(list(data))
                    ),
                    "decode_mb_s": rate(size, max(1, rounds // 4), partial(decode, frame)),
                }
            )
    frame = frame_for(encode_chunk(data, "base64"))
    with without(pybase64=_Binascii):
        assert decode(frame) == data
        rows.append(
            {
                "form": "base64-binascii",
                "decoder": "binascii",
                "frame_bytes": len(frame),
                "encode_mb_s": rate(size, rounds, partial(encode, data, "base64")),
                "decode_mb_s": rate(size, rounds, partial(decode, frame)),
            }
        )
    frame = frame_for({str(i): b for i, b in enumerate(data)})
    assert decode(frame) == data
    rows.append(
        {
            "form": "index-object",
            "decoder": "orjson",
            "frame_bytes": len(frame),
            "encode_mb_s": None,
            "decode_mb_s": rate(size, max(1, rounds // 10), lambda: decode(frame)),
        }
    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 64 KiB, 2 rounds")
    args = parser.parse_args()
    size = 64 * 1024 if args.quick else int(args.size_mib * (1 << 20))
    rounds = 2 if args.quick else args.rounds
    print(f"chunk {size} bytes, {rounds} rounds, orjson {orjson.__version__}")
    print(f"{'form':<17}{'decoder':<12}{'frame bytes':>12}{'encode MB/s':>13}{'decode MB/s':>13}")
    for row in figures(size, rounds):
        encoded = "n/a" if row["encode_mb_s"] is None else f"{row['encode_mb_s']:.1f}"
        print(
            f"{row['form']:<17}{row['decoder']:<12}{row['frame_bytes']:>12}"
            f"{encoded:>13}{row['decode_mb_s']:>13.1f}"
        )


if __name__ == "__main__":
    main()
