"""Fixtures for the engine tests: the real reference Corestore, a real store, a running engine.

Test modules cannot import this file (importlib mode), so everything travels as fixtures:

- `world`: a `World` — the reference Corestore (127.0.0.1, port 0, tmp_path), the revision
  store (SQLite in tmp_path), the Corestore clients, the cluster view, a running engine (run as
  the app runs it: `engine.owner.run()` in a TaskGroup held by one task the world owns), its
  routes, and one restore's facts (two mappings, three objects) with request builders.
  `world.restart()` closes the engine and runs a new one on the same store (an agent restart).
  `world.until()` waits on the engine's change notifications (`engine.observe`) for a status;
  `world.work_ended()` for the restore's background task to end.
- `clock`: the one `ManualClock` of the engine, its store and its Corestore clients, moved by
  `tests.clock.advancing` so backoffs and poll intervals end at once; `clock.slept` lists them.
- `source_factory`: fake `ByteSource`s (`ChunkSource`) fed from bytes, optionally breaking.

Secrets are recognisable so leak tests can search for them: `BEARER`, and grants built by
`World.grant()` (a fresh compact JWS per call, all sharing `GRANT_MARK` in their payload).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import itertools
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pytest

from agent.contracts.base import StreamMarker
from agent.contracts.cluster import ClusterView, NodeView
from agent.contracts.isolatedrestore import (
    METHOD_CLEANUP,
    METHOD_EXECUTE,
    METHOD_GET_STATUS,
    METHOD_PREPARE,
    METHOD_STAGE,
)
from agent.corestore import CorestoreClients, CorestoreTimeouts
from agent.corestore.credentials import FixedCredentials
from agent.domain.restores import RestoreKey, StoredState
from agent.errors import StreamBroken
from agent.protocol.handlers import Routes
from agent.restore.engine import IsolatedRestoreEngine
from agent.restore.routes import isolated_restore_routes
from agent.restore.settings import EngineSettings
from agent.retry import Backoff, RetryPolicy
from agent.secret import Secret
from agent.store import RevisionStore
from devstack.corestore import CorestoreHandle, start
from tests.clock import ManualClock, advancing

BEARER = "corestore-bearer-SENTINEL-5c1e9a77"
GRANT_MARK = "R1JBTlRTRU5USU5FTA"  # base64url of "GRANTSENTINEL", in every grant's payload
CLUSTER, NODE, RESTORE = "cluster-1", "node-1", "restore-1"
KEY = RestoreKey(CLUSTER, NODE, RESTORE)
CHUNK = 4096
START = 1_700_000_000.0  # the clock's wall time: 2023-11-14T22:13:20Z

# Two sends of an idempotent Corestore call; the full-jitter draw is pinned to the window's top.
CLIENT_RETRY = RetryPolicy(attempts=2, backoff=Backoff(base=0.01, cap=0.02))

FAST = EngineSettings(
    chunk_size=CHUNK,
    max_in_flight=2,
    poll_interval=0.002,
    progress_interval=0.0,
)


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


_HEADER = _b64('{"alg":"RS256","typ":"JWT"}')


def pattern(size: int, seed: str) -> bytes:
    """Deterministic, seed-specific bytes."""
    block = hashlib.sha256(seed.encode()).digest()
    return (block * (size // len(block) + 1))[:size]


class ChunkSource:
    """A fake `ByteSource`: `data` in `piece`-byte pieces; raises `StreamBroken` after
    `break_after` bytes if given. Records whether it was opened and how much was read."""

    def __init__(self, data: bytes, piece: int = 1500, break_after: int | None = None) -> None:
        self.data, self.piece, self.break_after = data, piece, break_after
        self.opened = False
        self.consumed = 0
        self.closed = False

    def __aiter__(self) -> AsyncIterator[bytes]:
        self.opened = True
        return self._pieces()

    async def _pieces(self) -> AsyncIterator[bytes]:
        limit = len(self.data) if self.break_after is None else self.break_after
        while self.consumed < limit:
            end = min(self.consumed + self.piece, limit)
            piece = self.data[self.consumed : end]
            self.consumed = end
            yield piece
        if self.break_after is not None:
            raise StreamBroken("the test broke the stream")

    async def aclose(self) -> None:
        self.closed = True


class FakeContext:
    """The part of `RequestContext` a handler uses: `receive_stream(marker)`."""

    def __init__(self, source: ChunkSource | None = None) -> None:
        self.source = source
        self.opened: list[str] = []

    def receive_stream(self, marker: StreamMarker) -> ChunkSource:
        assert self.source is not None, "this request carries no stream"
        self.opened.append(marker.stream_id)
        return self.source


@dataclass
class World:
    """One reference Corestore, one store, one running engine, one restore's facts."""

    KEY = KEY
    NODE = NODE
    BEARER = BEARER
    GRANT_MARK = GRANT_MARK
    CHUNK = CHUNK
    pattern = staticmethod(pattern)

    corestore: CorestoreHandle
    store: RevisionStore
    clients: CorestoreClients
    clock: ManualClock
    state_dir: Path
    settings: EngineSettings
    engine: IsolatedRestoreEngine = field(init=False)
    engine_owner: asyncio.Task[None] = field(init=False)
    engine_stop: asyncio.Event = field(init=False)
    routes: Routes = field(init=False)
    objects: dict[str, bytes] = field(default_factory=dict)
    cluster_loaded: bool = True
    issued: list[str] = field(default_factory=list)  # every grant handed out
    _grants: itertools.count[int] = field(default_factory=itertools.count)
    _streams: itertools.count[int] = field(default_factory=itertools.count)

    def view(self) -> ClusterView | None:
        """The session's cluster view (None while `cluster_loaded` is false)."""
        if not self.cluster_loaded:
            return None
        nodes = {
            NODE: NodeView(NODE, self.corestore.url),
            "node-2": NodeView("node-2", None, ("cluster node node-2 corestore is absent",)),
        }
        return ClusterView(CLUSTER, MappingProxyType(nodes))

    async def start_engine(self) -> IsolatedRestoreEngine:
        self.engine = IsolatedRestoreEngine(
            store=self.store,
            clients=self.clients,
            cluster_view=self.view,
            settings=self.settings,
            clock=self.clock,
            rng=lambda: 1.0,
        )
        self.engine_stop = asyncio.Event()
        self.engine_owner = asyncio.create_task(
            _own(self.engine, self.engine_stop), name="engine-owner"
        )
        await self.engine.owner.started()
        self.routes = isolated_restore_routes(self.engine)
        return self.engine

    async def stop_engine(self) -> None:
        """Close the engine (its work is cancelled, the store stays); `run()` has returned."""
        self.engine_stop.set()
        await self.engine_owner

    async def restart(self) -> IsolatedRestoreEngine:
        """Stop the engine and start a new one on the same store."""
        await self.stop_engine()
        return await self.start_engine()

    # --- the restore's facts ------------------------------------------------------------------

    def grant(self) -> str:
        """A fresh grant (Cloudly signs one per call)."""
        n = next(self._grants)
        grant = f"{_HEADER}.{GRANT_MARK}{_b64(f'-{n}')}.c2lnLU{n:04d}"
        self.issued.append(grant)
        return grant

    def entry(self, path: str) -> dict[str, Any]:
        data = self.objects[path]
        return {"path": path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}

    def mappings(self) -> list[dict[str, Any]]:
        return [
            {
                "id": "map-db",
                "type": "database",
                "source": {"snapshotId": "snap-db", "resourceName": "db", "databaseName": "app"},
                "target": {"resourceName": "db-scratch", "databaseName": "app"},
            },
            {
                "id": "map-os",
                "type": "objectstorage",
                "source": {"snapshotId": "snap-os", "resourceName": "s3", "bucketName": "media"},
                "target": {"resourceName": "s3-scratch", "bucketName": "media"},
            },
        ]

    def _base(self, override: Mapping[str, Any], **fields: Any) -> dict[str, Any]:
        body = {
            "restoreGrant": self.grant(),
            "clusterId": CLUSTER,
            "targetNodeName": NODE,
            "restoreId": RESTORE,
            **fields,
        }
        body.update(override)
        return body

    def prepare_body(self, expected: int = 0, **override: Any) -> dict[str, Any]:
        return self._base(
            override,
            expectedRevision=expected,
            sourceBackupId="backup-1",
            sourceServiceId="service-1",
            scratchNamespaceId="scratch-ns-1",
            stagingArchiveId="staging-1",
            resourceMappings=self.mappings(),
            archiveManifest={"objects": [self.entry(path) for path in self.objects]},
        )

    def stage_body(self, path: str, expected: int, **override: Any) -> dict[str, Any]:
        marker = {"_isVirtualStream": True, "streamId": f"stream-{next(self._streams)}"}
        return self._base(
            override, expectedRevision=expected, object=self.entry(path), archive=marker
        )

    def execute_body(self, expected: int, **override: Any) -> dict[str, Any]:
        return self._base(override, expectedRevision=expected)

    def cleanup_body(self, expected: int, **override: Any) -> dict[str, Any]:
        return self._base(override, expectedRevision=expected)

    def status_body(self, **override: Any) -> dict[str, Any]:
        return self._base(override)

    # --- driving the handlers ------------------------------------------------------------------

    async def call(
        self, method: str, body: Mapping[str, Any], source: ChunkSource | None = None
    ) -> dict[str, Any]:
        """Call one route as the session would: parse, handle (a fake context carrying
        `source`), serialise."""
        route = self.routes.get(method)
        assert route is not None
        response = await route.handler(route.parse(body), FakeContext(source))
        return dict(response.to_wire())

    async def state_of(
        self, method: str, body: Mapping[str, Any], source: ChunkSource | None = None
    ) -> dict[str, Any]:
        """The `state` of a handler's `{state}` answer."""
        state: dict[str, Any] = (await self.call(method, body, source))["state"]
        return state

    async def prepare(self) -> dict[str, Any]:
        """Prepare (answered `preparing`) and wait until the engine settled it: the `prepared`
        (or `failed`) state."""
        await self.state_of(METHOD_PREPARE, self.prepare_body())
        return await self.settled("prepared", "failed")

    async def stage(self, path: str, expected: int, **source: Any) -> dict[str, Any]:
        chunks = ChunkSource(self.objects[path], **source)
        body = self.stage_body(path, expected)
        return await self.state_of(METHOD_STAGE, body, chunks)

    async def stage_all(self, revision: int) -> int:
        """Stage every object in order from `revision`; returns the final revision."""
        for path in self.objects:
            revision = int((await self.stage(path, revision))["revision"])
        return revision

    async def status(self) -> dict[str, Any]:
        return await self.call(METHOD_GET_STATUS, self.status_body())

    async def execute(self, expected: int) -> dict[str, Any]:
        return await self.state_of(METHOD_EXECUTE, self.execute_body(expected))

    async def cleanup(self, expected: int) -> dict[str, Any]:
        return await self.state_of(METHOD_CLEANUP, self.cleanup_body(expected))

    async def until(self, *statuses: str) -> StoredState:
        """Wait (on the engine's change notifications) until the state reaches one of them."""
        return await self.reached(lambda stored: stored.status in statuses)

    async def reached(self, predicate: Callable[[StoredState], bool]) -> StoredState:
        """The first state of the restore, the current one included, that satisfies
        `predicate` (heard through `engine.observe`, so no poll)."""
        found: asyncio.Future[StoredState] = asyncio.get_running_loop().create_future()

        def check(stored: StoredState) -> None:
            if stored.key == KEY and not found.done() and predicate(stored):
                found.set_result(stored)

        remove = self.engine.observe(check)
        try:
            current = await self.store.get(KEY)
            if current is not None:
                check(current)
            return await found
        finally:
            remove()

    async def work_ended(self) -> None:
        """Wait until no background task of the restore runs (the engine names each task
        `restore-<restoreId>`); at once when none does."""
        name = f"restore-{RESTORE}"
        while tasks := [task for task in asyncio.all_tasks() if task.get_name() == name]:
            await asyncio.wait(tasks)

    async def settled(self, *statuses: str) -> dict[str, Any]:
        """`until(*statuses)`, as the wire state Cloudly's status call would read."""
        return (await self.until(*statuses)).state.to_wire()

    async def ready_to_execute(self) -> int:
        """Prepare and stage everything; returns the revision to execute at."""
        prepared = await self.prepare()
        return await self.stage_all(prepared["revision"])

    # --- what Corestore holds -----------------------------------------------------------------

    def staged_file(self, path: str) -> Path:
        return self.corestore.data_dir / "staging" / "staging-1" / path

    def data_files(self, *areas: str) -> list[Path]:
        """Every file left under the given areas of Corestore's data directory (all of it
        when no area is given)."""
        found: list[Path] = []
        for area in areas or ("",):
            root = self.corestore.data_dir / area
            if root.exists():
                found += [path for path in root.rglob("*") if path.is_file()]
        return found


async def _own(engine: IsolatedRestoreEngine, stop: asyncio.Event) -> None:
    """Run the engine's work owner in a TaskGroup of this task until `stop` is set, then close
    it (as the composition root does).

    One task enters and leaves the group: a pytest fixture's set-up and tear-down may run in
    two."""
    async with asyncio.TaskGroup() as group:
        group.create_task(engine.owner.run(), name="isolated-restore-engine")
        await engine.owner.started()
        try:
            await stop.wait()
        finally:
            await engine.owner.close()


@pytest.fixture
async def clock() -> AsyncIterator[ManualClock]:
    """The engine's, the store's and the clients' clock; every sleep on it ends at once."""
    async with advancing(ManualClock(start=START)) as clock:
        yield clock


@pytest.fixture
async def corestore(tmp_path: Path) -> AsyncIterator[CorestoreHandle]:
    """The reference Corestore under tmp_path/corestore, stopped after the test."""
    async with await start(data_dir=tmp_path / "corestore", bearer=BEARER) as handle:
        yield handle


@pytest.fixture
def settings() -> EngineSettings:
    """The engine's settings (a test may override this fixture)."""
    return FAST


@pytest.fixture
def transfer_timeout() -> float:
    """One bulk Corestore call's bound (a test module may override this fixture)."""
    return 2.0


@pytest.fixture
def corestore_timeouts(transfer_timeout: float) -> CorestoreTimeouts:
    """The Corestore client's timeouts, `transfer` from the `transfer_timeout` fixture (a test
    module may override this fixture)."""
    return CorestoreTimeouts(connect=2.0, control=2.0, transfer=transfer_timeout)


@pytest.fixture
def client_retry() -> RetryPolicy:
    """The Corestore clients' retry policy (a test module may override this fixture)."""
    return CLIENT_RETRY


@pytest.fixture
async def world(
    tmp_path: Path,
    corestore: CorestoreHandle,
    clock: ManualClock,
    settings: EngineSettings,
    corestore_timeouts: CorestoreTimeouts,
    client_retry: RetryPolicy,
) -> AsyncIterator[World]:
    """A running engine over the reference Corestore and a real store, with one restore's facts."""
    state_dir = tmp_path / "state"
    store = await RevisionStore.open(state_dir, clock=clock)
    clients = CorestoreClients(
        credentials=FixedCredentials(Secret(BEARER)),
        timeouts=corestore_timeouts,
        retry=client_retry,
        clock=clock,
        rng=lambda: 1.0,
    )
    world = World(corestore, store, clients, clock, state_dir, settings)
    world.objects = {
        "snap-db/dump.bson": pattern(3 * CHUNK + 123, "dump"),
        "snap-db/meta/indexes.json": b'{"indexes": ["_id"]}',
        "snap-os/media/logo.png": pattern(2 * CHUNK, "logo"),
    }
    await world.start_engine()
    try:
        yield world
    finally:
        await world.stop_engine()
        await clients.close()
        await store.aclose()


@pytest.fixture
def source_factory() -> Callable[..., ChunkSource]:
    """Build a `ChunkSource` (fake stream) from bytes."""
    return ChunkSource
