"""`python -m devstack.corestore`: the reference Corestore as its own process."""

from __future__ import annotations

import asyncio
import hashlib
import json
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent.corestore import CorestoreClient
from agent.secret import Secret

BEARER = "standalone-bearer-5f0c8e21"
SNAPSHOT_OBJECT = "snap-1/volume.tar"
# `python -m` finds `agent` from the checkout root even when it is not installed.
ROOT = Path(__file__).resolve().parents[2]


async def _launch(data_dir: Path, bearer_file: Path) -> tuple[asyncio.subprocess.Process, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "devstack.corestore",
        "--data-dir",
        str(data_dir),
        "--port",
        "0",
        "--bearer-file",
        str(bearer_file),
        stdout=asyncio.subprocess.PIPE,
        cwd=ROOT,
    )
    assert process.stdout is not None
    async with asyncio.timeout(30):
        line = await process.stdout.readline()
    return process, json.loads(line)["url"]


@pytest.fixture
def bearer_file(tmp_path: Path) -> Path:
    """The bearer, in a file (never on argv)."""
    path = tmp_path / "bearer"
    path.write_text(BEARER + "\n")
    return path


@pytest.fixture
async def process(
    tmp_path: Path, bearer_file: Path
) -> AsyncIterator[tuple[asyncio.subprocess.Process, str]]:
    """A standalone reference Corestore; killed if a test left it running."""
    launched = await _launch(tmp_path / "data", bearer_file)
    try:
        yield launched
    finally:
        if launched[0].returncode is None:
            launched[0].kill()
            await launched[0].wait()


async def test_it_prints_its_url_serves_and_stops_on_sigterm(
    process: tuple[asyncio.subprocess.Process, str],
) -> None:
    """The printed URL answers; SIGTERM ends the process with exit code 0."""
    child, url = process
    async with CorestoreClient(url, Secret(BEARER)) as client:
        assert (await client.health()).status == "ok"
    child.send_signal(signal.SIGTERM)
    async with asyncio.timeout(30):
        assert await child.wait() == 0


@pytest.mark.slow
async def test_a_killed_corestore_resumes_staging_from_disk(
    tmp_path: Path, bearer_file: Path, grant: Secret
) -> None:
    """SIGKILL mid-stage: a restarted process on the same directory reports the verified bytes."""
    data = bytes(range(256)) * 1024
    half = len(data) // 2
    child, url = await _launch(tmp_path / "data", bearer_file)
    try:
        async with CorestoreClient(url, Secret(BEARER)) as client:
            await client.prepare_restore(
                "restore-1",
                scratch_namespace_id="ns",
                staging_archive_id="archive",
                resource_mappings=[
                    {"id": "m", "type": "volume", "source": {"snapshotId": "snap-1"}, "target": {}}
                ],
                archive_manifest={
                    "objects": [
                        {
                            "path": SNAPSHOT_OBJECT,
                            "size": len(data),
                            "sha256": hashlib.sha256(data).hexdigest(),
                        }
                    ]
                },
                grant=grant,
            )
            chunk = data[:half]
            await client.put_chunk(
                "archive", SNAPSHOT_OBJECT, 0, chunk, hashlib.sha256(chunk).hexdigest(), grant
            )
    finally:
        child.kill()
        await child.wait()
    child, url = await _launch(tmp_path / "data", bearer_file)
    try:
        async with CorestoreClient(url, Secret(BEARER)) as client:
            progress = await client.object_progress("archive", SNAPSHOT_OBJECT, grant)
    finally:
        child.terminate()
        await child.wait()
    assert (progress.state, progress.verified_bytes) == ("partial", half)
