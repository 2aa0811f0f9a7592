"""`python -m tests.fuzz [SECONDS] [TARGET...]`: run the fuzz targets until SECONDS (default 60)
have passed, shared evenly between the targets named (default all); the first failure ends the
run with exit 1.

The hypothesis targets of tests/fuzz/test_targets.py run here, again and again; a failure prints
the falsifying example (shrunk). `frame-intake-guided` runs tests/fuzz/guided.py (atheris) in a
process of its own, seeded with frames drawn from the hypothesis grammar, in a temporary
directory that is removed afterwards; a failure prints libFuzzer's report and the failing
input (base64). Without atheris installed it is skipped, and the line says so.
"""

from __future__ import annotations

import base64
import importlib.util
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import structlog
from hypothesis import HealthCheck, given, settings, strategies as st

from tests.fuzz.test_targets import EXAMPLES, NATIVE, TARGETS
from tests.protocol._hostile import CORRELATIONS, METHODS, PURPOSES, STREAM_IDS, frames

GUIDED = "frame-intake-guided"
MAX_LEN = 65_536  # bytes of one guided input, seeds included
# Field names and values of the wire (docs/wire-notes.md), for libFuzzer's mutations.
TOKENS = (
    '"method"', '"request"', '"response"', '"correlation"', '"phase"', '"id"', '"error"',
    '"retry"', '"##VirtualStream##"', '"streamId"', '"cycleId"', '"cycle"', '"mainPurpose"',
    '"chunkData"', '"keepAlive"', '"next"', '"backpressure"', '"_isVirtualStream"', 'true',
    'null', '{"type":"Buffer","data":[', '{"type":"EncodedBuffer","data":"base64:',
    '"#############CLOSING BIT#############"',
    *(f'"{word}"' for word in (*METHODS, *PURPOSES, *STREAM_IDS, *CORRELATIONS)),
)  # fmt: skip
# What the sanitizer build needs; the guided target fuzzes Python code and runs without them.
_SANITIZER_ENV = ("LD_PRELOAD", "PYTHONMALLOC", "ASAN_OPTIONS", "AGENT_FUZZ_NATIVE")


def main(argv: list[str]) -> int:
    seconds = float(argv[0]) if argv else 60.0
    known = [*TARGETS, GUIDED]
    names = argv[1:] or known
    unknown = [name for name in names if name not in known]
    if unknown:
        print(f"unknown fuzz target(s) {unknown}; known: {sorted(known)}", file=sys.stderr)
        return 2
    print(f"fuzzing {names} for {seconds:g} s; native decoder: {getattr(NATIVE, '__file__', None)}")
    # The intake logs every frame it drops; a fuzz run would print little else.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    share = seconds / len(names)
    for name in names:
        if name == GUIDED:
            if not _guided(share):
                return 1
            continue
        target, runs, began = TARGETS[name], 0, time.monotonic()
        while time.monotonic() - began < share:
            target()
            runs += 1
        spent = time.monotonic() - began
        print(f"{name}: {EXAMPLES[name]} inputs in {runs} runs, {spent:.0f} s, no failure")
    return 0


def _guided(seconds: float) -> bool:
    """Run the atheris target for `seconds` (at least 1); False when it found a failure."""
    if importlib.util.find_spec("atheris") is None:
        print(f"{GUIDED}: atheris is not installed, skipped")
        return True
    with tempfile.TemporaryDirectory(prefix="agent-fuzz-") as name:
        directory = Path(name)
        _seed(directory / "corpus")
        (directory / "frames.dict").write_text("".join(map(_dict_line, TOKENS)))
        env = {key: value for key, value in os.environ.items() if key not in _SANITIZER_ENV}
        began = time.monotonic()
        command = ["-m", "tests.fuzz.guided", str(max(1, round(seconds))), name, str(MAX_LEN)]
        try:
            done = subprocess.run(
                [sys.executable, *command],
                env=env,
                capture_output=True,
                text=True,
                check=False,
                timeout=seconds + 120,  # libFuzzer stops itself; this bounds one that does not
            )
        except subprocess.TimeoutExpired:
            late = f"{GUIDED}: FAILED: still running {seconds + 120:.0f} s after its start"
            print(late, file=sys.stderr)
            return False
        spent = time.monotonic() - began
        if done.returncode != 0:
            report = done.stdout + done.stderr
            at = report.find("=== Uncaught Python exception")  # atheris' traceback
            print(report[at:] if at >= 0 else report[-6000:], file=sys.stderr)
            for crash in sorted(directory.glob("crash-*")):
                data = base64.b64encode(crash.read_bytes()).decode()
                print(f"{GUIDED}: failing input (base64): {data}", file=sys.stderr)
            print(f"{GUIDED}: FAILED after {spent:.0f} s (exit {done.returncode})", file=sys.stderr)
            return False
        runs = re.search(r"stat::number_of_executed_units: (\d+)", done.stderr)
        cover = re.findall(r"cov: (\d+) ft: (\d+)", done.stderr)
        found = f", {cover[-1][0]} edges, {cover[-1][1]} features" if cover else ""
        count = runs.group(1) if runs else "?"
        print(f"{GUIDED}: {count} inputs in {spent:.0f} s{found}, no failure")
        return True


def _dict_line(token: str) -> str:
    """`token` as a line of a libFuzzer dictionary: quoted, with quotes and backslashes escaped."""
    escaped = token.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"\n'


def _seed(corpus: Path) -> None:
    """Seed inputs for libFuzzer: a few dozen frame batches drawn from the hypothesis grammar."""
    corpus.mkdir()
    seeds: list[bytes] = []

    @settings(
        max_examples=64, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(st.lists(frames(), min_size=1, max_size=4))
    def draw(batch: list[bytes]) -> None:
        seed = b"\n".join(batch)
        if len(seed) <= MAX_LEN:
            seeds.append(seed)

    draw()
    for number, seed in enumerate(seeds):
        (corpus / f"seed-{number:03}").write_bytes(seed)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
