"""The connection-wide receive budget: answers that invite a stream's next chunk wait while the
invited bytes of all streams would pass the budget; they go out in turn as invitations are used
up (or expire); a lone stream and answers that invite nothing are never held."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings, strategies as st

from agent.protocol.connection import Connection, ConnectionSettings, StreamSettings
from agent.protocol.envelope import Envelope
from agent.protocol.receive_budget import RATE_SPAN, SIZE_MEMORY, ReceiveBudget
from agent.protocol.round_trip import RTT_SPAN, MinRoundTrip

MiB = 1 << 20


def answer(name: str) -> Envelope:
    return Envelope("##VirtualStream##", None, {"cycleId": name}, is_reply=True)


def names(envelopes: list[Envelope]) -> list[str]:
    return [e.response["cycleId"] for e in envelopes]


class TestBudget:
    def test_a_lone_stream_is_never_held_even_past_the_limit(self) -> None:
        """One invitation is always allowed: a frame larger than the budget still moves."""
        budget = ReceiveBudget(limit=MiB, expiry=1.0)
        budget.arrived("s1", size=4 * MiB, chunk=True)
        assert names(budget.admit("s1", answer("a1"), 0.0)) == ["a1"]

    def test_answers_past_the_limit_wait_and_go_in_the_order_they_came(self) -> None:
        """With two 4 MiB frames invited under an 8 MiB budget, the next two answers wait; each
        used-up invitation lets the oldest waiting one go."""
        budget = ReceiveBudget(limit=8 * MiB, expiry=1.0)
        for stream in ("s1", "s2", "s3", "s4"):
            budget.arrived(stream, size=4 * MiB, chunk=True)
        sent = [names(budget.admit(s, answer(s), 0.0)) for s in ("s1", "s2", "s3", "s4")]
        assert sent == [["s1"], ["s2"], [], []]
        budget.arrived("s2", size=4 * MiB, chunk=True)  # s2's next chunk came
        assert names(budget.release(0.1)) == ["s3"]
        budget.arrived("s1", size=4 * MiB, chunk=True)
        assert names(budget.release(0.2)) == ["s4"]

    def test_a_new_answer_waits_behind_the_held_ones(self) -> None:
        """No overtaking: an answer that would fit still queues after earlier held answers."""
        budget = ReceiveBudget(limit=8 * MiB, expiry=1.0)
        for stream in ("s1", "s2", "s3"):
            budget.arrived(stream, size=4 * MiB, chunk=True)
            budget.admit(stream, answer(stream), 0.0)
        budget.arrived("s1", size=4 * MiB, chunk=True)
        assert names(budget.admit("s1", answer("s1-again"), 0.0)) == ["s3"]
        assert budget.held == 1

    def test_an_unused_invitation_expires(self) -> None:
        """An initiator that sends nothing after its invitation holds budget for `expiry`."""
        budget = ReceiveBudget(limit=4 * MiB, expiry=1.0)
        for stream in ("s1", "s2"):
            budget.arrived(stream, size=4 * MiB, chunk=True)
        budget.admit("s1", answer("s1"), 0.0)
        assert budget.admit("s2", answer("s2"), 0.0) == []
        assert budget.next_deadline() == 1.0
        assert names(budget.release(1.0)) == ["s2"]

    def test_a_stream_that_is_over_lets_its_held_answers_go(self) -> None:
        """A stream that ended or broke invites nothing: its answers go at once and its
        invitation no longer counts."""
        budget = ReceiveBudget(limit=4 * MiB, expiry=1.0)
        for stream in ("s1", "s2", "s3"):
            budget.arrived(stream, size=4 * MiB, chunk=True)
            budget.admit(stream, answer(stream), 0.0)
        assert names(budget.forget("s1", 0.1)) == ["s2"]
        assert names(budget.forget("s3", 0.2)) == ["s3"]

    def test_it_remembers_the_sizes_of_a_bounded_number_of_streams(self) -> None:
        """Streams come and go for ever: only the last `SIZE_MEMORY` sizes are kept, and a
        forgotten stream's next invitation counts the default estimate."""
        budget = ReceiveBudget(limit=8 * MiB, expiry=1.0)
        for number in range(SIZE_MEMORY + 10):
            budget.arrived(f"s{number}", size=3 * MiB, chunk=True)
        assert len(budget._last_size) == SIZE_MEMORY
        budget.admit("s0", answer("s0"), 0.0)
        assert budget.invited_bytes == MiB

    def test_without_a_limit_nothing_waits(self) -> None:
        """`limit=None`: every answer goes at once."""
        budget = ReceiveBudget(limit=None, expiry=1.0)
        for stream in ("s1", "s2", "s3"):
            budget.arrived(stream, size=100 * MiB, chunk=True)
            assert names(budget.admit(stream, answer(stream), 0.0)) == [stream]


def request(body: Any) -> bytes:
    frame = {"method": "echo", "request": body, "response": None}
    return orjson.dumps(frame | {"correlation": {"id": "c1", "phase": "request"}})


def chunk(stream_id: str, cycle_id: str, size: int) -> bytes:
    """A Buffer-form chunk frame of `size` zero bytes (decoded on arrival: small frames)."""
    data = b",".join(b"0" for _ in range(size))
    return (
        b'{"method":"##VirtualStream##","request":{"streamId":"' + stream_id.encode()
        + b'","cycleId":"' + cycle_id.encode()
        + b'","cycle":"request","mainPurpose":"chunk","chunkData":{"type":"Buffer","data":['
        + data + b"]}},\"response\":null}"
    )  # fmt: skip


def keep_alive(stream_id: str, cycle_id: str) -> bytes:
    package = {"streamId": stream_id, "cycleId": cycle_id, "cycle": "request"}
    package |= {"mainPurpose": "keepAlive", "keepAlive": True}
    return orjson.dumps({"method": "##VirtualStream##", "request": package, "response": None})


def answered(conn: Connection) -> list[str]:
    return [orjson.loads(frame)["response"]["cycleId"] for frame in conn.data_to_send()]


def receiving(budget: int, streams: int) -> Connection:
    """A connection handling one request that carries `streams` streams, all being read, with
    a fixed budget (it does not grow with the round trip: these tests are about the turns)."""
    settings = ConnectionSettings(
        streams=StreamSettings(inline_decode_max=10**9),
        receive_budget=budget,
        receive_budget_max=None,
    )
    conn = Connection({"echo"}, settings)
    markers = {f"m{i}": {"_isVirtualStream": True, "streamId": f"s{i}"} for i in range(streams)}
    conn.receive_frame(request(markers), 0.0)
    [event] = conn.events_received()
    for i in range(streams):
        conn.receive_request_stream(event.request_id, f"s{i}", 0.0)  # type: ignore[attr-defined]
    return conn


def four_streams_over_a_link(rtt: float, *, ceiling: int | None, rounds: int = 30) -> float:
    """Four stop-and-wait initiators (typedrequest 3.3.0) sending 4 MiB frames over a link of
    `rtt`: each sends its next chunk as soon as its answer arrives (`rtt` after it went out).
    Simulated for `rounds` round trips under an 8 MiB budget; the frame bytes per second that
    arrived over the last ten."""
    budget = ReceiveBudget(limit=8 * MiB, expiry=rtt + 1.0, ceiling=ceiling)
    streams = ("s1", "s2", "s3", "s4")
    in_flight: list[tuple[float, str]] = []  # (when the chunk arrives, stream)
    arrived: list[float] = []
    now = 0.0
    for stream in streams:  # every stream's first chunk is on its way
        in_flight.append((now + rtt / 2, stream))
    while now < rounds * rtt:
        in_flight.sort()
        now, stream = in_flight.pop(0)
        budget.arrived(stream, size=4 * MiB, chunk=True, now=now)
        arrived.append(now)
        for sent in [*budget.admit(stream, answer(stream), now), *budget.release(now)]:
            in_flight.append((now + rtt, sent.response["cycleId"]))
        if not in_flight:  # every answer held and no invitation out: time passes
            now = min((now + 0.01), now + budget.expiry)
            for sent in budget.release(now):
                in_flight.append((now + rtt, sent.response["cycleId"]))
    window = [t for t in arrived if t > now - 10 * rtt]
    return len(window) * 4 * MiB / (10 * rtt)


class TestBudgetFromTheRoundTrip:
    def test_over_a_far_link_it_grows_until_the_budget_holds_no_stream_back(self) -> None:
        """200 ms away, four 4 MiB streams under an 8 MiB floor: the budget grows with the
        measured bandwidth-delay product, and every stream gets one frame per round trip,
        twice what the fixed 8 MiB allows (two frames per round trip in all)."""
        fixed = four_streams_over_a_link(0.2, ceiling=None)
        sized = four_streams_over_a_link(0.2, ceiling=64 * MiB)
        assert fixed == pytest.approx(2 * 4 * MiB / 0.2, rel=0.15)
        assert sized == pytest.approx(4 * 4 * MiB / 0.2, rel=0.15)

    def test_next_to_cloudly_it_stays_at_its_floor(self) -> None:
        """1 ms away the product is far below 8 MiB: answers are held as before."""
        budget = ReceiveBudget(limit=8 * MiB, expiry=1.0, ceiling=64 * MiB)
        for round_trip in range(20):
            now = round_trip * 0.001
            for stream in ("s1", "s2"):
                budget.admit(stream, answer(stream), now)
                budget.arrived(stream, size=4 * MiB, chunk=True, now=now + 0.001)
        assert budget.limit_at(0.02) == 8 * MiB

    def test_it_never_grows_past_its_ceiling(self) -> None:
        """A fast far link: twice the product is far above the ceiling, which bounds it."""
        budget = ReceiveBudget(limit=8 * MiB, expiry=1.0, ceiling=16 * MiB)
        now = 0.0
        for _ in range(50):
            budget.admit("s1", answer("s1"), now)
            now += 0.2
            budget.arrived("s1", size=64 * MiB, chunk=True, now=now)
        assert budget.limit_at(now) == 16 * MiB

    def test_a_round_trip_that_carries_a_queue_does_not_raise_the_budget(self) -> None:
        """The smallest round trip of the span counts, not a recent one: once frames queue on a
        slow link every later sample carries the queue, and a budget grown from those would grow
        the queue it measures. 1.25 MB/s at 400 ms: twice the product is 1 MB, under the floor."""
        budget = ReceiveBudget(limit=8 * MiB, expiry=10.0, ceiling=64 * MiB)
        budget.round_trip(0.4, 0.0)  # the authentication's calls, on an idle link
        now = 0.0
        for _ in range(100):
            budget.admit("s1", answer("s1"), now)
            now += 3.0  # each 3.7 MB frame waited behind the queue at 1.25 MB/s
            budget.arrived("s1", size=3_750_000, chunk=True, now=now)
        assert budget.limit_at(now) == 8 * MiB

    def test_a_round_trip_told_by_the_connection_counts(self) -> None:
        """Invitations used up 2 s late (the frames queued on the link) at 4 MiB/s: with the
        connection's round trip of 0.2 s (its calls') the budget is 2 x 4 MiB/s x 0.2 s, not
        2 x 4 MiB/s x 2 s."""
        budget = ReceiveBudget(limit=1 * MiB, expiry=10.0, ceiling=64 * MiB)
        now = 0.0
        for _ in range(5):
            budget.admit("s1", answer("s1"), now)
            now += 2.0
            budget.arrived("s1", size=8 * MiB, chunk=True, now=now)
        assert budget.limit_at(now) == int(2 * 4 * MiB * 2.0)
        budget.round_trip(0.2, now)
        assert budget.limit_at(now) == int(2 * 4 * MiB * 0.2)

    def test_while_its_round_trip_is_probed_the_budget_is_a_quarter_of_itself(self) -> None:
        """The smallest round trip (0.2 s) not seen again for a span: until an invitation sent
        since is used up the budget is half the product (2 MiB of 8), so none of the queue it
        invites lies ahead of that one."""
        budget = ReceiveBudget(limit=1 * MiB, expiry=10.0, ceiling=64 * MiB)
        now = 0.0
        for took in [0.2] + [0.4] * 24:  # then every invitation waits behind a queue
            budget.admit("s1", answer("s1"), now)
            now += took
            budget.arrived("s1", size=int(4 * MiB * took / 0.2), chunk=True, now=now)
        assert budget.limit_at(now) == 8 * MiB
        assert budget.limit_at(0.2 + RTT_SPAN + 0.1) == 2 * MiB

    def test_a_round_trip_that_grew_sizes_the_budget_after_its_probe(self) -> None:
        """The round trip grew from 0.2 s to 0.4 s: once an invitation sent in the probe is used
        up, 0.4 s is the smallest, and the budget twice 20 MiB/s times it."""
        budget = ReceiveBudget(limit=1 * MiB, expiry=10.0, ceiling=64 * MiB)
        now = 0.0
        for took in [0.2] + [0.4] * 28:
            budget.admit("s1", answer("s1"), now)
            now += took
            budget.arrived("s1", size=int(4 * MiB * took / 0.2), chunk=True, now=now)
        assert budget.limit_at(now) == pytest.approx(2 * 20 * MiB * 0.4, abs=1)


class TestConnection:
    def test_streams_take_turns_within_the_budget(self) -> None:
        """Budget for about two frames: the third stream's answer waits until the first
        stream's next chunk arrives, then goes; the data is all there to take."""
        frame = len(chunk("s0", "c-0-0", 1000))
        conn = receiving(budget=2 * frame, streams=3)
        for i in range(3):
            conn.receive_frame(chunk(f"s{i}", f"c-{i}-0", 1000), 0.0)
        assert answered(conn) == ["c-0-0", "c-1-0"]
        conn.receive_frame(chunk("s0", "c-0-1", 1000), 0.01)
        assert answered(conn) == ["c-2-0"]
        assert [len(conn.take(f"s{i}", 0.02) or b"") for i in range(3)] == [1000, 1000, 1000]

    def test_keep_alives_are_answered_while_a_chunk_answer_waits(self) -> None:
        """Only answers that invite a chunk wait: a held stream's keep-alive is answered."""
        frame = len(chunk("s0", "c-0-0", 1000))
        conn = receiving(budget=frame, streams=2)
        conn.receive_frame(chunk("s0", "c-0-0", 1000), 0.0)
        conn.receive_frame(chunk("s1", "c-1-0", 1000), 0.0)
        assert answered(conn) == ["c-0-0"]
        conn.receive_frame(keep_alive("s1", "k-1"), 0.1)
        assert answered(conn) == ["k-1"]

    def test_a_held_answer_goes_when_the_invitation_expires(self) -> None:
        """The budget's deadline is the connection's: `advance` past it sends the answer."""
        frame = len(chunk("s0", "c-0-0", 1000))
        conn = receiving(budget=frame, streams=2)
        conn.receive_frame(chunk("s0", "c-0-0", 1000), 0.0)
        conn.receive_frame(chunk("s1", "c-1-0", 1000), 0.0)
        answered(conn)
        deadline = conn.next_deadline()
        assert deadline is not None
        conn.advance(deadline)
        assert answered(conn) == ["c-1-0"]


@settings(max_examples=300)
@given(
    st.lists(
        st.tuples(
            st.floats(0.0, 4.0),  # pause before the next invitation
            st.floats(0.001, 2.0),  # its round trip
            st.integers(1, 8 * MiB),  # the chunk that answers it
        ),
        max_size=40,
    )
)
def test_the_budget_follows_the_largest_rate_of_the_span(
    cycles: list[tuple[float, float, int]],
) -> None:
    """Whatever the rates and pauses, the budget is twice the smallest round trip (as
    `MinRoundTrip` keeps it, tested on its own) times the largest delivery rate seen in the last
    `RATE_SPAN` seconds (a quarter of that while the round trip is probed), within its floor and
    ceiling (only the samples that can still be the largest are kept)."""
    budget = ReceiveBudget(limit=MiB, expiry=100.0, ceiling=1 << 40)
    now, samples, smallest = 0.0, [], MinRoundTrip()
    for pause, took, size in cycles:
        sent = now = now + pause
        budget.admit("s1", answer("a"), now)
        now += took
        budget.arrived("s1", size=size, chunk=True, now=now)
        samples.append((now, size / (now - sent)))
        smallest.sample(now - sent, now)
        rtt, quarter = smallest.value, 4 if smallest.probing(now) else 1
        recent = [rate for when, rate in samples if when > now - RATE_SPAN]
        want = MiB if rtt is None or not recent else int(max(MiB, 2 * max(recent) * rtt / quarter))
        assert budget.limit_at(now) == want
