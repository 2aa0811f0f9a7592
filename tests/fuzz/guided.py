"""The frame intake under atheris (libFuzzer), guided by the line coverage of `agent.protocol`.

`python -m tests.fuzz.guided SECONDS DIRECTORY MAX_LEN`: DIRECTORY holds `corpus/` (seed
inputs, which libFuzzer extends with every input that reaches new code; MAX_LEN bytes at most),
`frames.dict` (the wire's field names and values, for its mutations) and gets `crash-*` files
for failing inputs. `python -m tests.fuzz` prepares it, runs this in a process of its own
(libFuzzer ends the process when its time is up) and removes it afterwards.

One input is up to `MAX_FRAMES` frames separated by newlines, fed to the `Driver` of
tests/protocol/_hostile.py, which answers every request, settles every chunk, lets time pass and
checks what comes out. A failure is an exception out of the connection or a broken invariant:
a frame sent that is not UTF-8 JSON, or a correlation answered more often than it was asked;
so is an input that takes 10 s or 2 GB.
Unlike the hypothesis targets, which draw frames from a grammar, libFuzzer mutates bytes and
keeps what reaches new lines of the protocol package.
"""

from __future__ import annotations

import logging
import sys

import atheris
import structlog

with atheris.instrument_imports(include=["agent.protocol"]):
    from tests.protocol._hostile import Driver

MAX_FRAMES = 12


def one(data: bytes) -> None:
    """Feed one input's frames to a fresh connection."""
    driver = Driver()
    for frame in data.split(b"\n", MAX_FRAMES - 1):
        driver.feed(frame)


def main(argv: list[str]) -> None:
    seconds, directory, max_len = int(argv[0]), argv[1], int(argv[2])
    # The intake logs every frame it drops; libFuzzer's own lines are the report.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    atheris.Setup(
        [
            sys.argv[0],
            f"-max_total_time={seconds}",
            f"-max_len={max_len}",
            f"-dict={directory}/frames.dict",
            f"-artifact_prefix={directory}/",
            # One input that takes 10 s, or 2 GB, is a failure: a frame that pins the connection.
            "-timeout=10",
            "-rss_limit_mb=2048",
            "-print_final_stats=1",
            f"{directory}/corpus",
        ],
        one,
    )
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv[1:])
