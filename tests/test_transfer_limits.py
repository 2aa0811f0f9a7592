"""`NodeLimits`, synchronously: per-node places (FIFO, no node waits for another) and the
per-node byte rate (a token bucket served in the order reservations were made), time as `now`."""

from __future__ import annotations

import pytest

from agent.errors import InvalidState
from agent.transfers.limits import NodeCounts, NodeLimits, Ticket


def ask(limits: NodeLimits, node: str, name: str, now: float = 0.0) -> tuple[Ticket, bool]:
    return limits.ask(node, "stage", ("restore", name), now)


class TestPlaces:
    def test_a_transfer_moves_at_once_while_its_node_has_a_free_place(self) -> None:
        """Below the limit every ask moves."""
        limits = NodeLimits(2)
        assert ask(limits, "n1", "a")[1] is True
        assert ask(limits, "n1", "b")[1] is True
        assert limits.counts() == {"n1": NodeCounts(moving=2, queued=0)}

    def test_beyond_the_limit_transfers_wait_and_move_in_the_order_they_asked(self) -> None:
        """FIFO: each place that frees goes to the oldest waiting ticket of the node."""
        limits = NodeLimits(1)
        first, _ = ask(limits, "n1", "a")
        waiting = [ask(limits, "n1", name, now=float(i))[0] for i, name in enumerate("bcd")]
        assert [limits.position(t) for t in waiting] == [1, 2, 3]
        order = []
        current = first
        for _ in waiting:
            [started] = limits.leave(current, 10.0)
            order.append(started.subject[1])
            current = started
        assert order == ["b", "c", "d"]

    def test_a_busy_node_does_not_hold_up_another(self) -> None:
        """A long queue on one node leaves another node's places free."""
        limits = NodeLimits(1)
        for name in "abcdef":
            ask(limits, "n1", name)
        ticket, moving = ask(limits, "n2", "x")
        assert moving is True
        assert limits.counts() == {
            "n1": NodeCounts(moving=1, queued=5),
            "n2": NodeCounts(moving=1, queued=0),
        }
        assert limits.leave(ticket, 1.0) == []  # n2's place frees nothing of n1's

    def test_a_waiting_transfer_that_gives_up_leaves_the_queue_and_takes_no_place(self) -> None:
        """Leaving while queued removes the ticket; those behind it move up, none starts."""
        limits = NodeLimits(1)
        first, _ = ask(limits, "n1", "a")
        second, _ = ask(limits, "n1", "b")
        third, _ = ask(limits, "n1", "c")
        assert limits.leave(second, 1.0) == []
        assert limits.position(third) == 1
        assert limits.leave(first, 2.0) == [third]
        assert limits.moving(third)

    def test_leaving_twice_changes_nothing(self) -> None:
        """A second leave of the same ticket frees no second place."""
        limits = NodeLimits(1)
        first, _ = ask(limits, "n1", "a")
        second, _ = ask(limits, "n1", "b")
        third, _ = ask(limits, "n1", "c")
        assert limits.leave(first, 1.0) == [second]
        assert limits.leave(first, 1.0) == []
        assert limits.position(third) == 1

    def test_a_new_transfer_queues_behind_the_waiting_ones(self) -> None:
        """No overtaking: with others queued, a newcomer waits at the end."""
        limits = NodeLimits(1)
        ask(limits, "n1", "a")
        ask(limits, "n1", "b")
        newcomer, moving = ask(limits, "n1", "c")
        assert (moving, limits.position(newcomer)) == (False, 2)

    def test_entries_list_each_nodes_moving_transfers_then_its_queue(self) -> None:
        """What the operator sees: state, place in the queue, since when."""
        limits = NodeLimits(1)
        ask(limits, "n2", "x", now=1.0)
        ask(limits, "n1", "a", now=2.0)
        ask(limits, "n1", "b", now=3.0)
        seen = [
            (e.ticket.node, e.ticket.subject[1], e.state, e.position, e.since)
            for e in limits.entries()
        ]
        assert seen == [
            ("n1", "a", "moving", None, 2.0),
            ("n1", "b", "queued", 1, 3.0),
            ("n2", "x", "moving", None, 1.0),
        ]

    def test_a_node_without_transfers_is_forgotten(self) -> None:
        """Once its last transfer left, a node is not counted (unless it has a rate bucket)."""
        limits = NodeLimits(1)
        ticket, _ = ask(limits, "n1", "a")
        limits.leave(ticket, 1.0)
        assert limits.counts() == {}
        assert limits.entries() == []

    @pytest.mark.parametrize("bad", [0, -1, True])
    def test_the_limit_is_a_positive_integer(self, bad: int) -> None:
        """Zero places, or a boolean, is refused."""
        with pytest.raises(InvalidState, match="max_per_node"):
            NodeLimits(bad)


class TestRate:
    def test_without_a_rate_nothing_waits(self) -> None:
        """No `bytes_per_s`: every reservation is free."""
        limits = NodeLimits(1)
        assert limits.reserve("n1", 10**12, 0.0) == 0.0

    def test_a_node_takes_one_second_of_its_rate_at_once_then_waits(self) -> None:
        """A quiet node's bucket holds one second; past it, each reservation waits for those
        before it."""
        limits = NodeLimits(4, bytes_per_s=100.0)
        assert limits.reserve("n1", 100, 0.0) == 0.0
        assert limits.reserve("n1", 50, 0.0) == pytest.approx(0.5)
        assert limits.reserve("n1", 50, 0.0) == pytest.approx(1.0)

    def test_the_bucket_refills_with_time_up_to_one_second(self) -> None:
        """After a long quiet spell a node may again take one second's worth, no more."""
        limits = NodeLimits(4, bytes_per_s=100.0)
        limits.reserve("n1", 100, 0.0)
        assert limits.reserve("n1", 100, 1.0) == 0.0
        assert limits.reserve("n1", 150, 60.0) == pytest.approx(0.5)

    def test_each_node_has_its_own_rate(self) -> None:
        """One node's debt is not another's."""
        limits = NodeLimits(4, bytes_per_s=100.0)
        limits.reserve("n1", 1000, 0.0)
        assert limits.reserve("n2", 100, 0.0) == 0.0

    def test_transfers_of_a_node_share_its_rate_evenly(self) -> None:
        """Two transfers that each book their next chunk once the last one's wait is over move
        the same bytes (within one chunk and the quiet node's one-second burst, which the first
        to ask takes), and together no more than the rate allows."""
        limits = NodeLimits(4, bytes_per_s=1000.0)
        chunk, horizon = 100, 60.0
        due = {"a": 0.0, "b": 0.0005}  # when each books its next chunk
        moved = {"a": 0, "b": 0}
        while min(due.values()) < horizon:
            name = min(due, key=lambda n: due[n])
            now = due[name]
            due[name] = now + limits.reserve("n1", chunk, now)
            moved[name] += chunk
        assert abs(moved["a"] - moved["b"]) <= chunk + 1000
        assert sum(moved.values()) <= 1000.0 * (horizon + 1) + 2 * chunk

    @pytest.mark.parametrize("bad", [0.0, -5.0])
    def test_the_rate_is_positive(self, bad: float) -> None:
        """A rate of zero or less is refused (None means no rate)."""
        with pytest.raises(InvalidState, match="bytes_per_s"):
            NodeLimits(1, bytes_per_s=bad)
