"""Specification of start-up on a state the agent cannot use as it is:

- a full (or read-only) state disk: the agent stays up, not ready (`state-unwritable`),
  serving health, and tries again after a backoff on its clock until the disk takes writes,
  then starts; never a crash, never an exit systemd would count (agent/startup/opening.py);
- a damaged state database: one fatal line naming the file and the way out, exit 65 (the
  unit's `RestartPreventExitStatus=`), at every start, and the record `status` prints;
- a state database a newer agent migrated: one line naming both schema versions and the way
  back, exit 2, no traceback.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import structlog

from agent.config import load_config
from agent.entry import app
from agent.errors import StateUnwritable, StoreError
from agent.retry import Backoff
from agent.startup.opening import open_waiting
from agent.store import DB_NAME, RevisionStore, statedir
from agent.store.schema import SCHEMA_VERSION
from agent.watch.status import AgentStatus
from tests.clock import ManualClock
from tests.disk import small_disk
from tests.processes import agent_environ, run_agent

REPO = Path(__file__).resolve().parents[1]
NOWHERE = "wss://cloudly.invalid"


def _config(tmp_path: Path, state: Path) -> Path:
    token = tmp_path / "machine-token"
    token.write_text("state-startup-token-1f2e3d\n")
    token.chmod(0o600)
    credential = tmp_path / "corestore-credential"
    credential.write_text("state-startup-credential-4a5b\n")
    credential.chmod(0o600)
    path = tmp_path / "agent.toml"
    path.write_text(
        "\n".join(
            [
                "[cloudly]",
                f'url = "{NOWHERE}"',
                f'token_file = "{token}"',
                "[corestore]",
                'credential_source = "file"',
                f'credential_file = "{credential}"',
                "[state]",
                f'directory = "{state}"',
                "[health]",
                'listen = "127.0.0.1:0"',
                "[log]",
                'format = "json"',
            ]
        )
        + "\n"
    )
    return path


# --- the wait itself (agent/startup/opening.py) ---------------------------------------------------


async def test_the_open_is_tried_again_after_a_backoff_on_the_clock() -> None:
    """Each refusal is told with its count, then the clock's backoff passes before the next
    try; the answer of the try that worked is returned."""
    clock, stop = ManualClock(), asyncio.Event()
    tries: list[float] = []
    told: list[int] = []

    async def attempt() -> str:
        tries.append(clock.monotonic())
        if len(tries) < 3:
            raise StateUnwritable("full", cause="disk-full")
        return "opened"

    task = asyncio.create_task(
        open_waiting(
            attempt,
            clock=clock,
            stop=stop,
            refused=lambda _, failures: told.append(failures),
            backoff=Backoff(base=1.0, cap=30.0),
            rng=lambda: 1.0,
        )
    )
    for _ in range(2):
        await clock.run_until_sleeping()  # the end of the opener's wait, no real time passing
    assert await task == "opened"
    assert told == [1, 2]
    assert tries == [0.0, 1.0, 3.0]  # 1 s, then 2 s: the backoff, on the clock


async def test_stop_ends_the_wait_at_once() -> None:
    """SIGTERM while waiting for the disk: None, no further try."""
    clock, stop = ManualClock(), asyncio.Event()
    tries = 0

    async def attempt() -> str:
        nonlocal tries
        tries += 1
        raise StateUnwritable("full", cause="disk-full")

    task = asyncio.create_task(
        open_waiting(attempt, clock=clock, stop=stop, refused=lambda *_: None)
    )
    await clock.next_wakeup()  # the opener waits now
    stop.set()
    assert await task is None
    assert tries == 1


async def test_any_other_refusal_is_raised_as_it_is() -> None:
    """Only a disk that refuses writes is waited out: a store error is raised at once."""

    async def attempt() -> str:
        raise StoreError("locked")

    with pytest.raises(StoreError, match="locked"):
        await open_waiting(
            attempt, clock=ManualClock(), stop=asyncio.Event(), refused=lambda *_: None
        )


# --- the agent on a full state disk -------------------------------------------------------------


async def _get(address: str, path: str) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"http://{address}{path}") as response,
    ):
        return response.status, await response.json()


async def test_on_a_full_state_disk_the_agent_stays_up_not_ready_then_starts(
    tmp_path: Path,
) -> None:
    """The state directory on a tmpfs with no room: the agent does not crash. It says it is
    up (on_ready), /healthz answers 200, /readyz 503 with `state-unwritable` (disk-full); the
    error line names the cause once. Once there is room, the next try on its clock opens the
    state and the agent starts (its start-up line), ready as far as the state goes."""
    clock, stop, status = ManualClock(), asyncio.Event(), AgentStatus()
    ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    with small_disk(tmp_path / "state", 1024 * 1024) as disk:
        config = load_config(_config(tmp_path, disk.path))
        disk.fill()
        with structlog.testing.capture_logs() as logs:
            task = asyncio.create_task(
                app.run(
                    config,
                    stop=stop,
                    status=status,
                    clock=clock,
                    handle_signals=False,
                    on_ready=lambda address: ready.set_result(address),
                )
            )
            try:
                async with asyncio.timeout(15):
                    address = await asyncio.shield(ready)
                    healthz = await _get(address, "/healthz")
                    readyz = await _get(address, "/readyz")
                    assert not task.done()
                    disk.free()
                    await clock.run_until_sleeping()
                    await status.wait_until(lambda s: "state-unwritable" not in s.conditions)
                    after = await _get(address, "/readyz")
            finally:
                stop.set()
                async with asyncio.timeout(15):
                    await task
    assert healthz[0] == 200
    assert readyz[0] == 503
    assert readyz[1]["reasons"]["state-unwritable"] == (
        "the node's state cannot be written (disk-full)"
    )
    assert readyz[1]["reasons"]["store"] == "the revision store is not open"
    assert "state-unwritable" in readyz[1]["conditions"]
    assert "state-unwritable" not in after[1]["reasons"]
    assert "store" not in after[1]["reasons"]
    [line] = [entry for entry in logs if entry["event"] == "state_unwritable_at_start"]
    assert line["log_level"] == "error"
    assert line["cause"] == "disk-full"
    events = [entry["event"] for entry in logs]
    assert events.index("state_writable_at_start") < events.index("agent_starting")


# --- a damaged state database -------------------------------------------------------------------


def _fill_and_damage(state: Path) -> Path:
    """A database of 300 restores (plans included), 2 KiB overwritten in the middle."""
    script = (
        "import asyncio, sys\n"
        "from pathlib import Path\n"
        "from agent.store import RevisionStore\n"
        "from agent.domain.restores import RestoreKey\n"
        "from agent.domain.restore_machine import Op\n"
        "from tests.store.states import node_state, plan\n"
        "async def main():\n"
        "    async with await RevisionStore.open(Path(sys.argv[1])) as store:\n"
        "        for n in range(300):\n"
        "            key = RestoreKey('cluster-1', 'node-1', f'restore-{n:04}')\n"
        "            await store.mutate(key, expected_revision=0, op=Op.PREPARE,\n"
        "                state=node_state(key, last_error_message='x' * 200), plan=plan())\n"
        "        await store.checkpoint()\n"
        "asyncio.run(main())\n"
    )
    subprocess.run(
        [sys.executable, "-c", script, str(state)],
        check=True,
        cwd=REPO,
        env=agent_environ(),
    )
    path = state / DB_NAME
    size = path.stat().st_size
    with path.open("r+b") as raw:
        raw.seek(size // 2)
        raw.write(b"\xa5" * 2048)
    return path


def test_a_damaged_database_refuses_start_up_with_exit_65_at_every_start(
    tmp_path: Path,
) -> None:
    """2 KiB overwritten in state.sqlite3: `run` prints one line naming the file and the way
    out, exits 65 (not restarted by the unit), and does the same at the next start: no empty
    database takes the damaged one's place, and the file is left as it was."""
    path = _fill_and_damage(tmp_path / "state")
    damaged = path.read_bytes()
    config = _config(tmp_path, tmp_path / "state")
    for _ in range(2):
        ran = run_agent("run", "--config", str(config))
        assert ran.returncode == 65, ran.stderr
        assert "Traceback" not in ran.stderr
        [line] = ran.stderr.splitlines()
        assert line.startswith(f"restore-agent: the state database {path} is damaged (")
        assert "restore-agent state salvage --config PATH" in line
        assert "restore-agent state reset --config PATH --start-empty" in line
    assert path.read_bytes() == damaged
    names = sorted(p.name for p in (tmp_path / "state").iterdir() if "sqlite3" in p.name)
    assert names == [DB_NAME]


def test_status_says_why_the_agent_is_down(tmp_path: Path) -> None:
    """With no agent answering, `status` reads the refusal's record from the state directory:
    down, exit 65, the very line; `--json` has it under `down`. A start that opens the state
    removes the record."""
    _fill_and_damage(tmp_path / "state")
    config = _config(tmp_path, tmp_path / "state")
    ran = run_agent("run", "--config", str(config))
    # The config listens on port 0: status cannot ask an agent there, it reads the record.
    shown = run_agent("status", "--config", str(config))
    as_json = run_agent("status", "--config", str(config), "--json")
    assert shown.returncode == 1
    assert shown.stdout.startswith("agent:    down since ")
    assert "(exit 65): " + ran.stderr.strip() in shown.stdout
    down = json.loads(as_json.stdout)["down"]
    assert (down["reason"], down["exitCode"]) == ("state-damaged", 65)
    assert down["message"] == ran.stderr.strip()
    statedir.clear_down(tmp_path / "state")
    assert statedir.read_down(tmp_path / "state") is None


def test_a_database_a_newer_agent_migrated_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """Both schema versions and the way back in one line, exit 2, no traceback; the file is
    left as it is."""
    state = tmp_path / "state"

    async def make() -> None:
        async with await RevisionStore.open(state):
            pass

    asyncio.run(make())
    with sqlite3.connect(state / DB_NAME) as raw:
        raw.execute("INSERT INTO schema_version VALUES (?, 0)", (SCHEMA_VERSION + 1,))
    raw.close()
    config = _config(tmp_path, state)
    ran = run_agent("run", "--config", str(config))
    assert ran.returncode == 2, ran.stderr
    assert "Traceback" not in ran.stderr
    [line] = ran.stderr.splitlines()
    assert line == (
        f"restore-agent: the state database has schema version {SCHEMA_VERSION + 1}, newer "
        f"than this agent's {SCHEMA_VERSION}: a newer agent migrated it; install that newer "
        "agent again (the version that wrote it) rather than this one, the database is left "
        "as it is"
    )
    down = statedir.read_down(state)
    assert down is not None
    assert (down["reason"], down["exitCode"]) == ("state-newer", 2)
