"""The session's lifecycle table (every state against every event), what the status shows of
it, and the session holding to it: an illegal move raises and changes nothing."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent.errors import CallFailed, InvalidState
from agent.secret import Secret
from agent.session.client import CloudlySession, SessionSettings
from agent.session.lifecycle import (
    INTAKE_STOPPED,
    LIFECYCLE_TABLE,
    PUBLISHED,
    Lifecycle,
    LifecycleEvent,
)
from agent.watch.sessionstate import TRANSITIONS as STATUS_MOVES
from agent.watch.status import AgentStatus, SessionState
from devstack.cloudly import StandInCloudly, cluster_document
from tests.session._helpers import is_connected, running

MOVES = LIFECYCLE_TABLE.moves
DOCS = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
EVERY_PAIR = list(itertools.product(Lifecycle, LifecycleEvent))
TOKEN = "machine-token-5b0c7e19d2a84f36"


def _id(pair: tuple[Lifecycle, LifecycleEvent]) -> str:
    return f"{pair[0].value}-{pair[1].value}"


@pytest.mark.parametrize("pair", [p for p in EVERY_PAIR if p not in MOVES], ids=_id)
def test_an_illegal_move_raises_invalid_state(pair: tuple[Lifecycle, LifecycleEvent]) -> None:
    """Every move the table does not list is `InvalidState`, naming the event and the state."""
    state, event = pair
    with pytest.raises(InvalidState, match=f"session: {event.value} is illegal in {state.value}"):
        LIFECYCLE_TABLE.next(state, event, subject="the session")


def test_stopped_is_the_only_state_nothing_leaves() -> None:
    """Every event legal in `stopped` keeps it there; every other state has a way out."""
    onward = {state for (state, _), to in MOVES.items() if to is not state}
    assert set(Lifecycle) - onward == {Lifecycle.STOPPED}


def test_run_is_legal_only_before_the_session_ran() -> None:
    """`run()` starts from `idle` (or `drained`, intake stopped before it): never twice."""
    assert {state for state, event in MOVES if event is LifecycleEvent.RUN} == {
        Lifecycle.IDLE,
        Lifecycle.DRAINED,
    }


def test_once_intake_stopped_no_move_opens_it_again() -> None:
    """From a state with intake stopped, every legal move stays in one: no reconnect, no new
    request, until `stopped`."""
    leaks = {
        (state, event): to
        for (state, event), to in MOVES.items()
        if state in INTAKE_STOPPED and to not in INTAKE_STOPPED
    }
    assert leaks == {}


def test_the_status_shows_draining_from_stop_intake_until_stopped() -> None:
    """Every state with intake stopped but `stopped` itself is shown as `draining`."""
    shown = {PUBLISHED[state] for state in INTAKE_STOPPED - {Lifecycle.STOPPED}}
    assert shown == {SessionState.DRAINING}


@pytest.mark.parametrize("pair", list(MOVES), ids=_id)
def test_every_move_is_one_the_status_may_make(pair: tuple[Lifecycle, LifecycleEvent]) -> None:
    """What the status shows moves only as the status's own table allows (or stays)."""
    before, after = PUBLISHED[pair[0]], PUBLISHED[MOVES[pair]]
    assert after is before or after in STATUS_MOVES[before]


def test_docs_embed_the_rendered_table() -> None:
    """docs/architecture.md shows the table exactly as the code renders it."""
    assert LIFECYCLE_TABLE.render() in DOCS.read_text(encoding="utf-8")


# --- the session holds to it --------------------------------------------------------------------


@pytest.fixture
async def cloudly() -> AsyncIterator[StandInCloudly]:
    async with StandInCloudly(token=TOKEN, cluster=cluster_document("cluster-1", {})) as server:
        yield server


def _session(cloudly: StandInCloudly, status: AgentStatus) -> CloudlySession:
    settings = SessionSettings(
        url=cloudly.url,
        tag_name="restore-agent",
        tag_payload={"role": "relay"},
        max_frame_bytes=2**20,
        close_timeout=2.0,
    )
    return CloudlySession(settings, Secret(TOKEN), status, rng=lambda: 0.0)


async def test_run_while_running_raises_and_the_session_stays_connected(
    cloudly: StandInCloudly,
) -> None:
    """A second `run()` is refused at once; the running session is still connected, and its
    connection still answers."""
    status = AgentStatus()
    session = _session(cloudly, status)
    async with running(session):
        await status.wait_until(is_connected)
        with pytest.raises(InvalidState, match="run is illegal in connected"):
            await session.run()
        assert status.snapshot().state is SessionState.CONNECTED
        with pytest.raises(CallFailed) as answered:
            await session.call("noSuchMethod", {}, timeout=5.0)
    assert answered.value.error_data["code"] == "unknown-method"


async def test_close_before_run_stops_and_a_later_run_raises(cloudly: StandInCloudly) -> None:
    """`close()` on a session that never ran returns at once, `stopped`; `run()` then raises
    and the state stays `stopped`."""
    status = AgentStatus()
    session = _session(cloudly, status)
    await session.close(drain_timeout=0.0)
    assert status.snapshot().state is SessionState.STOPPED
    with pytest.raises(InvalidState, match="run is illegal in stopped"):
        await session.run()
    assert status.snapshot().state is SessionState.STOPPED


async def test_run_after_stop_intake_ends_at_once_stopped(cloudly: StandInCloudly) -> None:
    """Intake stopped before `run()`: the status says `draining`, and `run()` returns without
    connecting, `stopped`."""
    status = AgentStatus()
    session = _session(cloudly, status)
    session.stop_intake()
    draining = status.snapshot().state
    await session.run()
    assert draining is SessionState.DRAINING
    assert status.snapshot().state is SessionState.STOPPED
    assert cloudly.events == []
