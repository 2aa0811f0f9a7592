"""Helpers shared by the session tests: two `Peer`s over memory, a running `CloudlySession`.

Test modules import from here (conftest.py cannot be imported in importlib mode).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from agent.clock import SYSTEM_CLOCK, Clock
from agent.contracts.base import PassThroughModel
from agent.errors import SessionClosed
from agent.protocol.connection import ConnectionSettings, StreamSettings
from agent.protocol.handlers import RequestContext, Route, Routes
from agent.session.client import CloudlySession
from agent.session.peer import Peer
from agent.watch.status import SessionState, StatusSnapshot
from tests.memory import MemoryTransport, transport_pair

__all__ = ["FAST", "Body", "body_route", "is_connected", "peers", "running"]

FAST = ConnectionSettings(
    streams=StreamSettings(park_timeout=0.05, idle_timeout=0.5, probe_interval=0.005)
)


class Body(PassThroughModel):
    """Any JSON object, kept verbatim: for routes whose shape is not what a test is about."""


def body_route(
    method: str, handler: Callable[[dict[str, Any], RequestContext], Awaitable[dict[str, Any]]]
) -> Route[Body, Body]:
    """A route taking and answering plain objects (`handler(body, ctx) -> body`)."""

    async def handle(request: Body, ctx: RequestContext) -> Body:
        return Body.model_validate(await handler(request.to_wire(), ctx))

    return Route(method, Body, handle)


@asynccontextmanager
async def peers(
    left_routes: Routes,
    right_routes: Routes,
    settings: ConnectionSettings = FAST,
    *,
    stall_timeout: float | None = None,
    clock: Clock = SYSTEM_CLOCK,
) -> AsyncIterator[tuple[Peer, Peer, MemoryTransport, MemoryTransport]]:
    """Two running peers (both with `stall_timeout`, both on `clock`); the connection closes
    on exit and both runs end SessionClosed."""
    ta, tb = transport_pair()
    left, right = (
        Peer(ta, left_routes, settings=settings, stall_timeout=stall_timeout, clock=clock),
        Peer(tb, right_routes, settings=settings, stall_timeout=stall_timeout, clock=clock),
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
