"""`restore-agent status` against a running endpoint: what it fetches, and what it tolerates."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from agent.config import HealthListen
from agent.statusview import fetch, render


@pytest.fixture
async def older_agent() -> AsyncIterator[HealthListen]:
    """An endpoint as an agent from before `/v1/transfers` serves it (127.0.0.1, port 0)."""
    answers = {
        "/readyz": {"ready": True, "reasons": {}, "session": {"state": "connected"}},
        "/v1/restores": {"restores": []},
        "/v1/jobs": {"jobs": []},
    }

    async def answer(request: web.Request) -> web.Response:
        return web.json_response(answers[request.path])

    app = web.Application()
    for path in answers:
        app.router.add_get(path, answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield HealthListen(host="127.0.0.1", port=port)
    finally:
        await runner.cleanup()


async def test_an_agent_without_the_transfers_endpoint_is_still_shown(
    older_agent: HealthListen,
) -> None:
    """An agent still running from before an upgrade answers /v1/transfers 404: the status is
    shown all the same, without its transfers line."""
    data = await asyncio.to_thread(fetch, older_agent)
    assert data["transfers"] is None
    text = render(data, now_ms=0)
    assert text.startswith("agent:    ready\nsession:  connected\nrestores: 0\n")
    assert "transfers:" not in text
