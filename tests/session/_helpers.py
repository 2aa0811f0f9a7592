"""Helpers shared by the session tests: two `Peer`s over memory, a running `CloudlySession`.

Test modules import from here (conftest.py cannot be imported in importlib mode).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from agent.errors import SessionClosed
from agent.session.client import CloudlySession
from agent.session.peer import Peer, PeerSettings, Router
from agent.status import SessionState, StatusSnapshot
from tests.memory import MemoryTransport, transport_pair

__all__ = ["FAST", "is_connected", "peers", "running"]

FAST = PeerSettings(keepalive_interval=0.05, keepalive_timeout=0.5, backpressure_probe=0.005)


@asynccontextmanager
async def peers(
    left_router: Router, right_router: Router, settings: PeerSettings = FAST
) -> AsyncIterator[tuple[Peer, Peer, MemoryTransport, MemoryTransport]]:
    """Two running peers; the connection closes on exit and both runs end SessionClosed."""
    ta, tb = transport_pair()
    left, right = (
        Peer(ta, left_router, settings=settings),
        Peer(tb, right_router, settings=settings),
    )
    runs = [asyncio.create_task(left.run()), asyncio.create_task(right.run())]
    try:
        yield left, right, ta, tb
    finally:
        ta.close()
        for run in runs:
            with pytest.raises(SessionClosed):
                await run


@asynccontextmanager
async def running(
    session: CloudlySession, drain_timeout: float = 1.0
) -> AsyncIterator[asyncio.Task[None]]:
    """`session.run()` as a task; on exit the session closes and the task is awaited."""
    task = asyncio.create_task(session.run())
    try:
        yield task
    finally:
        async with asyncio.timeout(10):
            await session.close(drain_timeout=drain_timeout)
            await task


def is_connected(snapshot: StatusSnapshot) -> bool:
    return snapshot.state is SessionState.CONNECTED
