"""The composition root's hook installs the engine: a stand-in Cloudly drives it end to end."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

from agent.config import Config
from agent.contracts.isolatedrestore import METHOD_GET_STATUS, METHOD_PREPARE, METHOD_STAGE
from agent.entry import app
from agent.store import RevisionStore
from agent.watch.status import AgentStatus, SessionState
from devstack.cloudly import StandInCloudly, cluster_document

TOKEN = "machine-token-9f8e7d6c5b4a3921"


def _secret_file(path: Path, value: str) -> Path:
    path.write_text(value + "\n")
    path.chmod(0o600)
    return path


def _config(tmp_path: Path, cloudly: StandInCloudly, bearer: str) -> Config:
    return Config.model_validate(
        {
            "cloudly": {"url": cloudly.url, "token_file": str(_secret_file(tmp_path / "t", TOKEN))},
            "corestore": {
                "credential_source": "file",
                "credential_file": str(_secret_file(tmp_path / "c", bearer)),
                "chunk_size": 64 * 1024,
                "retries": 1,
            },
            "state": {"directory": str(tmp_path / "state")},
            "shutdown": {"drain_timeout_s": 2.0, "close_timeout_s": 2.0},
            "health": {"listen": "127.0.0.1:0"},
        }
    )


async def _settled(cloudly: StandInCloudly, world: Any) -> dict[str, Any]:
    """Cloudly's view: read the status until the agent's prepare task settled it."""
    async with asyncio.timeout(10):
        while True:
            reply = await cloudly.call_agent(METHOD_GET_STATUS, world.status_body())
            if reply["state"]["status"] != "preparing":
                state: dict[str, Any] = reply["state"]
                return state


async def test_the_agent_serves_isolated_restores_and_keeps_their_state(
    tmp_path: Path, world: Any
) -> None:
    """prepare and stage (150 KiB in 64 KiB chunks) through the real session; state survives."""
    world.objects = {"snap-db/dump.bson": world.pattern(150 * 1024, "app")}
    path, data = "snap-db/dump.bson", world.objects["snap-db/dump.bson"]
    document = cluster_document("cluster-1", {"node-1": world.corestore.url})
    status, stop = AgentStatus(), asyncio.Event()
    async with StandInCloudly(token=TOKEN, cluster=document) as cloudly:
        config = _config(tmp_path, cloudly, world.BEARER)
        async with asyncio.TaskGroup() as group:
            agent = group.create_task(app.run(config, stop=stop, status=status))
            await status.wait_until(lambda s: s.state is SessionState.CONNECTED)
            preparing = await cloudly.call_agent(METHOD_PREPARE, world.prepare_body())
            assert preparing["state"]["status"] == "preparing"
            prepared = await _settled(cloudly, world)
            assert prepared["status"] == "prepared"
            marker, sink = cloudly.open_send_stream()
            body = {**world.stage_body(path, prepared["revision"]), "archive": marker}
            call = group.create_task(cloudly.call_agent(METHOD_STAGE, body))
            for start in range(0, len(data), 50_000):
                await sink.write(data[start : start + 50_000])
            await sink.close()
            staged = (await call)["state"]
            status_reply = await cloudly.call_agent(METHOD_GET_STATUS, world.status_body())
            stop.set()
        assert agent.result() is None
    assert status_reply == {"found": True, "state": staged}
    assert staged["revision"] == 3
    assert world.corestore.faults.hits["put-chunk"] == 3
    staged_bytes = world.staged_file(path).read_bytes()
    assert hashlib.sha256(staged_bytes).digest() == hashlib.sha256(data).digest()
    async with await RevisionStore.open(tmp_path / "state") as store:
        kept = await store.get(world.KEY)
    assert kept is not None
    assert (kept.revision, kept.status) == (3, "staging")
