"""Chunk-frame codec throughput per binary form: MB/s of payload, encode and decode.

Measures the full path a stream chunk takes: building the `##VirtualStream##` frame
(`encode_chunk` + `encode_envelope`) and reading it back (`decode_envelope` + `decode_chunk`).
The index-object form (`{"0":..}`, a JSON-serialised Uint8Array) is only ever received, so only
its decode is measured. The `buffer-orjson` row decodes the Buffer form with the simdjson fast
path switched off (`agent.protocol.chunk_frames`), as the agent does when simdjson is missing.

    .venv/bin/python bench/codec.py [--size-mib 1] [--rounds 20]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from functools import partial

import orjson

from agent.protocol import chunk_frames
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    size = int(args.size_mib * (1 << 20))
    data = os.urandom(size)
    print(f"chunk {size} bytes, {args.rounds} rounds, orjson {orjson.__version__}")
    print(f"{'form':<14}{'frame bytes':>14}{'encode MB/s':>14}{'decode MB/s':>14}")
    forms: list[ChunkForm] = ["buffer", "base64"]
    for form in forms:
        frame = frame_for(encode_chunk(data, form))
        assert decode(frame) == data
        enc = rate(size, args.rounds, partial(encode, data, form))
        dec = rate(size, args.rounds, partial(decode, frame))
        print(f"{form:<14}{len(frame):>14}{enc:>14.1f}{dec:>14.1f}")
    frame = frame_for(encode_chunk(data, "buffer"))
    accelerator, chunk_frames.simdjson = chunk_frames.simdjson, None
    try:
        assert decode(frame) == data
        dec = rate(size, args.rounds, partial(decode, frame))
    finally:
        chunk_frames.simdjson = accelerator
    print(f"{'buffer-orjson':<14}{len(frame):>14}{'n/a':>14}{dec:>14.1f}")
    frame = frame_for({str(i): b for i, b in enumerate(data)})
    assert decode(frame) == data
    dec = rate(size, max(1, args.rounds // 10), lambda: decode(frame))
    print(f"{'index-object':<14}{len(frame):>14}{'n/a':>14}{dec:>14.1f}")


if __name__ == "__main__":
    main()
