"""The relay duties end to end through the real session: the real agent (in-process), the
stand-in Cloudly and the reference Corestore.

A service's database goes to Cloudly as a closure when the service is backed up, and comes back
into a fresh database when it is restored: byte-identical (sha256), for closures of 0 and 1
byte, exactly one chunk, one chunk + 1 byte (the agent's chunk is 64 KiB here), 2 MiB + 1 (the
stand-in's 1 MiB stream pieces each span many chunks), and 512 MiB.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import aiohttp
import pytest

from devstack.corestore.storage import sha256_file

CLUSTER, NODE = "cluster-e2e", "node-e2e"
SERVICE = {"id": "svc-app", "data": {"name": "app", "image": "app:1"}}
KiB, MiB = 1024, 1024 * 1024
CHUNK = 64 * KiB  # the stack's [corestore] chunk_size


def _pattern(size: int, seed: bytes = b"closure") -> bytes:
    return hashlib.shake_256(seed).digest(size) if size else b""


async def _backup(stack: Any, backup_id: str, **extra: Any) -> dict[str, Any]:
    request = {"nodeId": NODE, "backupId": backup_id, "service": SERVICE, **extra}
    return await stack.cloudly.call_agent("backupClusterService", request, timeout=120)


async def _restore(stack: Any, backup_id: str, snapshots: list[Any], **extra: Any) -> Any:
    request = {
        "nodeId": NODE,
        "backupId": backup_id,
        "service": SERVICE,
        "snapshots": snapshots,
        **extra,
    }
    return await stack.cloudly.call_agent("restoreClusterService", request, timeout=120)


@pytest.mark.parametrize(
    "size",
    [0, 1, CHUNK, CHUNK + 1, 2 * MiB + 1],
    ids=["0B", "1B", "1chunk", "1chunk+1", "stream-pieces-over-chunks"],
)
async def test_a_backed_up_closure_restores_into_a_fresh_database_byte_identical(
    stack: Any, size: int
) -> None:
    """Backup sends the database closure to Cloudly; restore brings exactly those bytes back
    into a database that was dropped meanwhile."""
    services = stack.corestore.services
    original = _pattern(size)
    services.write_database("svc-app", [original])
    async with stack.agent():
        backup = await _backup(stack, "bk-1")
        held = stack.cloudly.closures[("bk-1", "svc-app")]
        assert (held.size, held.sha256) == (size, hashlib.sha256(original).hexdigest())
        services.database_path("svc-app").unlink()  # a fresh, empty node
        restored = await _restore(stack, "bk-1", backup["snapshots"])
    assert restored == {"restored": backup["snapshots"]}
    assert services.database_path("svc-app").read_bytes() == original
    assert services.open_imports() == []


@pytest.mark.slow
@pytest.mark.parametrize("chunk_form", ["base64"])
async def test_a_512_mib_closure_goes_to_cloudly_and_back_byte_identical(
    stack: Any, chunk_form: str
) -> None:
    """512 MiB: backup to the stand-in Cloudly, restore into a fresh database, same sha256
    (4 MiB chunks, the production default; base64 chunks between our own peers)."""
    del chunk_form  # the stack's stand-in Cloudly already speaks it
    services = stack.corestore.services
    size = 512 * MiB
    digest = hashlib.sha256()

    def pieces() -> Any:
        for index in range(size // (8 * MiB)):
            piece = hashlib.shake_256(b"big %d" % index).digest(8 * MiB)
            digest.update(piece)
            yield piece

    services.write_database("svc-app", pieces())
    expected = digest.hexdigest()
    async with stack.agent(chunk_size=4 * MiB, streams={"chunk_form": "base64"}):
        backup = await _backup(stack, "bk-big")
        assert stack.cloudly.closures[("bk-big", "svc-app")].sha256 == expected
        services.database_path("svc-app").unlink()
        restored = await _restore(stack, "bk-big", backup["snapshots"])
    assert restored == {"restored": backup["snapshots"]}
    size_on_disk, sha_on_disk = sha256_file(services.database_path("svc-app"))
    assert (size_on_disk, sha_on_disk) == (size, expected)


async def test_the_health_endpoint_lists_each_relay_job_without_the_service(stack: Any) -> None:
    """/v1/jobs: one row per job key (kind, status, revision, the restored types, partial or
    not); the service document never appears in it."""
    services = stack.corestore.services
    services.write_database("svc-app", [_pattern(1000)])
    async with stack.agent():
        backup = await _backup(stack, "bk-jobs")
        await _restore(stack, "bk-jobs", backup["snapshots"])
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"http://{stack.health}/v1/jobs") as answer,
        ):
            status, body = answer.status, await answer.text()
    rows = {row["kind"]: row for row in json.loads(body)["jobs"]}
    assert status == 200
    assert set(rows) == {"backup", "restore"}
    for kind, row in rows.items():
        assert (row["clusterId"], row["nodeId"], row["backupId"], row["serviceId"]) == (
            CLUSTER,
            NODE,
            "bk-jobs",
            "svc-app",
        ), kind
        assert (row["status"], row["errorCode"]) == ("succeeded", None), kind
    restored_types = sorted({snapshot["type"] for snapshot in backup["snapshots"]})
    assert sorted(rows["restore"]["resourceTypes"]) == restored_types
    assert rows["restore"]["partial"] is False
    assert "app:1" not in body  # the service document's content
