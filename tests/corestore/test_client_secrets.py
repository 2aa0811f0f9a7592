"""The bearer and the grant never reach a log line, an exception text or a rendered traceback."""

from __future__ import annotations

import hashlib
import logging
import traceback
from collections.abc import AsyncIterator
from typing import Any

import pytest
import structlog
from aiohttp import web

from agent.corestore import CorestoreClient, CorestoreTimeouts
from agent.corestore.routes import HEADER_AUTHORIZATION, HEADER_RESTORE_GRANT, RouteName
from agent.corestore.sanitize import MAX_TEXT_LENGTH
from agent.errors import AgentError, CorestoreRefused
from agent.retry import RetryPolicy
from agent.secret import Secret

DUMP = "snap-db-1/dump.bson"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _renderings(exc: BaseException) -> list[str]:
    """Every way an exception becomes text, tracebacks with their local variables included."""
    with_locals = traceback.TracebackException.from_exception(exc, capture_locals=True)
    extracted = structlog.tracebacks.extract(
        type(exc), exc, exc.__traceback__, show_locals=True, locals_max_string=10_000
    )
    return [str(exc), repr(exc), "".join(with_locals.format()), repr(extracted)]


def _assert_clean(texts: list[str], *secrets: Secret) -> None:
    for secret in secrets:
        leaks = [text for text in texts if secret.reveal() in text]
        assert not leaks, f"a secret leaked into: {leaks[0][:300]}"


@pytest.fixture
async def echoing() -> AsyncIterator[str]:
    """A hostile server that answers 409 quoting the Authorization and grant headers it got."""

    async def handler(request: web.Request) -> web.Response:
        headers = request.headers
        quoted = f"{headers.get(HEADER_AUTHORIZATION)} {headers.get(HEADER_RESTORE_GRANT)}"
        message = f"refused {quoted}\n\x1b[2J" + "padding " * 100
        return web.json_response({"error": {"code": "no-way", "message": message}}, status=409)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def test_corestore_text_echoing_the_secrets_is_sanitised(
    echoing: str, bearer: Secret, grant: Secret
) -> None:
    """A server quoting the headers back: the message masks both and stays bounded."""
    async with CorestoreClient(echoing, bearer) as client:
        with pytest.raises(CorestoreRefused, match="409 no-way") as caught:
            await client.delete_resource("restore-1", "mapping-1", grant)
    _assert_clean(_renderings(caught.value), bearer, grant)
    assert len(caught.value.message) < MAX_TEXT_LENGTH + 80
    assert "\n" not in caught.value.message


async def test_no_log_line_or_exception_of_a_failing_session_holds_a_secret(
    world: Any,
    corestore: Any,
    bearer: Secret,
    grant: Secret,
    clock: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """401, 422, 409, 503 retries, resets and timeouts: logs and errors stay free of secrets."""
    caplog.set_level(logging.DEBUG)
    faults = corestore.faults
    failures: list[AgentError] = []
    chunk = b"c" * 4096
    with structlog.testing.capture_logs() as events:
        await world.prepare()
        faults.fail_next(RouteName.OBJECT_PROGRESS, status=503, times=2)
        await world.client.object_progress(world.archive, DUMP, grant)
        calls = [
            lambda c: c.put_chunk(world.archive, DUMP, 0, chunk, _sha(b"x"), grant),  # 422
            lambda c: c.put_chunk(world.archive, DUMP, 8192, chunk, _sha(chunk), grant),  # 409
            lambda c: c.object_progress(world.archive, DUMP, grant),  # reset
            lambda c: c.object_progress(world.archive, DUMP, grant),  # timeout x3
            lambda c: c.verify_resource(world.restore_id, "no-such-mapping", grant),  # 404
        ]
        async with CorestoreClient(
            corestore.url,
            bearer,
            timeouts=CorestoreTimeouts(control=0.2, transfer=0.2),
            retry=RetryPolicy(attempts=3),
            clock=clock,
        ) as client:
            for index, call in enumerate(calls):
                faults.clear()
                if index == 2:
                    faults.reset_next(RouteName.OBJECT_PROGRESS, times=100)
                if index == 3:
                    faults.delay_next(RouteName.OBJECT_PROGRESS, seconds=30, times=3)
                with pytest.raises(AgentError) as caught:
                    await call(client)
                failures.append(caught.value)
        async with CorestoreClient(corestore.url, Secret("wrong-bearer-value")) as intruder:
            with pytest.raises(AgentError) as caught:
                await intruder.object_progress(world.archive, DUMP, grant)
            failures.append(caught.value)
    assert [type(f).__name__ for f in failures] == [
        "IntegrityError",
        "CorestoreRefused",
        "CorestoreUnavailable",
        "CorestoreUnavailable",
        "CorestoreRefused",
        "CorestoreCredentialRejected",
    ]
    assert any(event["event"] == "retrying" for event in events)
    texts = [repr(event) for event in events] + [record.getMessage() for record in caplog.records]
    texts += [text for failure in failures for text in _renderings(failure)]
    _assert_clean(texts, bearer, grant)


async def test_a_client_and_its_requests_print_no_secret(
    client: CorestoreClient, bearer: Secret
) -> None:
    """repr of the client and its credential show no secret."""
    assert bearer.reveal() not in repr(client) + repr(client.credential) + str(client.credential)
