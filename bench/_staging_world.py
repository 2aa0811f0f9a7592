"""The pieces of bench/staging.py: child processes, the deterministic object, request bodies.

- `Corestore`: the reference Corestore as a child (`python -m devstack.corestore`).
- `AgentProcess`: a child that connects to a stand-in Cloudly with a generated config file —
  the agent itself (`python -m agent run --config F`) or the pass-through baseline
  (`python -m bench._staging_passthrough --config F`). Its stderr (JSON logs) goes to a file.
- `BenchObject`: one object for `devstack.driver` (`CycledObject`, a driver `ObjectSpec`
  whose bytes cycle a few pre-made blocks) with its sha256 and the sha256 of each Corestore
  chunk (handed to the baseline so it need not hash), all computed before any timing.
- `plan_for()`: the driver's `RestorePlan` for one restore of one object; `forward_body()`: the
  baseline's request for the same object.

Secrets here are throwaway values for the stand-ins, written to 0600 files, never to argv.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from devstack.cloudly import StandInCloudly
from devstack.driver import BLOCK_SIZE, MappingSpec, ObjectSpec, RestorePlan, fake_grant

__all__ = [
    "BEARER",
    "CLUSTER",
    "NODE",
    "TOKEN",
    "AgentProcess",
    "BenchObject",
    "Corestore",
    "CycledObject",
    "agent_process",
    "corestore_process",
    "forward_body",
    "plan_for",
    "quiet_stand_in_logs",
    "say",
    "work_directory",
]

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "bench-machine-token-3f9a1c"
BEARER = "bench-corestore-bearer-77d2e0"
CLUSTER, NODE = "cluster-1", "node-1"
OBJECT_PATH = "snap-db/dump.bson"
DISTINCT = 4  # distinct 1 MiB blocks an object cycles through
MiB = 2**20


def say(text: str) -> None:
    """Progress on stderr (the figures go to stdout)."""
    print(text, file=sys.stderr, flush=True)


def quiet_stand_in_logs() -> None:
    """The stand-in's websockets loggers default to INFO (connection open/closed): not figures."""
    logging.getLogger("websockets").setLevel(logging.WARNING)
    logging.getLogger("websockets.server").setLevel(logging.WARNING)


@contextlib.contextmanager
def work_directory(name: str, parent: Path | None, *, keep: bool) -> Iterator[Path]:
    """A scratch directory for bench `name` under `parent` (default: the system's temporary
    directory, never inside the repository: a commit made meanwhile would pick the work files
    up); removed afterwards unless `keep`."""
    work = Path(tempfile.mkdtemp(prefix=f"bench-{name}-", dir=parent))
    try:
        yield work
    finally:
        if keep:
            say(f"work directory kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


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
async def corestore_process(
    work: Path, log: IO[bytes], *, discard: bool = False, name: str = "corestore"
) -> AsyncIterator[Corestore]:
    """Start the reference Corestore under `work/<name>`; SIGTERM it on exit. `discard`: the
    discarding Corestore (chunks verified and thrown away)."""
    data_dir = work / name
    bearer = secret_file(work / f"{name}-bearer", BEARER)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "devstack.corestore",
        "--data-dir",
        str(data_dir),
        "--bearer-file",
        str(bearer),
        *(["--discard"] if discard else []),
        cwd=ROOT,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=log,
    )
    drain: asyncio.Task[None] | None = None
    try:
        assert process.stdout is not None
        async with asyncio.timeout(30):
            hello = json.loads(await process.stdout.readline() or b"{}")
        if "url" not in hello:
            raise RuntimeError(f"the reference Corestore did not start: {hello}")
        # It leaves structlog unconfigured: a debug line per request goes to stdout. Unread, the
        # pipe fills (64 KiB) and the server blocks in a print() mid-request.
        drain = asyncio.create_task(_discard(process.stdout))
        yield Corestore(str(hello["url"]), data_dir, process)
    finally:
        if drain is not None:
            drain.cancel()
            await asyncio.wait({drain})  # before communicate(): one reader at a time
        await _stop(process)


async def _discard(stream: asyncio.StreamReader) -> None:
    while await stream.read(64 * 1024):
        pass


async def _stop(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        process.terminate()
    try:
        async with asyncio.timeout(30):
            # communicate(): reads a stdout pipe to its end, so its transport closes with it.
            await process.communicate()
    except TimeoutError:
        process.kill()
        await process.communicate()


def write_config(
    directory: Path,
    cloudly_url: str,
    chunk_mib: int,
    window: int,
    chunk_form: str | None = None,
    *,
    max_in_flight: int | None = None,
    window_bytes: int | None = None,
    corestore: Mapping[str, int] | None = None,
    streams: Mapping[str, int] | None = None,
) -> Path:
    """An agent config file for the stand-ins (production defaults unless a flag says;
    `chunk_form` is how the agent encodes the chunks it sends; `window_bytes` is left out for
    an agent that predates it; `corestore` and `streams` add keys to those sections)."""
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
                'credential_source = "file"',
                f'credential_file = "{bearer}"',
                f"chunk_size = {chunk_mib * MiB}",
                *([] if max_in_flight is None else [f"max_in_flight = {max_in_flight}"]),
                *(f"{key} = {value}" for key, value in (corestore or {}).items()),
                "[state]",
                f'directory = "{directory / "state"}"',
                "[streams]",
                f"window = {window}",
                *([] if window_bytes is None else [f"window_bytes = {window_bytes}"]),
                *([] if chunk_form is None else [f'chunk_form = "{chunk_form}"']),
                *(f"{key} = {value}" for key, value in (streams or {}).items()),
                "[shutdown]",
                "drain_timeout_s = 5.0",
                "close_timeout_s = 2.0",
                "[log]",
                'format = "json"',
                'level = "info"',
                "[health]",  # any free port: runs must not collide with each other or a node
                'listen = "127.0.0.1:0"',
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
    chunk_form: str | None = None,
    max_in_flight: int | None = None,
    window_bytes: int | None = None,
    checkout: Path = ROOT,
    corestore: Mapping[str, int] | None = None,
    streams: Mapping[str, int] | None = None,
    url: str | None = None,
) -> AsyncIterator[AgentProcess]:
    """Start `python -m <module...> --config F` against `cloudly`; wait until it is connected.
    `checkout`: run another checkout's code with its own `.venv` (an old agent, side by side).
    `url`: where the agent dials Cloudly, when not `cloudly.url` (a delay line in between)."""
    config = write_config(
        directory,
        url or cloudly.url,
        chunk_mib,
        window,
        chunk_form,
        max_in_flight=max_in_flight,
        window_bytes=window_bytes,
        corestore=corestore,
        streams=streams,
    )
    python = sys.executable if checkout == ROOT else str(checkout / ".venv" / "bin" / "python")
    log_path = directory / "stderr.jsonl"
    connected = cloudly.count("cluster-config-read")
    with log_path.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            python,
            "-m",
            *module,
            "--config",
            str(config),
            cwd=checkout,
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


_CYCLES: dict[bytes, tuple[bytes, ...]] = {}


class CycledObject(ObjectSpec):
    """An `ObjectSpec` whose content cycles `DISTINCT` blocks made once per seed.

    The driver's own objects generate every 1 MiB block with SHAKE256 as they stream (~2.6 CPU
    s/GiB in the stand-in's process, i.e. in this bench process, competing with the agent and
    Corestore for the 2 cores while timing); cycling pre-made blocks keeps the stand-in cheap.
    """

    __slots__ = ()

    def blocks(self) -> Iterator[bytes]:
        """The content in `BLOCK_SIZE` blocks (the last one shorter)."""
        cycle = _CYCLES.get(self.seed)
        if cycle is None:
            data = hashlib.shake_256(self.seed).digest(DISTINCT * BLOCK_SIZE)
            cycle = tuple(data[i * BLOCK_SIZE : (i + 1) * BLOCK_SIZE] for i in range(DISTINCT))
            _CYCLES[self.seed] = cycle
        for index, start in enumerate(range(0, self.size, BLOCK_SIZE)):
            block = cycle[index % DISTINCT]
            yield block if self.size - start >= BLOCK_SIZE else block[: self.size - start]


@dataclass(frozen=True, slots=True)
class BenchObject:
    """One object of `size` bytes: its spec (with the sha256 known) and its chunk digests."""

    spec: CycledObject
    chunk_digests: tuple[str, ...]  # sha256 of each `chunk_size` chunk, for the baseline

    @classmethod
    def make(cls, size: int, chunk_size: int, seed: bytes = b"bench object") -> BenchObject:
        """Deterministic bytes; one pass computes the whole and the per-chunk digests."""
        bare = CycledObject(OBJECT_PATH, size, seed)
        whole, chunks, current, filled = hashlib.sha256(), [], hashlib.sha256(), 0
        for block in bare.blocks():
            whole.update(block)
            view = memoryview(block)
            while view:
                take = min(len(view), chunk_size - filled)
                current.update(view[:take])
                filled += take
                view = view[take:]
                if filled == chunk_size:
                    chunks.append(current.hexdigest())
                    current, filled = hashlib.sha256(), 0
        if filled:
            chunks.append(current.hexdigest())
        spec = CycledObject(OBJECT_PATH, size, seed, whole.hexdigest())
        return cls(spec, tuple(chunks))

    @property
    def size(self) -> int:
        """Bytes."""
        return self.spec.size


def plan_for(restore_id: str, obj: BenchObject, node: str = NODE) -> RestorePlan:
    """One restore of one object on `node` (a database mapping over it; never executed here)."""
    return RestorePlan(
        CLUSTER,
        node,
        (MappingSpec("map-db", "database", "snap-db", "app", "mongodb"),),
        (obj.spec,),
        restore_id=restore_id,
        scratch_namespace_id=f"scratch-{restore_id}",
        staging_archive_id=f"staging-{restore_id}",
    )


def forward_body(
    plan: RestorePlan, obj: BenchObject, corestore_url: str, marker: dict[str, Any]
) -> dict[str, Any]:
    """The baseline's `benchForward` request (bench/_staging_passthrough.py)."""
    return {
        "archive": marker,
        "endpoint": corestore_url,
        "grant": fake_grant(),
        "stagingArchiveId": plan.staging_archive_id,
        "path": obj.spec.path,
        "size": obj.size,
        "sha256": obj.spec.sha256,
        "chunkDigests": list(obj.chunk_digests),
    }
