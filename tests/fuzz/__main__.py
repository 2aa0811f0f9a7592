"""`python -m tests.fuzz [SECONDS] [TARGET...]`: run the fuzz targets of tests/fuzz/test_targets.py
until SECONDS (default 60) have passed, shared evenly between the targets named (default all);
on the first failure hypothesis prints the falsifying example (shrunk) and the run exits 1."""

from __future__ import annotations

import logging
import sys
import time

import structlog

from tests.fuzz.test_targets import EXAMPLES, NATIVE, TARGETS


def main(argv: list[str]) -> int:
    seconds = float(argv[0]) if argv else 60.0
    names = argv[1:] or list(TARGETS)
    unknown = [name for name in names if name not in TARGETS]
    if unknown:
        print(f"unknown fuzz target(s) {unknown}; known: {sorted(TARGETS)}", file=sys.stderr)
        return 2
    print(f"fuzzing {names} for {seconds:g} s; native decoder: {getattr(NATIVE, '__file__', None)}")
    # The intake logs every frame it drops; a fuzz run would print little else.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    share = seconds / len(names)
    for name in names:
        target, runs, began = TARGETS[name], 0, time.monotonic()
        while time.monotonic() - began < share:
            target()
            runs += 1
        spent = time.monotonic() - began
        print(f"{name}: {EXAMPLES[name]} inputs in {runs} runs, {spent:.0f} s, no failure")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
