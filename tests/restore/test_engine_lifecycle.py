"""The engine runs only as `await engine.owner.run()` in its caller's TaskGroup and ends on
`engine.owner.close()`.

Whether it takes work shows on a request: an execute of a restore that does not exist is
`restore-not-found` while the engine runs, and `shutting-down` before it runs and after close.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agent.contracts.isolatedrestore import ExecuteIsolatedRestoreRequest
from agent.errors import InvalidState, RestoreNotFound, ShuttingDown
from agent.restore.engine import IsolatedRestoreEngine


def _engine(world: Any) -> IsolatedRestoreEngine:
    """Another engine on the world's store and Corestore clients (the world's own keeps running)."""
    return IsolatedRestoreEngine(
        store=world.store,
        clients=world.clients,
        cluster_view=world.view,
        settings=world.settings,
    )


async def _takes_work(engine: IsolatedRestoreEngine, world: Any) -> bool:
    request = ExecuteIsolatedRestoreRequest.from_wire(world.execute_body(2))
    try:
        await engine.execute(request)
    except RestoreNotFound:
        return True
    except ShuttingDown:
        return False
    raise AssertionError("an execute of no restore neither ran nor was refused")


async def test_close_ends_run_inside_the_callers_task_group(world: Any) -> None:
    """run() takes work once started; close() makes it return, so the TaskGroup ends too."""
    engine = _engine(world)
    assert not await _takes_work(engine, world)
    async with asyncio.TaskGroup() as group:
        run = group.create_task(engine.owner.run())
        await engine.owner.started()
        assert await _takes_work(engine, world)
        await engine.owner.close(timeout=5)
    assert run.result() is None
    assert not await _takes_work(engine, world)


async def test_the_engine_runs_once(world: Any) -> None:
    """A second run() is a bug: InvalidState, and the first run goes on taking work."""
    engine = _engine(world)
    async with asyncio.TaskGroup() as group:
        group.create_task(engine.owner.run())
        await engine.owner.started()
        with pytest.raises(InvalidState):
            await engine.owner.run()
        assert await _takes_work(engine, world)
        await engine.owner.close(timeout=5)


async def test_an_engine_closed_before_it_ran_takes_no_work(world: Any) -> None:
    """close() before run(): run() returns at once and nothing is ever accepted."""
    engine = _engine(world)
    await engine.owner.close(timeout=5)
    async with asyncio.timeout(5):
        await engine.owner.run()
    assert not await _takes_work(engine, world)


async def test_the_engine_offers_no_context_manager_of_its_own(world: Any) -> None:
    """No `async with engine` (nor with its work owner): its one owner is the TaskGroup that
    awaits `owner.run()`."""
    for owner in (world.engine, world.engine.owner):
        assert not hasattr(owner, "__aenter__")
        assert not hasattr(owner, "__aexit__")
