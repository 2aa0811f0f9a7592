"""The pieces of bench/staging.py: child processes, the deterministic object, request bodies.

- `Corestore`: the reference Corestore as a child (`python -m agent.devstack.corestore`).
- `AgentProcess`: a child that connects to a stand-in Cloudly with a generated config file —
  the agent itself (`python -m agent run --config F`) or the pass-through baseline
  (`python -m bench._staging_passthrough --config F`). Its stderr (JSON logs) goes to a file.
- `BenchObject`: N bytes cycled from `distinct` chunk-sized blocks (SHAKE256 of a seed), so the
  baseline can be handed each chunk's sha256 instead of computing it; the whole-object sha256
  is computed once, before any timing.
- `Restore`: the isolated-restore request bodies for one restore of one object (grants are
  fresh compact-JWS-shaped strings: the agent checks only their shape, Corestore too).

Secrets here are throwaway values for the stand-ins, written to 0600 files, never to argv.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import itertools
import json
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from agent.devstack.cloudly import StandInCloudly

__all__ = [
    "BEARER",
    "TOKEN",
    "AgentProcess",
    "BenchObject",
    "Corestore",
    "Restore",
    "agent_process",
    "corestore_process",
]

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "bench-machine-token-3f9a1c"
BEARER = "bench-corestore-bearer-77d2e0"
CLUSTER, NODE = "cluster-1", "node-1"
MiB = 2**20


def secret_file(path: Path, value: str) -> Path:
    """`value` in a 0600 file (the agent refuses group/other access)."""
    path.write_text(value + "\n")
    path.chmod(0o600)
    return path


@dataclass(slots=True)
class Corestore:
    """The reference Corestore child."""

    url: str
    data_dir: Path
    process: asyncio.subprocess.Process


@contextlib.asynccontextmanager
async def corestore_process(work: Path, log: IO[bytes]) -> AsyncIterator[Corestore]:
    """Start the reference Corestore under `work/corestore`; SIGTERM it on exit."""
    data_dir = work / "corestore"
    bearer = secret_file(work / "corestore-bearer", BEARER)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agent.devstack.corestore",
        "--data-dir",
        str(data_dir),
        "--bearer-file",
        str(bearer),
        cwd=ROOT,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=log,
    )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(30):
            hello = json.loads(await process.stdout.readline() or b"{}")
        if "url" not in hello:
            raise RuntimeError(f"the reference Corestore did not start: {hello}")
        yield Corestore(str(hello["url"]), data_dir, process)
    finally:
        await _stop(process)


async def _stop(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        process.terminate()
    try:
        async with asyncio.timeout(30):
            await process.wait()
    except TimeoutError:
        process.kill()
        await process.wait()


def write_config(directory: Path, cloudly_url: str, chunk_mib: int, window: int) -> Path:
    """An agent config file for the stand-ins (production defaults unless a flag says)."""
    directory.mkdir(parents=True, exist_ok=True)
    token = secret_file(directory / "token", TOKEN)
    bearer = secret_file(directory / "bearer", BEARER)
    config = directory / "agent.toml"
    config.write_text(
        "\n".join(
            [
                "[cloudly]",
                f'url = "{cloudly_url}"',
                f'token_file = "{token}"',
                "[corestore]",
                f'credential_file = "{bearer}"',
                f"chunk_size = {chunk_mib * MiB}",
                "[state]",
                f'directory = "{directory / "state"}"',
                "[streams]",
                f"window = {window}",
                "[shutdown]",
                "drain_timeout_s = 5.0",
                "close_timeout_s = 2.0",
                "[log]",
                'format = "json"',
                'level = "info"',
                "",
            ]
        )
    )
    return config


@dataclass(slots=True)
class AgentProcess:
    """A child connected to a stand-in Cloudly."""

    name: str
    process: asyncio.subprocess.Process
    log_path: Path

    @property
    def pid(self) -> int:
        """The child's pid (the Python interpreter itself: no shell in between)."""
        return self.process.pid


@contextlib.asynccontextmanager
async def agent_process(
    name: str,
    module: list[str],
    directory: Path,
    cloudly: StandInCloudly,
    *,
    chunk_mib: int,
    window: int,
) -> AsyncIterator[AgentProcess]:
    """Start `python -m <module...> --config F` against `cloudly`; wait until it is connected."""
    config = write_config(directory, cloudly.url, chunk_mib, window)
    log_path = directory / "stderr.jsonl"
    connected = cloudly.count("cluster-config-read")
    with log_path.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            *module,
            "--config",
            str(config),
            cwd=ROOT,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
    child = AgentProcess(name, process, log_path)
    try:
        async with asyncio.timeout(60):
            exited = asyncio.ensure_future(process.wait())
            ready = asyncio.ensure_future(cloudly.wait_for("cluster-config-read", connected + 1))
            done, _ = await asyncio.wait({exited, ready}, return_when=asyncio.FIRST_COMPLETED)
            for future in (exited, ready):
                future.cancel()
            if ready not in done:
                raise RuntimeError(f"{name} exited before connecting; see {log_path}")
        yield child
    finally:
        await _stop(process)


@dataclass(frozen=True, slots=True)
class BenchObject:
    """`size` bytes made of `blocks` cycled; `sha256` of the whole, chunk digests of each block."""

    size: int
    blocks: tuple[bytes, ...]
    sha256: str

    @classmethod
    def make(cls, size: int, block_size: int, distinct: int = 4, seed: str = "bench") -> BenchObject:
        """Deterministic bytes; `size` must be a multiple of `block_size` (the chunk size)."""
        if size % block_size:
            raise ValueError(f"the size {size} is not a multiple of the chunk size {block_size}")
        data = hashlib.shake_256(seed.encode()).digest(block_size * distinct)
        blocks = tuple(data[i * block_size : (i + 1) * block_size] for i in range(distinct))
        whole = hashlib.sha256()
        for index in range(size // block_size):
            whole.update(blocks[index % distinct])
        return cls(size, blocks, whole.hexdigest())

    @property
    def block_digests(self) -> list[str]:
        """The sha256 of each block: chunk k of the object is block k % len(blocks)."""
        return [hashlib.sha256(block).hexdigest() for block in self.blocks]

    def pieces(self, piece: int) -> Iterator[memoryview]:
        """The object as `piece`-byte views (`piece` divides the block size)."""
        views = [memoryview(block) for block in self.blocks]
        block_size = len(self.blocks[0])
        for index in range(self.size // block_size):
            view = views[index % len(views)]
            for start in range(0, block_size, piece):
                yield view[start : start + piece]


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


_GRANTS = itertools.count()
_GRANT_HEADER = _b64('{"alg":"RS256","typ":"JWT"}')


def grant() -> str:
    """A fresh compact-JWS-shaped grant (nobody here verifies signatures)."""
    n = next(_GRANTS)
    return f"{_GRANT_HEADER}.{_b64(f'bench-grant-{n}')}.c2ln{n:06d}"


@dataclass(slots=True)
class Restore:
    """One isolated restore of one object, on node-1 of cluster-1."""

    restore_id: str
    path: str
    obj: BenchObject
    archive_id: str = field(init=False)

    def __post_init__(self) -> None:
        self.archive_id = f"staging-{self.restore_id}"

    @property
    def entry(self) -> dict[str, Any]:
        """The manifest entry of the object."""
        return {"path": self.path, "size": self.obj.size, "sha256": self.obj.sha256}

    def _base(self, **fields: Any) -> dict[str, Any]:
        return {
            "restoreGrant": grant(),
            "clusterId": CLUSTER,
            "targetNodeName": NODE,
            "restoreId": self.restore_id,
            **fields,
        }

    @property
    def scratch_id(self) -> str:
        """The scratch namespace id."""
        return f"scratch-{self.restore_id}"

    @property
    def mapping(self) -> dict[str, Any]:
        """The one resource mapping (a database; never executed here)."""
        return {
            "id": "map-db",
            "type": "database",
            "source": {"snapshotId": "snap-db", "resourceName": "db", "databaseName": "app"},
            "target": {"resourceName": "db-scratch", "databaseName": "app"},
        }

    def prepare(self) -> dict[str, Any]:
        """`coreflowPrepareIsolatedRestore` at revision 0."""
        return self._base(
            expectedRevision=0,
            sourceBackupId="backup-1",
            sourceServiceId="service-1",
            scratchNamespaceId=self.scratch_id,
            stagingArchiveId=self.archive_id,
            resourceMappings=[self.mapping],
            archiveManifest={"objects": [self.entry]},
        )

    def stage(self, revision: int, marker: dict[str, Any]) -> dict[str, Any]:
        """`stageIsolatedRestoreArchive` of the object, its bytes on `marker`'s stream."""
        return self._base(expectedRevision=revision, object=self.entry, archive=marker)

    def status(self) -> dict[str, Any]:
        """`coreflowGetIsolatedRestoreStatus`."""
        return self._base()

    def forward(self, corestore_url: str, marker: dict[str, Any]) -> dict[str, Any]:
        """The baseline's `benchForward` request (bench/_staging_passthrough.py)."""
        return {
            "archive": marker,
            "endpoint": corestore_url,
            "grant": grant(),
            "stagingArchiveId": self.archive_id,
            "path": self.path,
            "size": self.obj.size,
            "sha256": self.obj.sha256,
            "blockDigests": self.obj.block_digests,
        }
