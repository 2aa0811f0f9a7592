"""Fixtures for the Corestore tests: the real reference server on 127.0.0.1 port 0, real files.

Test modules cannot import this file (importlib mode), so shared values travel as fixtures:
`bearer`, `grant` (secrets whose text the leak tests search for), `clock` (the clients' clock: a
`ManualClock` every backoff on which ends at once, `clock.slept` lists them), `corestore` (a
running reference server in tmp_path), `client` (a `CorestoreClient` on it with fast timeouts
and the jitter draw pinned to the top of the window) and `world` (both, plus helpers that
prepare a restore and stage its objects).
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agent.corestore import CorestoreClient, CorestoreTimeouts, PreparedRestore
from agent.retry import Backoff, RetryPolicy
from agent.secret import Secret
from devstack.corestore import CorestoreHandle, start
from tests.clock import ManualClock, advancing

BEARER = "corestore-bearer-3b9f1c2d7e8a4f60"
# Shaped like a compact RS256 JWS; the reference server checks the shape only.
GRANT = (
    "eyJhbGciOiJSUzI1NiIsInR5cCI6IkpXVCJ9"
    ".eyJvcCI6InJlc3RvcmUiLCJyZXN0b3JlSWQiOiJyZXN0b3JlLTEifQ"
    ".c2lnbmF0dXJlLW9mLXRoZS1ncmFudC0wMTIzNDU2Nzg5"
)
SNAPSHOT = "snap-db-1"


@dataclass
class World:
    """A reference Corestore, a client on it, and the facts of one prepared restore."""

    corestore: CorestoreHandle
    client: CorestoreClient
    grant: Secret
    clock: ManualClock
    restore_id: str = "restore-1"
    namespace: str = "scratch-ns-1"
    archive: str = "staging-archive-1"
    mapping_id: str = "mapping-db-1"
    objects: dict[str, bytes] = field(default_factory=dict)

    def entry(self, path: str) -> dict[str, Any]:
        data = self.objects[path]
        return {"path": path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}

    def mapping(self) -> dict[str, Any]:
        return {
            "id": self.mapping_id,
            "type": "database",
            "source": {"snapshotId": SNAPSHOT, "resourceName": "db", "databaseName": "app"},
            "target": {"resourceName": "db-scratch", "databaseName": "app"},
        }

    async def prepare(self, objects: dict[str, bytes] | None = None) -> None:
        """Prepare the restore with `objects` (path -> bytes) as its manifest."""
        self.objects = objects or {
            f"{SNAPSHOT}/dump.bson": bytes(range(256)) * 40,
            f"{SNAPSHOT}/meta/indexes.json": b'{"indexes": []}',
        }
        await self.prepare_again()

    async def prepare_again(self) -> PreparedRestore:
        """The same prepare as the last one (same id, archive, mappings and manifest)."""
        return await self.client.prepare_restore(
            self.restore_id,
            scratch_namespace_id=self.namespace,
            staging_archive_id=self.archive,
            resource_mappings=[self.mapping()],
            archive_manifest={"objects": [self.entry(path) for path in self.objects]},
            grant=self.grant,
        )

    async def stage(self, path: str, chunk_size: int = 4096, *, commit: bool = True) -> None:
        """Write `path` in chunks from offset 0, then commit it."""
        data = self.objects[path]
        for offset in range(0, len(data), chunk_size):
            chunk = data[offset : offset + chunk_size]
            sha = hashlib.sha256(chunk).hexdigest()
            await self.client.put_chunk(self.archive, path, offset, chunk, sha, self.grant)
        if commit:
            entry = self.entry(path)
            await self.client.commit_object(
                self.archive, path, entry["size"], entry["sha256"], self.grant
            )

    async def stage_all(self) -> None:
        for path in self.objects:
            await self.stage(path)

    def staged_file(self, path: str) -> Path:
        return self.corestore.data_dir / "staging" / self.archive / path

    def restored_dir(self) -> Path:
        return self.corestore.data_dir / "scratch" / self.namespace / self.mapping_id


@pytest.fixture
def bearer() -> Secret:
    """The node control credential the reference server expects."""
    return Secret(BEARER)


@pytest.fixture
def grant() -> Secret:
    """A restore grant of the right shape."""
    return Secret(GRANT)


def top_of_the_window() -> float:
    """The full-jitter draw that waits the whole backoff window (deterministic delays)."""
    return 1.0


@pytest.fixture
async def clock() -> AsyncIterator[ManualClock]:
    """The clients' clock: each backoff ends at once and is recorded in `clock.slept`."""
    async with advancing(ManualClock()) as clock:
        yield clock


@pytest.fixture
async def corestore(tmp_path: Path) -> AsyncIterator[CorestoreHandle]:
    """A reference Corestore storing under tmp_path/corestore, stopped after the test."""
    async with await start(data_dir=tmp_path / "corestore", bearer=BEARER) as handle:
        yield handle


@pytest.fixture
async def client(
    corestore: CorestoreHandle, bearer: Secret, clock: ManualClock
) -> AsyncIterator[CorestoreClient]:
    """A client on `corestore`: 3 sends, 0.1 s doubling waits (whole windows), 5 s timeouts."""
    async with CorestoreClient(
        corestore.url,
        bearer,
        timeouts=CorestoreTimeouts(connect=5.0, control=5.0, transfer=5.0),
        retry=RetryPolicy(attempts=3, backoff=Backoff(base=0.1, cap=5.0, factor=2.0)),
        clock=clock,
        rng=top_of_the_window,
    ) as opened:
        yield opened


@pytest.fixture
def world(
    corestore: CorestoreHandle, client: CorestoreClient, grant: Secret, clock: ManualClock
) -> World:
    """The server, the client and the helpers of one restore (not yet prepared)."""
    return World(corestore, client, grant, clock)
