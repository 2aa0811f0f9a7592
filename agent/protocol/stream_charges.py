"""`StreamCharges`: what each stream we receive on holds of the agent's byte budget (sans I/O).

It owns the connection's draws from its `BytePool` (`agent.protocol.pool`; none by default, and
then there is no `StreamCharges`) for the chunk frames of the streams it answers for as the
receiver, and the ledger of each such stream: what is drawn for it now and what of that it
holds. It knows no frames and no stream machines: the stream registry says which frame is a
chunk a stream keeps (`StreamRegistry.chunk_keeper`, `ResponderStream.keeps_chunks`) and which
one waits behind a chunk being decoded (`FrameResult.waits`); a stream says what its queue
holds through `Holding`, and the connection tells this object what happens, in order.

The rule: a chunk frame is drawn for before it is invited. The answer that invites it reserves
what the frame may need (`reserve`, the receive budget's gate: a quarter more than the largest
chunk frame seen, 7/4 of that to leave room for its decoded bytes; `first_frame` before any was
seen; never more than the budget's reserve) and is held, first in line, until the budget has
it. A frame that arrives takes its reservation; one that arrives without (it was not invited)
or needs more is drawn for at once (`draw`), and when the budget cannot take it the connection
drops the frame and breaks its stream (`no_room_reason`). What a stream holds: its reservation,
its queue (frames until they are decoded, then bytes), room for the decoded bytes of its chunks
being decoded, the chunk its reader took last (until the reader asks for the next one, or
stops: it has copied it into a buffer of its own by then), and the whole draw of every frame
waiting behind a chunk being decoded. Whatever is drawn beyond that goes back (`settle`); a
stream that is gone gives back everything (`forget`, `keep_only`, `clear`). Streams nobody
reads yet draw only beyond the budget's reserve, so they never crowd out the frames a moving
transfer needs.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Container
from dataclasses import dataclass, field
from typing import Final, Protocol

from agent.protocol.pool import BytePool

__all__ = ["Holding", "StreamCharges", "frame_need", "no_room_reason"]

# What a chunk frame may need from the byte budget, as a fraction of its size: the frame, and
# its decoded bytes beside it while it is decoded (base64 decodes to 3/4 of its text, the
# Buffer form to at most 1/2).
NEED_NUM: Final = 7
NEED_DEN: Final = 4


def frame_need(frame_bytes: int) -> int:
    """What a chunk frame of `frame_bytes` may hold of the byte budget until it is decoded."""
    return frame_bytes * NEED_NUM // NEED_DEN


def no_room_reason(frame_bytes: int) -> str:
    """Why a stream broke whose chunk frame of `frame_bytes` did not fit the byte budget."""
    return (
        f"a chunk frame of {frame_bytes} bytes came that the agent's byte budget had no room "
        "for: the peer sent more than it was invited to"
    )


class Holding(Protocol):
    """What a stream we receive on says of itself (`ResponderStream` is one)."""

    @property
    def stream_id(self) -> str:
        """Its id."""
        ...

    @property
    def done(self) -> bool:
        """Whether it is over (it will invite nothing more)."""
        ...

    @property
    def waiting(self) -> int:
        """Frames waiting behind its chunk being decoded."""
        ...

    @property
    def queued_bytes(self) -> int:
        """What its receive queue holds (frames until decoded, then bytes)."""
        ...


@dataclass(slots=True)
class _Ledger:
    """One stream's share of the byte budget."""

    charged: int = 0  # bytes drawn for it now
    reserved: int | None = None  # ... of which for the frame its last answer invited
    waiting: deque[int] = field(default_factory=deque)  # ... the draws of frames waiting
    decoding: int = 0  # frame bytes of its chunks being decoded
    taken: int = 0  # bytes of the chunk its reader took last


@dataclass(slots=True)
class StreamCharges:
    """The byte budget's draws for the chunk frames of one connection's receiving streams."""

    pool: BytePool
    first_frame: int  # bytes a reservation assumes before any chunk frame was seen
    _largest: int = 0  # the largest chunk frame seen (what a reservation assumes)
    # A stream's ledger, from its first draw on: the order in which they give back when
    # streams go is the order they first drew.
    _ledgers: dict[str, _Ledger] = field(default_factory=dict)
    _reading: set[str] = field(default_factory=set)  # streams whose reader reads

    def charged(self, stream_id: str) -> int:
        """Bytes drawn for stream `stream_id` now."""
        ledger = self._ledgers.get(stream_id)
        return 0 if ledger is None else ledger.charged

    def reading(self, stream_id: str) -> None:
        """Stream `stream_id`'s reader reads: what it draws from now may use the reserve (the
        reader holds a buffer, so what the stream draws always comes back)."""
        self._reading.add(stream_id)

    def reserve(self, stream_id: str) -> bool:
        """Draw for the frame an answer of `stream_id` invites (the receive budget's gate);
        False: the budget has no room, the answer waits."""
        ledger = self._ledgers.get(stream_id)
        if ledger is not None and ledger.reserved is not None:
            return True  # one invitation at a time: the one out is reserved already
        # Chunk frames of one sender vary with their bytes (a Buffer-form frame is 2 to 4 times
        # its chunk): a quarter above the largest seen.
        seen = self._largest * 5 // 4
        need = frame_need(min(seen, self.first_frame) if seen else self.first_frame)
        # Never above the reserve: every other draw leaves the reserve free, so a reservation
        # within it fits once the moving streams' frames are taken, while a larger one could
        # wait for ever behind transfers that hold buffers and wait for it (a stage on a
        # fresh session, 16 MiB frames assumed: 28 MiB beside its 20 of buffers in 32).
        need = min(need, self.pool.reserve or need)
        if not self.pool.try_take(need, keep=self._keep(stream_id)):
            return False
        ledger = self._ledger(stream_id)
        ledger.reserved = need
        ledger.charged += need
        return True

    def draw(self, stream_id: str, frame_bytes: int) -> bool:
        """A chunk frame of `frame_bytes` came for `stream_id`, before the stream takes it: it
        takes the stream's reservation, and what it needs beyond is drawn at once. False: that
        did not fit (nothing more is drawn; the reservation is used up all the same)."""
        self._largest = max(self._largest, frame_bytes)
        ledger = self._ledgers.get(stream_id)
        reserved = 0
        if ledger is not None:
            reserved, ledger.reserved = ledger.reserved or 0, None
        more = frame_need(frame_bytes) - reserved
        if more > 0 and not self.pool.try_take(more, keep=self._keep(stream_id)):
            return False
        # A reservation larger than the frame's need is given back by `settle`.
        self._ledger(stream_id).charged += max(more, 0)
        return True

    def wait(self, stream_id: str, frame_bytes: int) -> None:
        """The frame just drawn for waits behind a chunk of its stream being decoded: its
        whole draw stays with it until it is answered."""
        self._ledger(stream_id).waiting.append(frame_need(frame_bytes))

    def decoding(self, stream_id: str, frame_bytes: int) -> None:
        """Chunks of `frame_bytes` (their frames) are handed out to be decoded."""
        self._ledger(stream_id).decoding += frame_bytes

    def decoded(self, stream_id: str, frame_bytes: int) -> None:
        """A chunk of `frame_bytes` (its frame) is decoded, or will never be."""
        ledger = self._ledgers.get(stream_id)
        if ledger is not None:
            ledger.decoding = max(0, ledger.decoding - frame_bytes)

    def took(self, stream_id: str, chunk_bytes: int) -> None:
        """The reader of `stream_id` took a chunk of `chunk_bytes` (0: none, or it stopped):
        it is done with the one before, and holds this one until it asks again."""
        ledger = self._ledgers.get(stream_id)
        if ledger is not None:
            ledger.taken = chunk_bytes

    def settle(self, stream: Holding) -> None:
        """Give back what `stream` no longer holds: decoded frames, chunks its reader is done
        with, the reservation of a stream that is over."""
        ledger = self._ledgers.get(stream.stream_id)
        if ledger is None:
            return
        if stream.done:
            ledger.reserved = None
        while len(ledger.waiting) > stream.waiting:
            ledger.waiting.popleft()  # answered in order: the oldest are in the queue now
        holds = (
            (ledger.reserved or 0)
            + stream.queued_bytes
            + (ledger.decoding * (NEED_NUM - NEED_DEN)) // NEED_DEN
            + ledger.taken
            + sum(ledger.waiting)
        )
        if holds < ledger.charged:
            given, ledger.charged = ledger.charged - holds, holds
            self.pool.give(given)

    def forget(self, stream_id: str) -> None:
        """Stream `stream_id` is gone: everything drawn for it goes back."""
        self._reading.discard(stream_id)
        ledger = self._ledgers.pop(stream_id, None)
        if ledger is not None and ledger.charged:
            self.pool.give(ledger.charged)

    def keep_only(self, live: Container[str]) -> None:
        """Forget every stream not in `live` (the registry forgot it)."""
        for stream_id in [s for s in self._ledgers if s not in live]:
            self.forget(stream_id)
        self._reading = {s for s in self._reading if s in live}

    def clear(self) -> None:
        """The connection is gone: every stream gives back everything."""
        for stream_id in list(self._ledgers):
            self.forget(stream_id)
        self._reading.clear()

    def _ledger(self, stream_id: str) -> _Ledger:
        ledger = self._ledgers.get(stream_id)
        if ledger is None:
            ledger = self._ledgers[stream_id] = _Ledger()
        return ledger

    def _keep(self, stream_id: str) -> int:
        """What a draw leaves free: the reserve, unless the stream's reader reads."""
        return 0 if stream_id in self._reading else self.pool.reserve
