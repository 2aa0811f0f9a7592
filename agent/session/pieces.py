"""`PieceReader`: the websocket's read buffer as the pieces the socket handed over, each frame
cut out of them with one copy.

websockets' sans-I/O protocol reads the socket through a generator-based stream reader
(`read_line`, `read_exact`, `read_to_eof`, `at_eof`, fed by `feed_data`/`feed_eof`). The
library's own keeps one `bytearray`: every piece read from the socket is appended to it (the
array moved by `realloc` as it grows), a frame is sliced out of it (a copy) and joined into the
message (another). A Buffer-form chunk frame is ~3.7 MB of JSON per MiB of chunk, so that was
three copies of every byte the session received, and the largest share of the event loop's
CPU after the chunk decoder (docs/benchmarks.md, "CPU per GiB").

This reader keeps the pieces as they came (`bytes`, no copy) and hands a frame's payload out
as one `bytes` object joined once from them: a piece that is exactly the bytes asked for is
handed out as it is, and the message websockets joins from a single frame's `bytes` is that
object itself (`b"".join` of one `bytes` returns it). What it holds is what the library's held:
the bytes fed and not read yet.

The interface and the errors are the library's stream reader's (websockets 17): the protocol
calls only these methods. `agent.session.transport` installs it on the agent's client
connection before a byte is read. Pure: no I/O, no websockets import (tests/session/test_pieces.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator

__all__ = ["PieceReader"]


class PieceReader:
    """A generator-based stream reader over the pieces fed, for websockets' protocol."""

    def __init__(self) -> None:
        self._pieces: deque[bytes] = deque()
        self._offset = 0  # bytes of the first piece already read
        self._size = 0  # bytes fed and not read yet
        self.eof = False

    def read_line(
        self, m: int, too_long_exc_type: type[Exception] = RuntimeError
    ) -> Generator[None, None, bytes]:
        """The next LF-terminated line, LF included; at most `m` bytes (`too_long_exc_type`
        beyond), `EOFError` if the stream ends first."""
        searched = 0  # bytes known to hold no LF
        while True:
            joined = self._joined()
            end = joined.find(b"\n", self._offset + searched) + 1
            if end > 0:
                n = end - self._offset
                break
            searched = self._size
            if searched > m:
                raise too_long_exc_type(f"read {searched} bytes, expected no more than {m} bytes")
            if self.eof:
                raise EOFError(f"stream ends after {searched} bytes, before end of line")
            yield
        if n > m:
            raise too_long_exc_type(f"read {n} bytes, expected no more than {m} bytes")
        return self._take(n)

    def read_exact(self, n: int) -> Generator[None, None, bytes]:
        """The next `n` bytes; `EOFError` if the stream ends first."""
        assert n >= 0
        while self._size < n:
            if self.eof:
                raise EOFError(f"stream ends after {self._size} bytes, expected {n} bytes")
            yield
        return self._take(n)

    def read_to_eof(
        self, m: int, too_long_exc_type: type[Exception] = RuntimeError
    ) -> Generator[None, None, bytes]:
        """Every byte until the stream ends; at most `m` (`too_long_exc_type` beyond)."""
        while not self.eof:
            if self._size > m:
                raise too_long_exc_type(f"read {self._size} bytes, expected no more than {m} bytes")
            yield
        return self._take(self._size)

    def at_eof(self) -> Generator[None, None, bool]:
        """Whether the stream ended with every byte read (waits while that is unknown)."""
        while True:
            if self._size:
                return False
            if self.eof:
                return True
            yield

    def feed_data(self, data: bytes | bytearray) -> None:
        """Add bytes read from the socket (kept as they are: `bytes` are not copied)."""
        if self.eof:
            raise EOFError("stream ended")
        if data:
            self._pieces.append(data if type(data) is bytes else bytes(data))
            self._size += len(data)

    def feed_eof(self) -> None:
        """The stream ended."""
        if self.eof:
            raise EOFError("stream ended")
        self.eof = True

    def discard(self) -> None:
        """Drop every byte fed and not read (the stream goes on)."""
        self._pieces.clear()
        self._offset = self._size = 0

    def _joined(self) -> bytes:
        """The unread bytes as one piece (its first `_offset` bytes already read)."""
        if len(self._pieces) > 1:
            rest = memoryview(self._pieces[0])[self._offset :]
            joined = b"".join([rest, *list(self._pieces)[1:]])
            self._pieces.clear()
            self._pieces.append(joined)
            self._offset = 0
        return self._pieces[0] if self._pieces else b""

    def _take(self, n: int) -> bytes:
        """The next `n` bytes (there are that many), cut out with at most one copy."""
        if n == 0:
            return b""
        self._size -= n
        pieces, offset = self._pieces, self._offset
        first = pieces[0]
        left = len(first) - offset
        if n < left:
            self._offset = offset + n
            return first[offset : offset + n]
        pieces.popleft()
        self._offset = 0
        if n == left:
            return first if offset == 0 else first[offset:]
        parts: list[bytes | memoryview] = [memoryview(first)[offset:]]
        n -= left
        while n and n >= len(pieces[0]):
            piece = pieces.popleft()
            parts.append(piece)
            n -= len(piece)
        if n:
            parts.append(memoryview(pieces[0])[:n])
            self._offset = n
        return b"".join(parts)
