"""The reference Corestore enforces the documented rules for any HTTP client, not just ours."""

from __future__ import annotations

import asyncio
import hashlib
import io
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from agent.corestore import CorestoreClient
from agent.corestore.routes import HEADER_CHUNK_SHA256, HEADER_RESTORE_GRANT
from agent.corestore.shapes import MAX_CHUNK_SIZE
from agent.secret import Secret
from devstack.corestore import start

DUMP = "snap-db-1/dump.bson"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    """A plain HTTP client: sends exactly the headers a test gives."""
    async with aiohttp.ClientSession() as session:
        yield session


def _chunk_url(world: Any) -> str:
    return f"{world.corestore.url}/v1/staging-archives/{world.archive}/objects"


async def _put(
    http: aiohttp.ClientSession, world: Any, headers: dict[str, str], data: bytes = b"data"
) -> tuple[int, Any, Any]:
    async with http.put(
        _chunk_url(world),
        params={"path": DUMP, "offset": "0"},
        data=io.BytesIO(data),
        headers=headers,
    ) as response:
        return response.status, await response.json(), response.headers


async def test_a_request_without_bearer_is_401_and_writes_nothing(
    world: Any, http: aiohttp.ClientSession, grant: Secret
) -> None:
    """No Authorization header: 401 with a JSON error and a Bearer challenge; no file."""
    await world.prepare()
    status, body, headers = await _put(
        http, world, {HEADER_RESTORE_GRANT: grant.reveal(), HEADER_CHUNK_SHA256: _sha(b"data")}
    )
    assert (status, body["error"]["code"]) == (401, "unauthorized")
    assert headers["WWW-Authenticate"].startswith("Bearer")
    assert not world.staged_file(DUMP).exists()


@pytest.mark.parametrize(
    ("grant_header", "code"),
    [(None, "grant-missing"), ("not-a-jws", "grant-malformed"), ("a.b.", "grant-malformed")],
)
async def test_a_request_without_a_well_formed_grant_is_403(
    world: Any, http: aiohttp.ClientSession, bearer: Secret, grant_header: str | None, code: str
) -> None:
    """The grant must be present and shaped like a compact JWS; nothing is written otherwise."""
    await world.prepare()
    headers = {"Authorization": f"Bearer {bearer.reveal()}", HEADER_CHUNK_SHA256: _sha(b"data")}
    if grant_header is not None:
        headers[HEADER_RESTORE_GRANT] = grant_header
    status, body, _ = await _put(http, world, headers)
    assert (status, body["error"]["code"]) == (403, code)
    assert not world.staged_file(DUMP).exists()


async def test_health_needs_no_credential(world: Any, http: aiohttp.ClientSession) -> None:
    """GET /health answers without any header."""
    async with http.get(f"{world.corestore.url}/health") as response:
        assert (response.status, await response.json()) == (200, {"status": "ok"})


async def test_a_chunk_without_its_digest_header_is_400(
    world: Any, http: aiohttp.ClientSession, bearer: Secret, grant: Secret
) -> None:
    """The per-chunk sha256 header is mandatory."""
    await world.prepare()
    headers = {"Authorization": f"Bearer {bearer.reveal()}", HEADER_RESTORE_GRANT: grant.reveal()}
    status, body, _ = await _put(http, world, headers)
    assert (status, body["error"]["code"]) == (400, "invalid-request")


async def test_a_chunk_over_16_mib_is_413_and_not_read(
    world: Any, http: aiohttp.ClientSession, bearer: Secret, grant: Secret
) -> None:
    """The chunk cap is enforced from Content-Length."""
    await world.prepare({DUMP: bytes(MAX_CHUNK_SIZE + 1)})
    data = bytes(MAX_CHUNK_SIZE + 1)
    headers = {
        "Authorization": f"Bearer {bearer.reveal()}",
        HEADER_RESTORE_GRANT: grant.reveal(),
        HEADER_CHUNK_SHA256: _sha(data),
    }
    status, body, _ = await _put(http, world, headers, data)
    assert (status, body["error"]["code"]) == (413, "chunk-too-large")
    assert not world.staged_file(DUMP).exists()


async def test_staged_bytes_survive_a_restart(world: Any, bearer: Secret) -> None:
    """Verified chunks are on disk: a new server on the same directory resumes from them."""
    await world.prepare()
    await world.stage(DUMP, commit=False)
    await world.corestore.stop()
    async with (
        await start(data_dir=world.corestore.data_dir, bearer=bearer) as again,
        CorestoreClient(again.url, bearer) as client,
    ):
        progress = await client.object_progress(world.archive, DUMP, world.grant)
    assert (progress.state, progress.verified_bytes) == ("partial", len(world.objects[DUMP]))


async def test_a_restore_cut_by_a_restart_reads_interrupted_and_can_run_again(
    world: Any, bearer: Secret
) -> None:
    """A `running` restore no live run owns is failed/restore-interrupted; it can run again."""
    await world.prepare()
    await world.stage_all()
    world.corestore.faults.hold_restores()
    await world.client.restore_resource(world.restore_id, world.mapping_id, world.grant)
    await world.corestore.stop()
    async with (
        await start(data_dir=world.corestore.data_dir, bearer=bearer) as again,
        CorestoreClient(again.url, bearer) as client,
    ):
        status = await client.resource_restore_status(
            world.restore_id, world.mapping_id, world.grant
        )
        done = await client.wait_resource_restored(
            world.restore_id, world.mapping_id, world.grant, poll_interval=0.01
        )
    assert (status.state, status.error and status.error.code) == ("failed", "restore-interrupted")
    assert done.state == "succeeded"


async def test_a_held_prepare_is_counted_and_answered_only_after_release(world: Any) -> None:
    """hold_prepares(): the request arrives (prepare_held), waits unanswered, and is handled
    once released: the restore exists only then."""
    faults = world.corestore.faults
    faults.hold_prepares()
    prepare = asyncio.create_task(world.prepare())
    await faults.prepare_held.wait()
    assert faults.hits["prepare-restore"] == 1
    assert not prepare.done()
    assert not (world.corestore.data_dir / "restores" / f"{world.restore_id}.json").exists()
    faults.release_prepares()
    await prepare
    assert (world.corestore.data_dir / "restores" / f"{world.restore_id}.json").exists()
