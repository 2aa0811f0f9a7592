"""The pass-through baseline of bench/staging.py: the agent's session, a trivial forwarding handler.

Runs `agent.entry.app.run()` — the same composition root, Cloudly session, Peer, stream window and
Corestore client as the agent — with ONE extra route the engine does not use:
`benchForward {archive: <stream>, endpoint, grant, stagingArchiveId, path, size, sha256,
chunkDigests}`. It re-cuts the stream into `[corestore] chunk_size` chunks with the engine's own
`rechunk()` (`agent.transfers.chunking`) and PUTs each to the reference Corestore's chunk route
through `CorestoreClient`,
`max_in_flight` chunks queued between reader and uploader exactly like the engine — but it
hashes nothing (each chunk's sha256 header comes from `chunkDigests`, computed by the bench
before any timing) and persists nothing (no revision store, no routing, no grants check). When
the stream has ended it asks Corestore to commit (Corestore re-hashes the object) and answers
`{bytes, chunks, forwardSeconds, commitSeconds}`, so the bench can report the baseline both
without and with Corestore's commit.

    .venv/bin/python -m bench._staging_passthrough --config agent.toml
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

from agent.config import Config, Secrets, load_config, load_secrets
from agent.contracts.base import StreamMarker, WireModel
from agent.corestore.client import CorestoreClients, CorestoreTimeouts
from agent.corestore.credentials import FixedCredentials
from agent.entry import app
from agent.log import configure_logging
from agent.protocol.handlers import RequestContext, Route, Routes
from agent.retry import RetryPolicy
from agent.secret import Secret
from agent.transfers.chunking import rechunk

__all__ = ["METHOD_FORWARD", "main"]

METHOD_FORWARD = "benchForward"


class ForwardRequest(WireModel):
    """`benchForward`'s request."""

    archive: StreamMarker
    endpoint: str
    grant: str
    staging_archive_id: str
    path: str
    size: int
    sha256: str
    chunk_digests: list[str]


class ForwardResult(WireModel):
    """`benchForward`'s answer."""

    bytes: int
    chunks: int
    forward_seconds: float
    commit_seconds: float


def forward_route(config: Config, secrets: Secrets, clients: CorestoreClients) -> Routes:
    """`benchForward`, over Corestore clients made like the engine's."""
    corestore = config.corestore

    async def forward(body: ForwardRequest, ctx: RequestContext) -> ForwardResult:
        client = clients.client_for("bench-node", body.endpoint)
        grant = Secret(body.grant)
        queue: asyncio.Queue[bytes | None] = asyncio.Queue(maxsize=corestore.max_in_flight)
        sent = chunks = 0

        async def upload() -> None:
            nonlocal sent, chunks
            while (chunk := await queue.get()) is not None:
                digest = body.chunk_digests[chunks]
                await client.put_chunk(
                    body.staging_archive_id, body.path, sent, chunk, digest, grant
                )
                sent += len(chunk)
                chunks += 1

        started = time.perf_counter()
        async with asyncio.TaskGroup() as group:
            group.create_task(upload())
            pieces = rechunk(ctx.receive_stream(body.archive), corestore.chunk_size)
            try:
                async for chunk in pieces:
                    await queue.put(chunk)
            finally:
                await pieces.aclose()
            await queue.put(None)
        forwarded = time.perf_counter()
        await client.commit_object(
            body.staging_archive_id, body.path, body.size, body.sha256, grant
        )
        committed = time.perf_counter()
        return ForwardResult(
            bytes=sent,
            chunks=chunks,
            forward_seconds=forwarded - started,
            commit_seconds=committed - forwarded,
        )

    return Routes([Route(METHOD_FORWARD, ForwardRequest, forward)])


async def serve(config: Config) -> None:
    """The agent, serving `benchForward` too, until SIGTERM/SIGINT."""
    secrets = load_secrets(config)
    assert secrets.corestore_credential is not None, "the bench configures the file source"
    corestore = config.corestore
    clients = CorestoreClients(
        credentials=FixedCredentials(secrets.corestore_credential),
        timeouts=CorestoreTimeouts(
            connect=corestore.connect_timeout_s,
            control=corestore.request_timeout_s,
            transfer=max(corestore.request_timeout_s, 300.0),
        ),
        retry=RetryPolicy(attempts=corestore.retries + 1),
    )
    try:
        routes = forward_route(config, secrets, clients)
        await app.run(config, secrets=secrets, extra_routes=routes)
    finally:
        await clients.close()


def main() -> None:
    """Run the baseline until SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True)
    args = parser.parse_args()
    config = load_config(args.config)
    configure_logging(config.log.format, config.log.level, sys.stderr)
    asyncio.run(serve(config))


if __name__ == "__main__":
    main()
