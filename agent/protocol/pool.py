"""`BytePool`: what the protocol needs of the agent's byte budget (`agent.transfers.budget`).

The connection draws for the chunk frames it receives as a responder: an answer that invites a
stream's next chunk frame first reserves what that frame may hold (`try_take`; refused: the
answer is held until room appears), the frame then holds its bytes (and, until it is decoded,
room for its decoded bytes), and its chunk's bytes stay drawn until the stream's reader asks
for the next one (the reader has copied it into a buffer of its own by then). `keep`: draws
for a stream nobody reads yet leave the budget's `reserve` free, so they can never crowd out
the frames a moving transfer needs to go on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

__all__ = ["BytePool", "WatchedPool"]


class BytePool(Protocol):
    """A byte budget drawn at once or not at all."""

    @property
    def reserve(self) -> int:
        """Bytes only draws with `keep=0` may use."""
        ...

    def try_take(self, size: int, *, keep: int = 0) -> bool:
        """Draw `size` bytes now if they fit with `keep` to spare."""
        ...

    def give(self, size: int) -> None:
        """Give `size` drawn bytes back."""
        ...


class WatchedPool(BytePool, Protocol):
    """A `BytePool` that says when bytes come back (the driver then asks the connection again:
    a held invitation may fit now)."""

    def on_room(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call `listener` whenever bytes are given back; returns the function that stops it."""
        ...
