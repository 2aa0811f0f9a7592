"""PieceReader: websockets' stream reader over the pieces fed, each read cut out with at most
one copy. Differential against the library's own `StreamReader`: the same feeds and reads give
the same bytes, the same waits and the same errors; a frame's payload comes out as `bytes`."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st
from websockets.frames import Frame, Opcode
from websockets.streams import StreamReader

from agent.session.pieces import PieceReader

Reader = PieceReader | StreamReader


def step(reader: Reader, op: tuple[Any, ...]) -> Generator[None, None, Any]:
    kind, *args = op
    if kind == "line":
        return reader.read_line(*args)
    if kind == "exact":
        return reader.read_exact(*args)
    if kind == "eof?":
        return reader.at_eof()
    return reader.read_to_eof(*args)


def outcome(reader: Reader, feeds: list[bytes], ops: list[tuple[Any, ...]], end: bool) -> list[Any]:
    """Run `ops` one after another, feeding a piece whenever a read waits; what each read gave
    (bytes as bytes), or the error that ended the run."""
    seen: list[Any] = []
    pending = list(feeds)
    try:
        for op in ops:
            reading = step(reader, op)
            while True:
                try:
                    next(reading)
                except StopIteration as done:
                    value = done.value
                    seen.append(bytes(value) if isinstance(value, bytes | bytearray) else value)
                    break
                if pending:
                    reader.feed_data(pending.pop(0))
                elif end and not reader.eof:
                    reader.feed_eof()
                else:
                    seen.append("waits")
                    return seen
    except (EOFError, RuntimeError) as exc:
        seen.append((type(exc).__name__, str(exc)))
    return seen


OPS = st.one_of(
    st.tuples(st.just("exact"), st.integers(0, 40)),
    st.tuples(st.just("line"), st.integers(0, 30)),
    st.tuples(st.just("eof?")),
    st.tuples(st.just("to-eof"), st.integers(0, 60)),
)


@settings(max_examples=400)
@given(
    st.lists(st.binary(min_size=1, max_size=12).map(lambda b: b.replace(b"x", b"\n")), max_size=8),
    st.lists(OPS, max_size=8),
    st.booleans(),
)
def test_reads_give_what_the_librarys_reader_gives(
    feeds: list[bytes], ops: list[tuple[Any, ...]], end: bool
) -> None:
    """Any feeds, any reads (exact, line, to EOF, at EOF), with or without the end: the same
    bytes, waits and errors as websockets' own reader."""
    assert outcome(PieceReader(), feeds, ops, end) == outcome(StreamReader(), feeds, ops, end)


def test_a_read_within_one_piece_is_bytes_and_a_whole_piece_is_not_copied() -> None:
    reader = PieceReader()
    piece = b"abcdefgh" * 4
    reader.feed_data(piece)
    assert _run(reader.read_exact(3)) == b"abc"
    assert type(_run(reader.read_exact(5))) is bytes
    whole = b"w" * 100
    reader.feed_data(whole)
    assert _run(reader.read_exact(24)) == piece[8:]
    assert _run(reader.read_exact(100)) is whole


def test_a_frame_across_many_pieces_is_one_bytes_object() -> None:
    """What the protocol reads a frame with: its payload is `bytes` joined once, so the message
    websockets joins from that one frame is that same object."""
    payload = bytes(range(256)) * 1000
    wire = Frame(Opcode.TEXT, payload).serialize(mask=False)
    reader = PieceReader()
    for at in range(0, len(wire), 4096):
        reader.feed_data(wire[at : at + 4096])
    frame = _run(Frame.parse(reader.read_exact, mask=False))
    assert frame.data == payload
    assert type(frame.data) is bytes
    assert b"".join([frame.data]) is frame.data


def test_feeding_after_the_end_is_refused_as_by_the_library() -> None:
    reader = PieceReader()
    reader.feed_eof()
    with pytest.raises(EOFError):
        reader.feed_data(b"x")
    with pytest.raises(EOFError):
        reader.feed_eof()


def test_discard_drops_what_was_fed_and_the_stream_goes_on() -> None:
    reader = PieceReader()
    reader.feed_data(b"abc")
    reader.feed_data(b"def")
    _run(reader.read_exact(1))
    reader.discard()
    reader.feed_data(b"gh")
    assert _run(reader.read_exact(2)) == b"gh"


def test_a_bytearray_fed_is_copied_once_fed() -> None:
    """Only `bytes` are kept as they are: a mutable piece changed later does not change what
    is read."""
    reader = PieceReader()
    piece = bytearray(b"abcd")
    reader.feed_data(piece)
    piece[:] = b"zzzz"
    assert _run(reader.read_exact(4)) == b"abcd"


def _run(reading: Generator[None, None, Any]) -> Any:
    try:
        next(reading)
    except StopIteration as done:
        return done.value
    raise AssertionError("the read waits for more bytes")
