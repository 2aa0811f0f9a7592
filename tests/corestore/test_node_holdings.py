"""Specification of what a node's Corestore says it holds and of a full Corestore disk.

- `GET /v1/isolated-restores` lists each prepared restore with its mappings, the scratch
  resources it has and whether its staging archive exists, page by page by restoreId;
  `GET /v1/database-closure-imports` lists the imports it holds (reconciliation reads both);
- a full disk is `507 storage-full` from the reference Corestore; the client raises
  `CorestoreFull` (wire code `corestore-full`, retryable), sends it once (a full disk does not
  empty between two resends) and tells its observer, which hears the disk take writes again.
"""

from __future__ import annotations

import hashlib
from typing import Any

import aiohttp
import pytest

from agent.contracts.relay import DatabaseClosureDescriptor
from agent.corestore import CorestoreClient
from agent.corestore.routes import RouteName
from agent.errors import CorestoreFull, wire_error_data
from agent.secret import Secret
from devstack.corestore import CorestoreHandle
from devstack.corestore.services import receipt_for
from tests.corestore.conftest import BEARER, World


async def test_the_restore_listing_shows_each_restore_with_what_it_holds(world: World) -> None:
    """A prepared restore with a staged object and one restored resource: listed with its
    mappings as prepared, the resource's state and its staging archive."""
    await world.prepare()
    await world.stage_all()
    status = await world.client.wait_resource_restored(
        world.restore_id, world.mapping_id, world.grant, poll_interval=0.01, max_wait=30
    )
    assert status.state == "succeeded"
    listing = await world.client.list_restores()
    [listed] = listing.restores
    assert (listed.restore_id, listed.scratch_namespace_id, listed.staging_archive_id) == (
        world.restore_id,
        world.namespace,
        world.archive,
    )
    assert [m.id for m in listed.resource_mappings] == [world.mapping_id]
    assert [(r.mapping_id, r.state) for r in listed.resources] == [(world.mapping_id, "succeeded")]
    assert listed.staging_archive
    assert listing.next is None


async def test_a_cleaned_restore_is_no_longer_listed(world: World) -> None:
    """Once its archive is deleted and the restore forgotten, the listing is empty."""
    await world.prepare()
    await world.client.delete_staging_archive(world.archive, world.grant)
    await world.client.delete_restore(world.restore_id, world.grant)
    assert (await world.client.list_restores()).restores == ()


async def _page(corestore: CorestoreHandle, path: str, query: str) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {BEARER}"}
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{corestore.url}{path}?{query}", headers=headers) as response,
    ):
        assert response.status == 200
        body: dict[str, Any] = await response.json()
        return body


async def test_the_restore_listing_is_paged_by_restore_id(world: World) -> None:
    """Three restores, pages of two: the first names the cursor, the second ends."""
    for n in range(3):
        world.restore_id, world.archive = f"restore-{n}", f"archive-{n}"
        await world.prepare()
    first = await _page(world.corestore, "/v1/isolated-restores", "limit=2")
    assert [r["restoreId"] for r in first["restores"]] == ["restore-0", "restore-1"]
    assert first["next"] == "restore-1"
    second = await _page(world.corestore, "/v1/isolated-restores", "limit=2&after=restore-1")
    assert [r["restoreId"] for r in second["restores"]] == ["restore-2"]
    assert second["next"] is None
    listing = await world.client.list_restores(after="restore-0")
    assert [r.restore_id for r in listing.restores] == ["restore-1", "restore-2"]


async def test_the_import_listing_shows_each_open_import(client: CorestoreClient) -> None:
    """An opened import: listed with its service, backup, size and verified bytes."""
    data = b"closure" * 100
    sha = hashlib.sha256(data).hexdigest()
    descriptor = DatabaseClosureDescriptor.model_validate(
        {"size": len(data), "sha256": sha, "receipt": receipt_for("svc-1", "b-1", len(data), sha)}
    )
    await client.open_closure_import(
        "imp-1", service_id="svc-1", backup_id="b-1", descriptor=descriptor
    )
    [listed] = (await client.list_closure_imports()).imports
    assert (listed.import_id, listed.service_id, listed.backup_id, listed.state) == (
        "imp-1",
        "svc-1",
        "b-1",
        "open",
    )
    assert (listed.size, listed.verified_bytes) == (len(data), 0)
    await client.abort_closure_import("imp-1")
    assert (await client.list_closure_imports()).imports == ()


class Full:
    """A CorestoreObserver that keeps what it heard of the disk."""

    def __init__(self) -> None:
        self.heard: list[tuple[str, bool]] = []
        self.outcomes: list[str] = []

    def corestore_full(self, *, node: str, full: bool) -> None:
        self.heard.append((node, full))

    def corestore_answer(self, *, route: str, outcome: str, seconds: float) -> None:
        del seconds
        self.outcomes.append(f"{route}:{outcome}")

    def corestore_resend(self, *, route: str) -> None:
        self.outcomes.append(f"resend:{route}")

    def credential_rejected(self) -> None:
        raise AssertionError("no credential is rejected here")


async def test_a_full_corestore_is_its_own_error_sent_once_and_heard(
    world: World, corestore: CorestoreHandle
) -> None:
    """The disk full at a chunk PUT: `507 storage-full`, CorestoreFull with the wire code
    `corestore-full` (retryable), one send only; the observer hears the node full, and not
    full any more when the next write is taken."""
    heard = Full()
    await world.prepare()
    path = next(iter(world.objects))
    chunk = world.objects[path][:4096]
    sha = hashlib.sha256(chunk).hexdigest()
    async with CorestoreClient(corestore.url, Secret(BEARER), observer=heard) as client:
        corestore.faults.disk_full_next(RouteName.PUT_CHUNK)
        before = corestore.faults.hits[RouteName.PUT_CHUNK]
        with pytest.raises(CorestoreFull) as raised:
            await client.put_chunk(world.archive, path, 0, chunk, sha, world.grant)
        assert corestore.faults.hits[RouteName.PUT_CHUNK] == before + 1
        await client.put_chunk(world.archive, path, 0, chunk, sha, world.grant)
    assert wire_error_data(raised.value) == {
        "code": "corestore-full",
        "retryable": True,
        "httpStatus": 507,
    }
    assert "put-chunk:storage-full" in heard.outcomes
    assert not [o for o in heard.outcomes if o.startswith("resend:")]
    assert heard.heard == [(corestore.url, True), (corestore.url, False)]
