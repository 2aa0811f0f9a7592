"""Fixtures for the end-to-end tests: the real agent, the reference Corestore, a stand-in Cloudly.

Test modules cannot import this file (importlib mode), so everything travels as fixtures:

- `stack`: a `Stack` — the reference Corestore (127.0.0.1, port 0, under tmp_path) whose hit
  counter signals every request (`stack.wait_hits(route, n)`), a `StandInCloudly` serving one
  cluster whose node points at it (stream chunk form from the `chunk_form` fixture), hooks on
  Corestore's requests as they arrive (`stack.on_hit`) and once handled (`stack.on_handled`:
  the effect applied, its answer not yet sent), and ways to
  run the real agent against them: in-process (`async with stack.agent():`, `agent.entry.app.run`
  with its websocket session) or as a subprocess (`await stack.spawn()`, `python -m agent run`).
  The agent gets its Corestore bearer as production does: sealed to its own key by the stand-in
  Cloudly's credential authority (`credential_source="file"` as a keyword selects the file
  option instead).
- `plan`: a restore of three resources whose objects are small except the volume image
  (`big_size`, a fixture a module may override); `stack.driver(plan)` drives it.
- `captured_logs`: the in-process structlog/stdlib output as JSON lines (debug level), with the
  logging configuration restored afterwards.

Secrets are recognisable so leak tests can search for them: `TOKEN`, `BEARER`, the stand-in's
JWTs (`cloudly.issued_jwts`), every sealed text it sent (`authority.sealed_texts`), the agent's
private key and every grant a driver issued (`driver.issued_grants`, all with `GRANT_MARK` in
their payload).
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import logging
import os
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import structlog

from agent.config import Config
from agent.contracts.credentials import b64url
from agent.corestore.routes import RouteName
from agent.credentials.keys import KEY_FILE
from agent.log import configure_logging
from agent.watch.status import AgentStatus
from devstack.cloudly import StandInCloudly, cluster_document
from devstack.corestore import CorestoreHandle, start
from devstack.corestore.storage import Storage
from devstack.credentials import CredentialAuthority
from devstack.driver import (
    GRANT_MARK,
    MappingSpec,
    ObjectSpec,
    RestoreDriver,
    RestorePlan,
    stand_in_settings,
)
from tests.agentstack import connected, secret_file, spawn_agent, toml

TOKEN = "e2e-machine-token-SENTINEL-0c9d1e42"
BEARER = "e2e-corestore-bearer-SENTINEL-77ab3f"
CLUSTER, NODE = "cluster-e2e", "node-e2e"
KiB, MiB = 1024, 1024 * 1024


class SignallingCounter(Counter[RouteName]):
    """The reference Corestore's hit counter: wakes waiters and runs hooks on every request.

    The server counts a request before it takes the request's fault, so a hook registered for
    hit `n` (`on_hit`) can set a fault that applies to request `n` itself: faults land at an
    exact point mid-object, without timing.
    """

    def __init__(self, initial: Counter[RouteName]) -> None:
        self._changed = asyncio.Event()
        self._hooks: dict[tuple[RouteName, int], list[Callable[[], object]]] = {}
        super().__init__(initial)

    def on_hit(self, route: RouteName, count: int, action: Callable[[], object]) -> None:
        self._hooks.setdefault((route, count), []).append(action)

    def __setitem__(self, key: RouteName, value: int) -> None:
        super().__setitem__(key, value)
        for action in self._hooks.pop((key, value), []):
            action()
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def wait(self, route: RouteName, count: int) -> None:
        while self[route] < count:
            await self._changed.wait()


@dataclass
class AgentProcess:
    """The agent as a subprocess; its stdout and stderr go to files."""

    process: asyncio.subprocess.Process
    stdout: Path
    stderr: Path

    def kill(self) -> None:
        """SIGKILL: no shutdown, no flush, no checkpoint."""
        self.process.kill()

    async def wait(self) -> int:
        return await self.process.wait()

    async def terminate(self) -> int:
        """SIGTERM and wait for the orderly exit."""
        if self.process.returncode is None:
            self.process.terminate()
        async with asyncio.timeout(30):
            return await self.process.wait()

    def output(self) -> str:
        return self.stdout.read_text() + self.stderr.read_text()


@dataclass
class Stack:
    """One reference Corestore and one stand-in Cloudly; the agent runs against them."""

    tmp: Path
    corestore: CorestoreHandle
    cloudly: StandInCloudly
    authority: CredentialAuthority
    hits: SignallingCounter
    state_dir: Path
    handled: SignallingCounter = field(default_factory=lambda: SignallingCounter(Counter()))
    processes: list[AgentProcess] = field(default_factory=list)
    health: str | None = None  # the in-process agent's health endpoint, once it listens

    @property
    def faults(self) -> Any:
        return self.corestore.faults

    def config_data(self, **corestore: Any) -> dict[str, Any]:
        """The agent's configuration (quick reconnects, small chunks, a 0.05 s restore poll
        instead of 1 s per resource, no outage tolerance beyond `retries` so a fault test's
        storm ends the call at once, unless overridden). The Corestore bearer comes sealed, as
        in production, unless `credential_source="file"` is given: then from a 0600 file."""
        token = secret_file(self.tmp / "machine-token", TOKEN)
        if corestore.get("credential_source") == "file":
            credential = secret_file(self.tmp / "corestore-credential", BEARER)
            corestore = {"credential_file": str(credential), **corestore}
        return {
            "cloudly": {
                "url": self.cloudly.url,
                "token_file": str(token),
                "backoff_base_s": 0.05,
                "backoff_cap_s": 0.2,
            },
            "corestore": {
                "chunk_size": 64 * KiB,
                "retries": 1,
                "outage_tolerance_s": 0,
                "restore_poll_interval_s": 0.05,
                **corestore,
            },
            "state": {"directory": str(self.state_dir)},
            "shutdown": {"drain_timeout_s": 2.0, "close_timeout_s": 2.0},
            "log": {"format": "json", "level": "debug"},
            "health": {"listen": "127.0.0.1:0"},
        }

    @asynccontextmanager
    async def agent(
        self,
        *,
        streams: dict[str, Any] | None = None,
        memory: dict[str, Any] | None = None,
        cloudly: dict[str, Any] | None = None,
        **corestore: Any,
    ) -> AsyncIterator[AgentStatus]:
        """The real agent in-process (`agent.entry.app.run`), connected; stopped in order on exit.
        `streams` and `memory` are its `[streams]` and `[memory]` sections (the defaults when
        None); `cloudly` keys are added to its `[cloudly]` section."""
        data = self.config_data(**corestore)
        if streams is not None:
            data["streams"] = streams
        if memory is not None:
            data["memory"] = memory
        data["cloudly"].update(cloudly or {})
        config = Config.model_validate(data)
        async with connected(config, start_timeout=15, on_ready=self._listening) as status:
            yield status

    def _listening(self, address: str) -> None:
        self.health = address

    async def spawn(self, **corestore: Any) -> AgentProcess:
        """`python -m agent run --config <tmp>/agent.toml` (logs to files in tmp)."""
        config = self.tmp / "agent.toml"
        config.write_text(toml(self.config_data(**corestore)))
        number = len(self.processes) + 1
        stdout, stderr = self.tmp / f"agent-{number}.out", self.tmp / f"agent-{number}.err"
        process = await spawn_agent(config, environ=os.environ, stdout=stdout, stderr=stderr)
        spawned = AgentProcess(process, stdout, stderr)
        self.processes.append(spawned)
        return spawned

    def driver(self, plan: RestorePlan, **options: Any) -> RestoreDriver:
        options.setdefault("piece_size", 64 * KiB)
        options.setdefault("poll_interval", 0.02)
        return RestoreDriver(self.cloudly, plan, **options)

    def on_hit(self, route: RouteName, count: int, action: Callable[[], object]) -> None:
        """Run `action` when Corestore counts request number `count` of `route`."""
        self.hits.on_hit(route, count, action)

    def on_handled(self, route: RouteName, count: int, action: Callable[[], object]) -> None:
        """Run `action` once Corestore handled request number `count` of `route` (its effect
        applied), before its answer is sent."""
        self.handled.on_hit(route, count, action)

    async def wait_hits(self, route: RouteName, count: int) -> None:
        """Wait until the reference Corestore received `count` requests of `route`."""
        async with asyncio.timeout(30):
            await self.hits.wait(route, count)

    async def clean_up(self, driver: RestoreDriver) -> dict[str, Any]:
        """cleanup, then wait for `cleaned` or `cleanup-failed`; the final state."""
        await driver.cleanup()
        return await driver.wait_until({"cleaned", "cleanup-failed"}, timeout=30)

    def staged_digest(self, plan: RestorePlan, path: str) -> str:
        """sha256 of the object's bytes on Corestore's disk."""
        return hashlib.sha256(self.staged_file(plan, path).read_bytes()).hexdigest()

    def staged_file(self, plan: RestorePlan, path: str) -> Path:
        return Storage(self.corestore.data_dir).object_path(plan.staging_archive_id, path)

    def object_progress(self, plan: RestorePlan, path: str) -> dict[str, Any]:
        """What the reference Corestore holds of one object (`state`, `verifiedBytes`...)."""
        progress: dict[str, Any] = Storage(self.corestore.data_dir).progress(
            plan.staging_archive_id, path
        )
        return progress

    def leftovers(self) -> list[str]:
        """Every file left in Corestore's data directory: after `cleaned`, none (no staged
        object, no scratch resource, not the prepared-restore record)."""
        return Storage(self.corestore.data_dir).files()

    def leaked(self, data: bytes | str, driver: RestoreDriver) -> list[str]:
        """Which secrets (by name, never the value) occur in `data`."""
        text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
        named = {"machine token": TOKEN, "corestore bearer": BEARER, "grant mark": GRANT_MARK}
        named |= {f"grant #{n}": grant for n, grant in enumerate(driver.issued_grants)}
        named |= {f"jwt #{n}": jwt for n, jwt in enumerate(self.cloudly.issued_jwts)}
        named |= {f"sealed #{n}": text for n, text in enumerate(self.authority.sealed_texts)}
        if (key := self.state_dir / KEY_FILE).exists():
            private = key.read_bytes()
            named |= {"private key hex": private.hex(), "private key base64url": b64url(private)}
        return sorted(name for name, value in named.items() if value in text)

    def database_bytes(self) -> bytes:
        """The state database and its -wal/-shm files, concatenated."""
        files = sorted(p for p in self.state_dir.glob("*") if p.name.startswith("state.sqlite3"))
        assert files, "expected the agent's state database"
        return b"".join(path.read_bytes() for path in files)


@pytest.fixture
def chunk_form() -> str:
    """How the stand-in Cloudly encodes stream chunks (a test may parametrize it)."""
    return "buffer"


@pytest.fixture
def big_size() -> int:
    """The size of the plan's volume image (a module may override it)."""
    return 2 * MiB


@pytest.fixture
def plan(big_size: int) -> RestorePlan:
    """A database dump and index, a bucket of two files and one `big_size` volume image."""
    objects = (
        ObjectSpec("snap-db/dump.bson", 300 * KiB + 17, b"e2e dump"),
        ObjectSpec("snap-db/meta/indexes.json", 2 * KiB, b"e2e indexes"),
        ObjectSpec("snap-os/media/a.jpg", 100 * KiB, b"e2e photo a"),
        ObjectSpec("snap-os/media/b.jpg", 50 * KiB + 1, b"e2e photo b"),
        ObjectSpec("snap-vol/volume.img", big_size, b"e2e volume"),
    )
    mappings = (
        MappingSpec("map-db", "database", "snap-db", "app", "mongodb"),
        MappingSpec("map-media", "objectstorage", "snap-os", "media", "s3"),
        MappingSpec("map-volume", "volume", "snap-vol", "uploads"),
    )
    return RestorePlan(CLUSTER, NODE, mappings, objects, restore_id="restore-e2e")


@pytest.fixture
async def stack(tmp_path: Path, chunk_form: str) -> AsyncIterator[Stack]:
    """The reference Corestore and a stand-in Cloudly; spawned agents are killed at the end."""
    corestore = await start(data_dir=tmp_path / "corestore", bearer=BEARER)
    hits = SignallingCounter(corestore.faults.hits)
    corestore.faults.hits = hits
    handled = SignallingCounter(corestore.faults.handled)
    corestore.faults.handled = handled
    document = cluster_document(CLUSTER, {NODE: corestore.url})
    settings = stand_in_settings("base64" if chunk_form == "base64" else "buffer")
    authority = CredentialAuthority(CLUSTER, {NODE: BEARER})
    cloudly = StandInCloudly(
        token=TOKEN,
        cluster=document,
        peer_settings=settings,
        closures_dir=tmp_path / "cloudly-closures",
        credentials=authority,
    )
    await cloudly.start()
    stack = Stack(
        tmp_path, corestore, cloudly, authority, hits, tmp_path / "state", handled=handled
    )
    try:
        yield stack
    finally:
        for spawned in stack.processes:
            if spawned.process.returncode is None:
                spawned.kill()
                await spawned.wait()
        await cloudly.stop()
        await corestore.stop()


@pytest.fixture
def captured_logs() -> Iterator[io.StringIO]:
    """Everything logged in-process (JSON lines, debug); the previous logging is restored."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    websockets_level = logging.getLogger("websockets").level
    buffer = io.StringIO()
    configure_logging(format="json", level="debug", stream=buffer)
    yield buffer
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()
    root.handlers[:] = handlers
    root.setLevel(level)
    logging.getLogger("websockets").setLevel(websockets_level)
