"""Tuning the Corestore side: chunk size x requests in flight, by measurement, within the RSS bound.

For each `--chunk-mib` x `--max-in-flight` pair whose staging bound `(max_in_flight + 2) x
chunk` stays within `--bound-mib`, bench/bytepath.py's agent stages `--mib` MiB per form into
the reference Corestore (`--repeat` rounds, replayed 1 MiB frames as typedrequest sends them);
reported: the median MB/s per form and the largest RSS above idle seen in any stage.

    .venv/bin/python -m bench.tune [--quick] [--chunk-mib 1,2,4,8] [--max-in-flight 1,2,4,8]
        [--mib 256] [--repeat 2] [--bound-mib 48] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from agent.log import configure_logging
from bench import bytepath

__all__ = ["main"]


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


async def sweep(args: argparse.Namespace) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    for chunk in args.chunk_mib:
        for in_flight in args.max_in_flight:
            bound = (in_flight + 2) * chunk
            if bound > args.bound_mib:
                continue
            run_args = bytepath.parse(
                [
                    "--no-js",
                    "--corestores", "reference",
                    "--forms", ",".join(args.forms),
                    "--mib", str(args.mib),
                    "--repeat", str(args.repeat),
                    "--rss-mib", "0",
                    "--warmup-mib", str(args.warmup_mib),
                    "--chunk-mib", str(chunk),
                    "--max-in-flight", str(in_flight),
                ]
            )  # fmt: skip
            bytepath.say(f"chunk {chunk} MiB, max_in_flight {in_flight} ...")
            report = await bytepath.amain(run_args, quiet=True)
            row: dict[str, Any] = {"chunk_mib": chunk, "max_in_flight": in_flight, "bound": bound}
            for form in args.forms:
                rates = [r["mb_per_s"] for r in report["rows"] if r["form"] == form]
                row[form] = round(statistics.median(rates), 1)
            row["rss_above_idle_mib"] = max(r["rss_above_idle_mib"] for r in report["rows"])
            results.append(row)
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (2 pairs, 32 MiB)")
    parser.add_argument("--chunk-mib", type=ints, default=[1, 2, 4, 8])
    parser.add_argument("--max-in-flight", type=ints, default=[1, 2, 4, 8])
    parser.add_argument("--forms", type=lambda s: s.split(","), default=["buffer", "base64"])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--warmup-mib", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--bound-mib", type=int, default=48)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.quick:
        args.chunk_mib, args.max_in_flight, args.mib, args.repeat = [4], [1, 4], 32, 1
        args.warmup_mib = 0
    configure_logging("console", "warning", sys.stderr)
    results = asyncio.run(sweep(args))
    print(
        "| chunk MiB | max_in_flight | bound MiB | "
        + " | ".join(args.forms)
        + " | RSS above idle |"
    )
    print("|---:|---:|---:|" + "---:|" * len(args.forms) + "---:|")
    for r in results:
        rates = " | ".join(str(r[f]) for f in args.forms)
        print(
            f"| {r['chunk_mib']} | {r['max_in_flight']} | {r['bound']} | {rates} "
            f"| {r['rss_above_idle_mib']} |"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
