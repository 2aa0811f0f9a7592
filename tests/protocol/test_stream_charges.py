"""What each stream we receive on holds of the byte budget: a reservation for the frame an
answer invites, a frame's draw beyond it, room for decoded bytes while a chunk is decoded, the
chunk its reader took last, the whole draw of a frame waiting its turn; the rest goes back as
the stream holds less, and everything once the stream is gone."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings, strategies as st

from agent.protocol.stream_charges import StreamCharges, frame_need, no_room_reason

FIRST = 4000  # what the first reservation assumes (its need: 7000)


class Pool:
    """A `BytePool` of `limit` bytes that keeps what it was asked."""

    def __init__(self, limit: int = 1 << 30, reserve: int = 0) -> None:
        self.limit = limit
        self.reserve = reserve
        self.held = 0
        self.keeps: list[int] = []
        self.given: list[int] = []

    def try_take(self, size: int, *, keep: int = 0) -> bool:
        self.keeps.append(keep)
        if self.held + size + keep > self.limit:
            return False
        self.held += size
        return True

    def give(self, size: int) -> None:
        assert 0 < size <= self.held
        self.held -= size
        self.given.append(size)


@dataclass
class Stream:
    """A `Holding`: what a stream's queue holds, as the stream would say it."""

    stream_id: str = "s1"
    done: bool = False
    waiting: int = 0
    queued_bytes: int = 0


def charges(pool: Pool) -> StreamCharges:
    return StreamCharges(pool, FIRST)


def test_a_chunk_frame_needs_seven_quarters_of_its_size() -> None:
    """The frame, and room for its decoded bytes beside it while it is decoded."""
    assert frame_need(4000) == 7000


def test_the_first_reservation_assumes_the_first_frame_size() -> None:
    pool = Pool()
    assert charges(pool).reserve("s1")
    assert pool.held == frame_need(FIRST)


def test_a_reservation_assumes_a_quarter_above_the_largest_frame_seen() -> None:
    pool = Pool()
    ledger = charges(pool)
    assert ledger.draw("s1", 800)
    assert ledger.reserve("s2")
    assert ledger.charged("s2") == frame_need(1000)


def test_a_reservation_never_assumes_more_than_the_first_frame_size() -> None:
    pool = Pool()
    ledger = charges(pool)
    assert ledger.draw("s1", 2 * FIRST)
    assert ledger.reserve("s2")
    assert ledger.charged("s2") == frame_need(FIRST)


def test_a_reservation_never_assumes_more_than_the_budgets_reserve() -> None:
    """Before any frame was seen (the first frame assumed as large as the session accepts),
    a reservation within the reserve, which every other draw leaves free: one larger could wait
    for ever behind transfers holding buffers while they wait for it."""
    pool = Pool(limit=12_000, reserve=3000)
    assert pool.try_take(9000, keep=3000)  # a stage's buffers, its reserve left free
    ledger = charges(pool)
    ledger.reading("s1")  # the stage reads its stream
    assert ledger.reserve("s1")
    assert ledger.charged("s1") == 3000


def test_a_stream_holds_one_reservation_at_a_time() -> None:
    """A second answer while the invited frame is out draws nothing more."""
    pool = Pool()
    ledger = charges(pool)
    assert ledger.reserve("s1")
    assert ledger.reserve("s1")
    assert pool.held == frame_need(FIRST)


def test_a_reservation_the_budget_has_no_room_for_draws_nothing() -> None:
    pool = Pool(limit=frame_need(FIRST) - 1)
    ledger = charges(pool)
    assert not ledger.reserve("s1")
    assert (pool.held, ledger.charged("s1")) == (0, 0)


def test_a_stream_nobody_reads_yet_leaves_the_reserve_free() -> None:
    pool = Pool(reserve=500)
    charges(pool).reserve("s1")
    assert pool.keeps == [500]


def test_a_stream_whose_reader_reads_may_draw_on_the_reserve() -> None:
    pool = Pool(reserve=500)
    ledger = charges(pool)
    ledger.reading("s1")
    ledger.reserve("s1")
    assert pool.keeps == [0]


def test_an_invited_frame_draws_only_what_it_needs_beyond_its_reservation() -> None:
    pool = Pool()
    ledger = charges(pool)
    ledger.draw("s1", 1000)  # the largest seen: the next reservation assumes 1250 bytes
    ledger.reserve("s1")
    before = pool.held
    assert ledger.draw("s1", 2000)
    assert pool.held - before == frame_need(2000) - frame_need(1250)


def test_a_frame_nobody_invited_is_drawn_for_at_once() -> None:
    pool = Pool()
    assert charges(pool).draw("s1", 1000)
    assert pool.held == frame_need(1000)


def test_a_frame_the_budget_has_no_room_for_draws_nothing() -> None:
    pool = Pool(limit=frame_need(1000) - 1)
    ledger = charges(pool)
    assert not ledger.draw("s1", 1000)
    assert (pool.held, ledger.charged("s1")) == (0, 0)


def test_a_frame_that_does_not_fit_still_uses_up_the_reservation() -> None:
    """The stream breaks then: once it says it is over, its reservation goes back."""
    pool = Pool(limit=frame_need(FIRST))
    ledger = charges(pool)
    ledger.reserve("s1")
    assert not ledger.draw("s1", 2 * FIRST)
    ledger.settle(Stream(done=True))
    assert pool.held == 0


def test_the_reason_a_stream_breaks_names_the_frame_and_the_budget() -> None:
    assert no_room_reason(1234) == (
        "a chunk frame of 1234 bytes came that the agent's byte budget had no room for: the "
        "peer sent more than it was invited to"
    )


def test_a_queued_frame_holds_what_the_stream_queues_and_gives_back_the_rest() -> None:
    pool = Pool()
    ledger = charges(pool)
    ledger.draw("s1", 1000)
    ledger.settle(Stream(queued_bytes=1000))
    assert pool.held == 1000


def test_a_chunk_being_decoded_keeps_room_for_its_decoded_bytes() -> None:
    """Three quarters of its frame beside the frame itself, until it is decoded."""
    pool = Pool()
    ledger = charges(pool)
    ledger.draw("s1", 1000)
    ledger.decoding("s1", 1000)
    ledger.settle(Stream(queued_bytes=1000))
    assert pool.held == 1750
    ledger.decoded("s1", 1000)
    ledger.settle(Stream(queued_bytes=500))  # decoded: its bytes are queued now
    assert pool.held == 500


def test_a_taken_chunk_stays_drawn_until_its_reader_takes_the_next() -> None:
    pool = Pool()
    ledger = charges(pool)
    ledger.draw("s1", 1000)
    ledger.took("s1", 500)
    ledger.settle(Stream(queued_bytes=0))
    assert pool.held == 500
    ledger.took("s1", 0)
    ledger.settle(Stream(queued_bytes=0))
    assert pool.held == 0


def test_a_frame_waiting_behind_a_chunk_being_decoded_keeps_its_whole_draw() -> None:
    pool = Pool()
    ledger = charges(pool)
    ledger.draw("s1", 1000)
    ledger.wait("s1", 1000)
    ledger.settle(Stream(waiting=1))
    assert pool.held == frame_need(1000)
    ledger.settle(Stream(waiting=0, queued_bytes=1000))  # answered: it is in the queue now
    assert pool.held == 1000


def test_a_stream_that_is_over_gives_back_its_reservation() -> None:
    pool = Pool()
    ledger = charges(pool)
    ledger.reserve("s1")
    ledger.settle(Stream())
    assert pool.held == frame_need(FIRST)
    ledger.settle(Stream(done=True))
    assert pool.held == 0


def test_a_stream_never_drawn_for_gives_nothing_back() -> None:
    pool = Pool()
    charges(pool).settle(Stream(done=True))
    assert pool.given == []


def test_a_stream_that_is_gone_gives_back_everything_it_held() -> None:
    pool = Pool()
    ledger = charges(pool)
    ledger.draw("s1", 1000)
    ledger.reserve("s1")
    ledger.forget("s1")
    assert (pool.held, ledger.charged("s1")) == (0, 0)


def test_only_the_streams_no_longer_registered_are_forgotten() -> None:
    pool = Pool()
    ledger = charges(pool)
    ledger.draw("s1", 1000)
    ledger.draw("s2", 2000)
    ledger.keep_only({"s2"})
    assert (ledger.charged("s1"), ledger.charged("s2")) == (0, frame_need(2000))


def test_streams_that_go_give_back_in_the_order_they_first_drew() -> None:
    pool = Pool()
    ledger = charges(pool)
    ledger.reading("s2")  # read first, drawn for second: the draw decides the order
    ledger.draw("s1", 1000)
    ledger.draw("s2", 2000)
    ledger.keep_only(set())
    assert pool.given == [frame_need(1000), frame_need(2000)]


def test_a_forgotten_stream_id_used_again_is_not_read_yet() -> None:
    """The reader's mark goes with its stream: a new stream of the same id leaves the reserve
    free until its own reader reads."""
    pool = Pool(reserve=500)
    ledger = charges(pool)
    ledger.reading("s1")
    ledger.keep_only(set())
    ledger.reserve("s1")
    assert pool.keeps == [500]


def test_a_closed_connection_gives_back_every_streams_draws() -> None:
    pool = Pool()
    ledger = charges(pool)
    ledger.draw("s1", 1000)
    ledger.reserve("s2")
    ledger.clear()
    assert pool.held == 0


_STEPS = st.lists(
    st.tuples(
        st.sampled_from(["reserve", "draw", "wait", "decoding", "decoded", "took", "settle"]),
        st.sampled_from(["s1", "s2"]),
        st.integers(min_value=0, max_value=5000),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(_STEPS, st.integers(min_value=0, max_value=40_000))
def test_nothing_is_given_back_twice_and_every_byte_comes_back_in_the_end(
    steps: list[tuple[str, str, int]], limit: int
) -> None:
    """Whatever happens in whatever order, no give passes what is drawn (the pool checks),
    what the streams are charged is what the pool holds, and a closed connection holds
    nothing."""
    pool = Pool(limit=limit)
    ledger = charges(pool)
    for action, stream_id, size in steps:
        if action == "reserve":
            ledger.reserve(stream_id)
        elif action == "draw":
            ledger.draw(stream_id, size)
        elif action == "settle":
            ledger.settle(Stream(stream_id, done=size % 3 == 0, queued_bytes=size))
        else:
            getattr(ledger, action)(stream_id, size)
        assert ledger.charged("s1") + ledger.charged("s2") == pool.held
    ledger.clear()
    assert pool.held == 0
