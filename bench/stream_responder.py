"""The agent as VirtualStream RESPONDER vs the reference JS responder (real typedrequest 3.3.0).

One run, one fast initiator (bench/_initiator.py), the SAME pre-encoded chunk frames for both:
- agent: bench/_agent_responder.py, the agent's `Peer` on a `websockets` server, own process;
- JS: bench/node_responder.mjs, the library's responder side in Node (needs tests/interop
  node_modules: `cd tests/interop && npm ci`).
For each binary chunk form (Buffer array, base64 EncodedBuffer, `{"0":..}` index object) it
reports end-to-end MB/s per responder (first chunk sent -> outer reply), the agent/JS ratio and
each responder process's CPU seconds per GiB (/proc/<pid>/stat over the same span). Then the
in-process codec MB/s (bench/codec.py), and the agent's peak RSS (VmHWM) for a short and a long
stream, each in a fresh process, to show memory is bounded by the window, not the length.

    .venv/bin/python -m bench.stream_responder [--chunk-kib 1024] [--buffer-mib 64]
        [--base64-mib 256] [--object-mib 4] [--rss-mib 256,1024] [--json out.json]

Targets: agent >= 5x the JS responder for 1 MiB Buffer-form chunks; agent >= 150 MB/s for the
base64 form. Run from the repository root (the default run takes a few minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import IO, Any

from agent.protocol.chunks import ChunkForm
from bench._initiator import FORMS, ChunkSet, RunResult, run_stream
from bench._procstat import cpu_seconds, machine_facts, memory_kib
from bench.codec import decode, encode, frame_for, rate

__all__ = ["main"]

ROOT = Path(__file__).resolve().parent.parent
NODE_RESPONDER = ROOT / "bench" / "node_responder.mjs"
LIBRARY = ROOT / "tests" / "interop" / "node_modules" / "@api.global" / "typedrequest"
MiB = 2**20
GiB = 2**30
# What a failed run shows of the children's stderr when no --log was given.
_LOG_TAIL = 64 * 1024


class Responder:
    """A responder child process: its URL, pid and the stream lines it printed."""

    def __init__(self, name: str, process: asyncio.subprocess.Process, port: int) -> None:
        self.name = name
        self.process = process
        self.url = f"ws://127.0.0.1:{port}/"
        self.lines: list[dict[str, Any]] = []
        assert process.stdout is not None
        self._reader = asyncio.create_task(self._read(process.stdout))

    async def _read(self, stdout: asyncio.StreamReader) -> None:
        while line := await stdout.readline():
            self.lines.append(json.loads(line))

    @property
    def pid(self) -> int:
        """The child's pid (node or python itself: no shell in between)."""
        return self.process.pid

    def cpu(self) -> float:
        """CPU seconds the child has used."""
        return cpu_seconds(self.pid)

    async def stop(self) -> None:
        """SIGTERM, wait, and collect the reader."""
        if self.process.returncode is None:
            self.process.terminate()
        await self.process.wait()
        await self._reader


@contextlib.asynccontextmanager
async def responder(name: str, argv: list[str], log: IO[bytes]) -> AsyncIterator[Responder]:
    """Start a responder child and wait for its `listening` line; stop it on exit."""
    process = await asyncio.create_subprocess_exec(
        *argv,
        cwd=ROOT,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=log,  # a file: a full stderr pipe would stall the child
        limit=4 * MiB,
    )
    assert process.stdout is not None
    async with asyncio.timeout(30):
        hello = json.loads(await process.stdout.readline() or b"{}")
    if hello.get("event") != "listening":
        process.kill()
        await process.wait()
        raise RuntimeError(f"{name} responder did not start: {hello}")
    child = Responder(name, process, int(hello["port"]))
    try:
        yield child
    finally:
        await child.stop()


def agent_argv(window: int) -> list[str]:
    """The agent responder's command line."""
    return [sys.executable, "-m", "bench._agent_responder", "--window", str(window)]


@dataclass(frozen=True, slots=True)
class Row:
    """One form through one responder."""

    form: str
    responder: str
    status: str
    bytes: int
    seconds: float
    mb_per_s: float
    cpu_s_per_gib: float | None
    initiator_cpu_s_per_gib: float | None
    sha256_ok: bool
    probes: int
    note: str


def row_of(form: str, name: str, run: RunResult, expected_sha: str) -> Row:
    """Judge one run: complete with the right sha256, or why not."""
    response = run.response or {}
    status = str(response.get("status", "error" if run.error else "cut-short"))
    sha_ok = status == "complete" and response.get("sha256") == expected_sha
    note = ""
    if run.error is not None:
        note = f"error: {run.error.get('text')}"
    elif status == "bad-chunk":
        note = "the library passed chunkData through without reviving it into bytes"
    elif status == "complete" and not sha_ok:
        note = "sha256 MISMATCH"
    complete = bool(run.bytes) and status == "complete"
    per_gib = run.cpu_seconds / (run.bytes / GiB) if complete else None
    own_per_gib = run.initiator_cpu_seconds / (run.bytes / GiB) if complete else None
    return Row(
        form=form,
        responder=name,
        status=status,
        bytes=run.bytes,
        seconds=round(run.seconds, 3),
        mb_per_s=round(run.mb_per_s, 1) if status == "complete" else 0.0,
        cpu_s_per_gib=round(per_gib, 2) if per_gib is not None else None,
        initiator_cpu_s_per_gib=round(own_per_gib, 2) if own_per_gib is not None else None,
        sha256_ok=sha_ok,
        probes=run.backpressure_probes,
        note=note,
    )


async def push(
    target: Responder,
    form: str,
    chunks: ChunkSet,
    chunk_json: tuple[bytes, ...],
    count: int,
    args: argparse.Namespace,
) -> RunResult:
    """One stream of `count` chunks through `target` (same stream id for every responder)."""
    return await run_stream(
        target.url,
        stream_id=f"bench_{form}_{count}",
        chunk_json=chunk_json,
        chunk_size=chunks.chunk_size,
        count=count,
        cpu_of_responder=target.cpu,
        probe_interval=args.probe_ms / 1000,
    )


def codec_figures(chunk_size: int) -> list[dict[str, Any]]:
    """In-process MB/s of bench/codec.py's encode/decode of one chunk frame per form."""
    data = ChunkSet.generate("codec", chunk_size, 1).chunks[0]
    figures: list[dict[str, Any]] = []
    sent_forms: tuple[ChunkForm, ...] = ("buffer", "base64")
    for form in sent_forms:
        frame = encode(data, form)
        assert decode(frame) == data
        figures.append(
            {
                "form": form,
                "frame_bytes": len(frame),
                "encode_mb_s": round(rate(chunk_size, 10, partial(encode, data, form)), 1),
                "decode_mb_s": round(rate(chunk_size, 10, partial(decode, frame)), 1),
            }
        )
    frame = frame_for({str(i): b for i, b in enumerate(data)})
    assert decode(frame) == data
    figures.append(
        {
            "form": "object",
            "frame_bytes": len(frame),
            "encode_mb_s": None,  # only ever received
            "decode_mb_s": round(rate(chunk_size, 2, partial(decode, frame)), 1),
        }
    )
    return figures


async def throughput(args: argparse.Namespace, log: IO[bytes]) -> list[Row]:
    """Every form through both responders, agent first, the same frames."""
    chunk_size = args.chunk_kib * 1024
    chunks = ChunkSet.generate("stream-responder-bench", chunk_size, args.distinct)
    sizes = {"buffer": args.buffer_mib, "base64": args.base64_mib, "object": args.object_mib}
    rows: list[Row] = []
    node = ["node", str(NODE_RESPONDER)]
    async with (
        responder("agent", agent_argv(args.window), log) as agent,
        responder("js", node, log) as js,
    ):
        for form in args.forms:
            count = max(1, sizes[form] * MiB // chunk_size)
            chunk_json = chunks.encode(form)
            expected = chunks.sha256(count)
            for target in (agent, js):
                run = await push(target, form, chunks, chunk_json, count, args)
                row = row_of(form, target.name, run, expected)
                rows.append(row)
                print(f"  {form:<7} {target.name:<6} {row.status:<10} {row.mb_per_s:8.1f} MB/s")
    return rows


async def peak_rss(args: argparse.Namespace, log: IO[bytes]) -> list[dict[str, Any]]:
    """The agent's VmHWM for each stream length, each in a fresh responder process."""
    chunk_size = args.chunk_kib * 1024
    chunks = ChunkSet.generate("stream-responder-rss", chunk_size, args.distinct)
    chunk_json = chunks.encode(args.rss_form)
    results: list[dict[str, Any]] = []
    for mib in args.rss_mib:
        count = mib * MiB // chunk_size
        async with responder("agent", agent_argv(args.window), log) as agent:
            _, idle_hwm = memory_kib(agent.pid)
            run = await push(agent, args.rss_form, chunks, chunk_json, count, args)
            _, hwm = memory_kib(agent.pid)
        ok = (run.response or {}).get("sha256") == chunks.sha256(count)
        results.append(
            {
                "stream_mib": mib,
                "form": args.rss_form,
                "idle_peak_rss_mib": round(idle_hwm / 1024, 1),
                "peak_rss_mib": round(hwm / 1024, 1),
                "mb_per_s": round(run.mb_per_s, 1),
                "sha256_ok": ok,
            }
        )
        print(f"  rss {mib:>5} MiB stream: peak {hwm / 1024:.1f} MiB ({run.mb_per_s:.1f} MB/s)")
    return results


def _ratios(rows: list[Row], forms: list[str]) -> dict[str, dict[str, float | None]]:
    """Per form: agent/JS wall MB/s, and JS/agent CPU seconds per GiB (load-independent)."""
    ratios: dict[str, dict[str, float | None]] = {}
    for form in forms:
        by = {r.responder: r for r in rows if r.form == form}
        a, j = by.get("agent"), by.get("js")
        both = a is not None and j is not None and a.sha256_ok and j.sha256_ok
        wall = cpu = None
        if both and a is not None and j is not None and j.mb_per_s > 0:
            wall = round(a.mb_per_s / j.mb_per_s, 1)
        if both and a is not None and j is not None and a.cpu_s_per_gib and j.cpu_s_per_gib:
            cpu = round(j.cpu_s_per_gib / a.cpu_s_per_gib, 1)
        ratios[form] = {"throughput": wall, "cpu": cpu}
    return ratios


def _fmt(value: float | None, spec: str = ".2f") -> str:
    return "n/a" if value is None else format(value, spec)


def report(
    facts: dict[str, str],
    codec: list[dict[str, Any]],
    rows: list[Row],
    rss: list[dict[str, Any]],
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Print the markdown tables and the verdicts; return everything as one dict."""
    print("\nmachine: " + ", ".join(f"{k} {v}" for k, v in facts.items()))
    print(f"chunk {args.chunk_kib} KiB, window {args.window}, probe {args.probe_ms} ms\n")
    print(
        "| form | responder | status | MiB | s | MB/s | responder CPU s/GiB "
        "| initiator CPU s/GiB | sha256 | note |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---|---|")
    for r in rows:
        print(
            f"| {r.form} | {r.responder} | {r.status} | {r.bytes / MiB:.0f} | {r.seconds:.2f} "
            f"| {r.mb_per_s:.1f} | {_fmt(r.cpu_s_per_gib)} | {_fmt(r.initiator_cpu_s_per_gib)} "
            f"| {'ok' if r.sha256_ok else '-'} | {r.note} |"
        )
    ratios = _ratios(rows, args.forms)
    print("\n| form | agent/JS throughput | JS/agent CPU per GiB |\n|---|---:|---:|")
    for form, ratio in ratios.items():
        print(f"| {form} | {_fmt(ratio['throughput'], '.1f')} | {_fmt(ratio['cpu'], '.1f')} |")
    print("\n| form | frame bytes | encode MB/s | decode MB/s |\n|---|---:|---:|---:|")
    for c in codec:
        print(
            f"| {c['form']} | {c['frame_bytes']} | {_fmt(c['encode_mb_s'], '.1f')} "
            f"| {c['decode_mb_s']:.1f} |"
        )
    if rss:
        print("\n| agent stream | form | idle peak RSS MiB | peak RSS MiB | MB/s | sha256 |")
        print("|---:|---|---:|---:|---:|---|")
        for m in rss:
            print(
                f"| {m['stream_mib']} MiB | {m['form']} | {m['idle_peak_rss_mib']} "
                f"| {m['peak_rss_mib']} | {m['mb_per_s']} | {'ok' if m['sha256_ok'] else '-'} |"
            )
    agent_b64 = next((r for r in rows if r.form == "base64" and r.responder == "agent"), None)
    verdicts = {
        "agent >= 5x JS, buffer form": (ratios.get("buffer", {}).get("throughput") or 0) >= 5,
        "agent >= 150 MB/s, base64 form": agent_b64 is not None and agent_b64.mb_per_s >= 150,
    }
    print("\ntargets: " + ", ".join(f"{k}: {'PASS' if v else 'FAIL'}" for k, v in verdicts.items()))
    return {
        "machine": facts,
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "rows": [asdict(r) for r in rows],
        "ratios": ratios,
        "codec": codec,
        "rss": rss,
        "targets": verdicts,
    }


def parse_args() -> argparse.Namespace:
    """The flags (sizes are per form; a stream is a whole number of chunks)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunk-kib", type=int, default=1024)
    parser.add_argument("--buffer-mib", type=int, default=64)
    parser.add_argument("--base64-mib", type=int, default=256)
    parser.add_argument("--object-mib", type=int, default=4)
    parser.add_argument("--forms", type=lambda s: s.split(","), default=list(FORMS))
    parser.add_argument(
        "--rss-mib",
        type=lambda s: [int(x) for x in s.split(",") if x],
        default=[256, 1024],
        help="stream lengths for the RSS check ('' skips)",
    )
    parser.add_argument("--rss-form", default="buffer", choices=FORMS)
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--probe-ms", type=float, default=50.0, help="backpressure re-probe")
    parser.add_argument("--distinct", type=int, default=4, help="distinct chunks, cycled")
    parser.add_argument(
        "--log",
        type=Path,
        default=None,
        help="where the responders' stderr goes (default: an unnamed temporary file, shown on "
        "stderr if the run fails; nothing is left in the temp dir)",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    unknown = set(args.forms) - set(FORMS)
    if unknown:
        parser.error(f"unknown forms {sorted(unknown)}; choose from {', '.join(FORMS)}")
    if shutil.which("node") is None or not LIBRARY.is_dir():
        parser.error("needs node and tests/interop/node_modules (cd tests/interop && npm ci)")
    return args


async def amain(args: argparse.Namespace) -> dict[str, Any]:
    """Run everything; the children's stderr goes to `args.log`."""
    facts = machine_facts()
    facts["loadavg_at_start"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print("codec (in-process) ...")
    codec = codec_figures(args.chunk_kib * 1024)
    with args.log.open("ab") if args.log is not None else tempfile.TemporaryFile() as log:
        try:
            print("throughput (agent vs JS, same frames) ...")
            rows = await throughput(args, log)
            print("agent peak RSS by stream length ...")
            rss = await peak_rss(args, log) if args.rss_mib else []
        except BaseException:
            if args.log is None:  # the only copy of the children's stderr
                log.seek(0)
                sys.stderr.buffer.write(log.read()[-_LOG_TAIL:])
            raise
    facts["loadavg_at_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return report(facts, codec, rows, rss, args)


def main() -> None:
    """Entry point."""
    args = parse_args()
    result = asyncio.run(amain(args))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
