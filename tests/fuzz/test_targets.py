"""Fuzz targets: the native Buffer-form decoder (`agent/_bufferform.c` through
`agent.protocol.bytearrays`) and the frame intake (`Connection.receive_frame`), as hypothesis
tests.

Each target is an ordinary `@given` test that `python -m tests.fuzz` runs again and again, with
fresh randomness, until its time is up (`scripts/fuzz [SECONDS]`); pytest collects them too,
with a few examples each, so a broken target fails the suite. What each one holds:

- `test_native_decoder_agrees_with_json`: on generated, mutated, hostile and large arrays the
  native decoder answers None or JSON's bytes (the stdlib `json` + `bytes()`), whatever lies
  after the text it was handed (a view into a larger buffer, as the frame splitter hands it),
  each of its canonical kernels the CPU runs (`kernels()`) answers the same, and its quick
  decoder (`decode_quick`, the wide kernel alone) answers None or the same;
  the pure path and the chosen decoder give JSON's verdict. `scripts/fuzz` runs it against a
  copy of the extension built with AddressSanitizer and UBSan when gcc is there
  (`AGENT_FUZZ_NATIVE` names that build), so an out-of-bounds read fails the run too.
- `test_frame_intake_never_raises`: the property of tests/protocol/test_hostile_frames.py,
  with more examples: no frame makes `Connection.receive_frame` (or a reply it triggers) raise,
  every frame sent is UTF-8 JSON, no request correlation is answered more often than it was
  asked.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
from collections import Counter
from types import ModuleType

from hypothesis import HealthCheck, given, settings, strategies as st

from agent.protocol import bytearrays
from tests.protocol._arrays import (
    combined,
    comma_digit_runs,
    large_arrays,
    mutated_arrays,
    near_canonical_arrays,
    oracle,
    pure,
    spaced_arrays,
)
from tests.protocol._hostile import Driver, frames

__all__ = [
    "EXAMPLES",
    "TARGETS",
    "test_frame_intake_never_raises",
    "test_native_decoder_agrees_with_json",
]

EXAMPLES: Counter[str] = Counter()  # texts decoded, frames fed: what a fuzz run reports

FUZZ = settings(
    max_examples=25,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)


def _native() -> ModuleType | None:
    """The native decoder under test: the sanitizer build `AGENT_FUZZ_NATIVE` names, else the
    one the package imported (None when it was not built)."""
    path = os.environ.get("AGENT_FUZZ_NATIVE")
    if not path:
        return bytearrays._native
    loader = importlib.machinery.ExtensionFileLoader("_bufferform", path)
    spec = importlib.util.spec_from_file_location("_bufferform", path, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


NATIVE = _native()
TEXTS = st.one_of(
    mutated_arrays(),
    near_canonical_arrays(),
    comma_digit_runs(),
    spaced_arrays().map(lambda case: case[0]),
    large_arrays(),
    st.binary(max_size=300),
)


@FUZZ
@given(TEXTS, st.binary(max_size=8))
def test_native_decoder_agrees_with_json(text: bytes, after: bytes) -> None:
    """The native decoder answers None or JSON's bytes, never reading past its text; the pure
    path and the chosen decoder give JSON's verdict."""
    verdict = oracle(text)
    assert pure(text) == verdict
    assert combined(text) == verdict
    if NATIVE is not None:
        got = NATIVE.decode(bytearray(text))  # an exact-size buffer: ASan sees any overread
        assert got is None or got == verdict
        assert NATIVE.decode(memoryview(text + after)[: len(text)]) == got
        for kernel in NATIVE.kernels():  # each canonical kernel this CPU runs: the same answer
            assert NATIVE.decode_with(bytearray(text), kernel) == got
        quick = NATIVE.decode_quick(bytearray(text))  # the wide kernel alone, for the loop
        assert quick is None or quick == got
        if got is not None:
            assert NATIVE.decode(NATIVE.encode(got)) == got
    EXAMPLES["native-decoder"] += 1


@FUZZ
@given(st.lists(frames(), min_size=1, max_size=12))
def test_frame_intake_never_raises(batch: list[bytes]) -> None:
    """No frame makes the connection raise or send anything but JSON, nor answer twice."""
    driver = Driver()
    for frame in batch:
        driver.feed(frame)
    EXAMPLES["frame-intake"] += len(batch)


TARGETS = {
    "native-decoder": test_native_decoder_agrees_with_json,
    "frame-intake": test_frame_intake_never_raises,
}
