"""The connection draws from the agent's byte budget for the chunk frames it receives: an
invitation waits for room instead of failing, what the streams hold never passes the budget,
and every byte comes back once its stream's reader is done with it."""

from __future__ import annotations

from typing import Any

import orjson

from agent.errors import CallTimeout
from agent.protocol.connection import (
    CallErrored,
    ChunkToDecode,
    Connection,
    ConnectionSettings,
    RequestReceived,
    StreamSettings,
)
from agent.protocol.events import StreamEnded
from agent.transfers.budget import BudgetLedger
from tests.protocol.test_connection import (
    Wire,
    chunk_frame,
    connection,
    feedback_frame,
    marker,
    request,
    requests,
)

FRAME = 3000  # bytes of a test chunk frame (padded to this size)


class Ledger:
    """A `BytePool` over the real ledger, remembering the most it ever held."""

    def __init__(self, limit: int, reserve: int = 0) -> None:
        self.ledger = BudgetLedger(limit, reserve=reserve)
        self.most = 0

    @property
    def reserve(self) -> int:
        return self.ledger.reserve

    @property
    def held(self) -> int:
        return self.ledger.held

    def try_take(self, size: int, *, keep: int = 0) -> bool:
        taken = self.ledger.try_take(size, keep=keep)
        self.most = max(self.most, self.ledger.held)
        return taken

    def give(self, size: int) -> None:
        self.ledger.give(size)


def budgeted(pool: Ledger, **changes: Any) -> Connection:
    settings = ConnectionSettings(
        streams=StreamSettings(window=4, window_bytes=4 * FRAME, inline_decode_max=0),
        receive_budget=None,
        **changes,
    )
    return Connection(("echo",), settings, pool=pool, first_frame_bytes=FRAME)


def padded_chunk(stream_id: str, cycle_id: str, value: int) -> bytes:
    """A chunk frame of exactly `FRAME` bytes (one byte `value`, its cycle id padded)."""
    frame = chunk_frame(stream_id, cycle_id, f"[{value}]".encode())
    return chunk_frame(stream_id, cycle_id + "x" * (FRAME - len(frame)), f"[{value}]".encode())


def closing_frame(stream_id: str) -> bytes:
    package = {"streamId": stream_id, "cycleId": f"{stream_id}-end", "cycle": "request"}
    package |= {"mainPurpose": "chunk", "chunkData": "#############CLOSING BIT#############"}
    return orjson.dumps({"method": "##VirtualStream##", "request": package, "response": None})


def answers(conn: Connection) -> list[dict[str, Any]]:
    return [orjson.loads(frame)["response"] for frame in conn.data_to_send()]


def open_read(conn: Connection, stream_id: str = "s1") -> None:
    conn.receive_frame(request("echo", {"a": marker(stream_id)}), 0.0)
    [event] = requests(conn)
    conn.receive_request_stream(event.request_id, stream_id, 0.0)


def decode_all(conn: Connection, now: float) -> None:
    for event in conn.events_received():
        if isinstance(event, ChunkToDecode):
            conn.settle_chunk(event.stream_id, event.token, event.token.decode(), now)


def test_an_invitation_waits_for_room_in_the_budget_instead_of_failing() -> None:
    """With the budget full, the probe's answer is held, not refused; once bytes come back
    it goes out, inviting the chunk."""
    pool = Ledger(limit=10 * FRAME)
    assert pool.try_take(9 * FRAME)  # other transfers hold nearly all of it
    conn = budgeted(pool)
    open_read(conn)
    conn.receive_frame(feedback_frame("s1", "f1"), 0.0)
    assert answers(conn) == []  # held: the frame it would invite has no room
    assert conn.stream_outcome("s1") is None
    pool.give(5 * FRAME)
    conn.release_held(0.0)  # what the driver does when the budget says there is room
    [answer] = answers(conn)
    assert answer["backpressure"] is False
    assert conn.stream_outcome("s1") is None


def test_letting_held_answers_go_leaves_the_clocks_work_to_advance() -> None:
    """`release_held` sends what fits and nothing else: a call past its deadline is failed by
    `advance`, not by it."""
    pool = Ledger(limit=10 * FRAME)
    assert pool.try_take(9 * FRAME)
    conn = budgeted(pool)
    open_read(conn)
    conn.receive_frame(feedback_frame("s1", "f1"), 0.0)
    call_id = conn.call("echo", {}, now=0.0, timeout=5.0)
    conn.data_to_send()
    pool.give(5 * FRAME)
    conn.release_held(6.0)
    [answer] = answers(conn)
    assert answer["backpressure"] is False
    assert not failures(conn)  # the call is still pending
    conn.advance(6.0)
    [event] = failures(conn)
    assert (event.call_id, type(event.error)) == (call_id, CallTimeout)


def failures(conn: Connection) -> list[CallErrored]:
    return [event for event in conn.events_received() if isinstance(event, CallErrored)]


def test_a_probe_on_a_stream_nobody_reads_yet_waits_for_its_reader() -> None:
    """With a byte budget, nothing is invited for a stream before its handler reads it: its
    initiator's probe waits (a long poll), and the read answers it with the invitation."""
    pool = Ledger(limit=10 * FRAME)
    conn = budgeted(pool)
    conn.receive_frame(request("echo", {"a": marker("s1")}), 0.0)
    [event] = requests(conn)
    conn.receive_frame(feedback_frame("s1", "f1"), 0.0)
    assert answers(conn) == []
    conn.receive_request_stream(event.request_id, "s1", 0.2)
    [answer] = answers(conn)
    assert (answer["cycleId"], answer["backpressure"]) == ("f1", False)
    assert pool.held > 0  # the invited frame is reserved


def test_a_probe_on_a_stream_nobody_reads_yet_is_answered_backpressure_after_park_timeout() -> None:
    """The probe waits `park_timeout` at most, then says backpressure: its initiator probes
    again, once a second instead of twenty times."""
    pool = Ledger(limit=10 * FRAME)
    conn = budgeted(pool)
    conn.receive_frame(request("echo", {"a": marker("s1")}), 0.0)
    requests(conn)
    conn.receive_frame(feedback_frame("s1", "f1"), 0.0)
    park = conn.settings.streams.park_timeout
    conn.advance(park - 0.01)
    assert answers(conn) == []
    conn.advance(park)
    [answer] = answers(conn)
    assert (answer["cycleId"], answer["backpressure"]) == ("f1", True)
    assert pool.held == 0


def test_the_streams_never_hold_more_than_the_budget_and_give_it_all_back() -> None:
    """Two streams, chunks invited, decoded and taken in turn: the budget is never passed,
    and once both ended and their readers took everything, nothing is drawn."""
    pool = Ledger(limit=12 * FRAME)
    conn = budgeted(pool)
    open_read(conn, "s1")
    open_read(conn, "s2")
    taken: dict[str, list[bytes]] = {"s1": [], "s2": []}
    now = 0.0
    for stream_id in ("s1", "s2"):
        conn.receive_frame(feedback_frame(stream_id, f"{stream_id}-f"), now)
    for index in range(20):
        for stream_id in ("s1", "s2"):
            now += 0.01
            conn.receive_frame(padded_chunk(stream_id, f"{stream_id}-{index}", index), now)
            assert pool.held <= pool.ledger.limit
            if index % 3 == 2:  # the decoder and the reader lag now and then
                continue
            decode_all(conn, now)
            while (item := conn.take(stream_id, now)) is not None:
                taken[stream_id].append(item)
        answers(conn)
        conn.advance(now)
    decode_all(conn, now)
    for stream_id in ("s1", "s2"):
        conn.receive_frame(closing_frame(stream_id), now)
        while (item := conn.take(stream_id, now)) is not None and isinstance(item, bytes):
            taken[stream_id].append(item)
    assert [len(chunks) for chunks in taken.values()] == [20, 20]
    assert pool.most <= pool.ledger.limit
    assert pool.held == 0


def test_a_chunk_nobody_invited_breaks_its_stream_when_the_budget_is_full() -> None:
    """A frame sent past the invitations, with no room left, is dropped and its stream
    breaks: the budget is not passed."""
    pool = Ledger(limit=10 * FRAME)
    conn = budgeted(pool)
    open_read(conn)
    assert pool.try_take(10 * FRAME)
    conn.receive_frame(padded_chunk("s1", "c1", 1), 0.0)
    outcome = conn.stream_outcome("s1")
    assert outcome is not None
    assert "byte budget" in outcome.reason
    assert pool.held == 10 * FRAME


def test_a_taken_chunk_stays_drawn_until_its_reader_asks_for_the_next() -> None:
    """The reader copies a chunk into a buffer of its own before it takes the next: until
    then the chunk's bytes stay drawn, then they come back."""
    pool = Ledger(limit=10 * FRAME)
    conn = budgeted(pool)
    open_read(conn)
    conn.receive_frame(feedback_frame("s1", "f1"), 0.0)
    conn.receive_frame(padded_chunk("s1", "c1", 9), 0.0)
    decode_all(conn, 0.0)
    answers(conn)
    reserved_next = pool.held - 1  # the answer to c1 invited the next frame
    assert conn.take("s1", 0.0) == b"\x09"
    assert pool.held == reserved_next + 1
    assert conn.take("s1", 0.0) is None
    assert pool.held == reserved_next


def test_our_own_initiator_sends_streams_still_held_nothing_their_budget_must_refuse() -> None:
    """Four streams of ours open at once on a peer whose budget has only its reserve free
    (the stages ahead drew the rest) and whose handlers hold them (each waits for its
    buffers): each opens with a probe, which waits for its reader, so no chunk arrives
    uninvited and none breaks; once the budget has room and the handlers read, all bytes
    cross."""
    pool = Ledger(limit=12 * FRAME, reserve=4 * FRAME)
    assert pool.try_take(8 * FRAME)  # the stages ahead
    held: list[tuple[int, str]] = []

    def hold(conn: Connection, event: RequestReceived) -> None:
        conn.hold_request_stream(event.request_id, event.stream_ids[0])
        held.append((event.request_id, event.stream_ids[0]))

    left = connection(prefix="l")
    right = budgeted(pool)
    wire = Wire(left, right, hold)
    payload = {f"s{n}": bytes([n]) * 500 for n in range(4)}  # a chunk frame of ~1.2 KB each
    senders = {}
    for name, data in payload.items():
        senders[name] = left.open_send_stream()
        left.call("echo", {"data": marker(senders[name])}, now=0.0, timeout=60.0)
        left.write(senders[name], data, 0.0)
        left.end_stream(senders[name], 0.0)
    wire.pump(0.0)
    assert len(held) == 4
    assert [right.stream_outcome(stream_id) for _, stream_id in held] == [None] * 4
    pool.give(8 * FRAME)  # the stages ahead are done
    got = {stream_id: bytearray() for _, stream_id in held}
    for request_id, stream_id in held:
        right.receive_request_stream(request_id, stream_id, 0.1)
    for _ in range(10):
        wire.pump(0.1)
        decode_events(right, wire.events[id(right)], 0.1)
        for stream_id, chunks in got.items():
            while isinstance(item := right.take(stream_id, 0.1), bytes):
                chunks += item
    assert got == {senders[name]: data for name, data in payload.items()}
    assert [right.stream_outcome(stream_id) for _, stream_id in held] == [
        StreamEnded(stream_id) for _, stream_id in held
    ]


def decode_events(conn: Connection, events: list[Any], now: float) -> None:
    """Decode the chunks `events` (a `Wire`'s record of `conn`) handed out; forget them."""
    for event in events:
        if isinstance(event, ChunkToDecode):
            conn.settle_chunk(event.stream_id, event.token, event.token.decode(), now)
    events.clear()
