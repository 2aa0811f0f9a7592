"""The two digests of a moved chunk, side by side in one process: CPU seconds per GiB of
`chunking.Digests` with both digests in one pass (`agent/_sha256pair.c`, SHA-NI) against
hashlib hashing every chunk twice (the whole object's digest and the chunk's own), and against
hashlib once (the floor: one digest alone).

Each round runs every way once over `--mib` MiB in `--chunk-mib` MiB chunks (Corestore's chunk
size), the ways in turn, as staging calls them (`await digests.chunk(chunk)`: a worker thread
per chunk); the figure of a way is its best round of this process's CPU time (all threads), so
a busy machine delays it without charging it.

    .venv/bin/python -m bench.digests [--mib 256] [--chunk-mib 4] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import time
from collections.abc import Callable

from agent.transfers import chunking

GiB = 2**30


def once(chunks: list[bytes]) -> None:
    whole = hashlib.sha256()
    for chunk in chunks:
        whole.update(chunk)
    whole.hexdigest()


def digests_with(pair: bool) -> Callable[[list[bytes]], None]:
    def run(chunks: list[bytes]) -> None:
        async def hash_all() -> None:
            digests = chunking.Digests(pair=pair)
            for chunk in chunks:
                await digests.chunk(chunk)
            digests.hexdigest()

        asyncio.run(hash_all())

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--chunk-mib", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    chunk = os.urandom(args.chunk_mib * 2**20)
    chunks = [chunk] * (args.mib // args.chunk_mib)
    ways: dict[str, Callable[[list[bytes]], None]] = {"hashlib twice": digests_with(False)}
    if chunking.DIGESTS_BACKEND == "sha-ni-pair":
        ways["one pass (pair)"] = digests_with(True)
    ways["hashlib once (floor)"] = once
    best = dict.fromkeys(ways, float("inf"))
    for _ in range(args.rounds):
        for name, way in ways.items():
            started = time.process_time()
            way(chunks)
            best[name] = min(best[name], time.process_time() - started)
    print(f"digests: {chunking.DIGESTS_BACKEND}; {args.mib} MiB in {args.chunk_mib} MiB chunks")
    twice = best["hashlib twice"]
    for name, seconds in best.items():
        per_gib = seconds * GiB / (args.mib * 2**20)
        print(f"  {name:22} {per_gib:5.2f} CPU s/GiB  ({seconds / twice:.2f}x hashlib twice)")


if __name__ == "__main__":
    main()
