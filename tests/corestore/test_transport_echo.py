"""Transport failures whose text echoes a request header: the grant is masked like the bearer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from agent.corestore import CorestoreClient
from agent.corestore.routes import HEADER_RESTORE_GRANT
from agent.errors import CorestoreUnavailable
from agent.retry import RetryPolicy
from agent.secret import Secret

# Parts shorter than any JWS header, so no secret-shaped pattern can mask it by luck.
SHORT_GRANT = Secret("grnt.s3cr.etv4")


@pytest.fixture
async def status_line_echo() -> AsyncIterator[str]:
    """A broken server that puts the grant header it got into a malformed status line."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        prefix = HEADER_RESTORE_GRANT.lower() + ":"
        echoed = next(
            (line.split(":", 1)[1].strip() for line in head.split("\r\n")
             if line.lower().startswith(prefix)),
            "",
        )  # fmt: skip
        writer.write(f"HTTP/1.1 {echoed}\r\nContent-Length: 0\r\n\r\n".encode())
        await writer.drain()
        writer.close()
        await writer.wait_closed()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()


async def test_a_transport_error_echoing_the_grant_does_not_quote_it(status_line_echo: str) -> None:
    """aiohttp's parser error quotes the bad line; the CorestoreUnavailable text masks the grant."""
    async with CorestoreClient(
        status_line_echo, Secret("bearer-value-0a1b2c3d"), retry=RetryPolicy(attempts=1)
    ) as client:
        with pytest.raises(CorestoreUnavailable) as caught:
            await client.object_progress("archive-1", "snap/dump.bson", SHORT_GRANT)
    assert "ClientResponseError" in caught.value.message
    assert SHORT_GRANT.reveal() not in caught.value.message
