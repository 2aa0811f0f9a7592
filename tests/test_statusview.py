"""`restore-agent status` against a running endpoint: what it fetches, and what it tolerates."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from agent.config import HealthListen
from agent.watch.statusview import fetch, render


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


_OUTAGE = {
    "ready": False,
    "agent": {"version": "0.1.0", "startedAt": 1_750_000_000_000, "uptimeSeconds": 7320},
    "reasons": {
        "session": "the Cloudly session is backing-off: Cloudly unreachable since ...",
        "keepalive": "other reasons stay",
    },
    "session": {
        "state": "backing-off",
        "stateSince": 1_750_007_318_000,
        "unreachableSince": 1_750_007_200_000,
        "lastConnectedAt": 1_750_000_005_000,
        "failedAttempts": 17,
        "lastError": "could not reach Cloudly: connection refused",
    },
    "restores": [],
    "jobs": [],
    "transfers": None,
}


def test_an_outage_is_shown_with_its_start_length_last_connect_and_attempts() -> None:
    """Two minutes into an outage the session line says since when (not `backing-off for 0
    s`, the state's own age), the last connect, the failed attempts and the last error; the
    session reason is not printed twice."""
    text = render(_OUTAGE, now_ms=1_750_007_320_000)
    assert text.splitlines()[:3] == [
        "agent:    not ready (version 0.1.0, up 2 h)",
        "          keepalive: other reasons stay",
        "session:  backing-off: Cloudly unreachable since 2025-06-15 17:06:40 UTC (2 min), "
        "last connected 2025-06-15 15:06:45 UTC, 17 attempts, last error: could not reach "
        "Cloudly: connection refused",
    ]


def test_a_connected_session_shows_no_outage_even_with_fields_left_over() -> None:
    """`unreachableSince` from a hand-made answer is ignored once the state is connected."""
    data = {**_OUTAGE, "session": {**_OUTAGE["session"], "state": "connected"}}  # type: ignore[dict-item]
    [line] = [
        line
        for line in render(data, now_ms=1_750_007_320_000).splitlines()
        if line.startswith("session:")
    ]
    assert line == "session:  connected"
