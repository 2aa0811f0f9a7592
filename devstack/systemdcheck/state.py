"""The checks of the node's own state under the unit: a full state disk and a damaged database.

    state-full     the state directory (a copy of it) on a full 8 MiB tmpfs: a restart leaves
                   the agent up,
                   not ready (`state-unwritable`), the same process for longer than the start
                   limit's five restarts would take, no restart; once there is room it opens
                   a state and connects by itself (docs/operations.md, "A full or read-only
                   state disk")
    state-damaged  2 KiB overwritten in `state.sqlite3` (in the page that roots the restores'
                   table: a page in use, so the damage is never a free page SQLite does not
                   read): exit 65, failed with no restart,
                   the refusal's line at priority err, `restore-agent status` says why it is
                   down; `restore-agent state salvage` and a start bring it back connected

Each takes the `Node` and returns what it saw, or raises `CheckFailed`; each leaves the unit
running on its own state directory as it found it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
from pathlib import Path
from typing import Any, Final

import aiohttp

from devstack.systemdcheck.node import AGENT, CONFIG, HEALTH_SOCKET, Node
from devstack.systemdcheck.systemd import CheckFailed, journal_cursor, run, until

__all__ = ["state_damaged", "state_full"]

_STATE: Final = Path("/var/lib/private/restore-agent")  # StateDirectory= under DynamicUser=
_DISK: Final = "8m"
_HELD_S: Final = 35.0  # longer than five restarts RestartSec=5 apart
_NOT_READY: Final = "not ready: the node's state cannot be written (disk-full); retrying"


async def _readyz() -> tuple[int, dict[str, Any]]:
    connector = aiohttp.UnixConnector(path=HEALTH_SOCKET)
    async with (
        aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=10)) as s,
        s.get("http://agent/readyz") as answer,
    ):
        return answer.status, await answer.json()


def _fill(directory: Path) -> None:
    """Write a filler until the file system refuses (ENOSPC)."""
    with (directory / ".filler").open("ab", buffering=0) as filler:
        for size in (65536, 4096, 512, 1):
            try:
                while True:
                    filler.write(b"\0" * size)
            except OSError as exc:
                if exc.errno != 28:  # ENOSPC
                    raise


async def state_full(node: Node) -> str:
    """The state directory on a full tmpfs: up, not ready, no restart; then connected."""
    copy = node.workdir / "state-copy"
    (await node.unit.systemctl("stop")).expect()
    # The agent's own state (its key, its enrollment, its restores), copied onto the small
    # disk: the one underneath comes back unchanged once it is unmounted.
    (await run("rm", "-rf", str(copy))).expect()
    (await run("cp", "-a", str(_STATE), str(copy))).expect()
    options = f"size={_DISK},mode=0700"
    (await run("mount", "-t", "tmpfs", "-o", options, "tmpfs", str(_STATE))).expect()
    mounted = True
    try:
        (await run("cp", "-a", f"{copy}/.", str(_STATE))).expect()
        _fill(_STATE)
        await node.unit.systemctl("reset-failed")
        (await node.unit.systemctl("restart")).expect()
        shown = await node.status_shown(lambda text: text == _NOT_READY, "STATUS= not ready")
        pid = await node.main_pid()
        restarts = await node.unit.prop("NRestarts")
        status, body = await until(_readyz_answer, timeout=30, what="/readyz over the socket")
        if status != 503 or "state-unwritable" not in body.get("reasons", {}):
            raise CheckFailed(f"/readyz answered {status} {body.get('reasons')}")
        # Not a synchronisation: the window in which five restarts would have happened.
        await asyncio.sleep(_HELD_S)
        values = await node.unit.show("MainPID", "NRestarts", "ActiveState", "SubState")
        held = (values["ActiveState"], values["SubState"], int(values["MainPID"] or 0))
        if held != ("active", "running", pid) or values["NRestarts"] != restarts:
            raise CheckFailed(f"after {_HELD_S:g} s on the full disk: {values}")
        (_STATE / ".filler").unlink()
        text = await node.connected(timeout=60)
        after = await node.unit.show("MainPID", "NRestarts")
        if int(after["MainPID"]) != pid or after["NRestarts"] != restarts:
            raise CheckFailed(f"the agent was restarted to connect: {after}")
        (await node.unit.systemctl("stop")).expect()
        (await run("umount", str(_STATE))).expect()
        mounted = False
    finally:
        if mounted:
            await node.unit.systemctl("stop")
            await run("umount", "-l", str(_STATE))
        await run("rm", "-rf", str(copy))
    back = await node.start()
    return (
        f"state on a full {_DISK} tmpfs: `{shown}`, /readyz 503 state-unwritable, PID {pid}"
        f" unchanged and NRestarts {restarts} after {_HELD_S:g} s; room made: {text} (same"
        f" PID, no restart); own state again: {back}"
    )


async def _readyz_answer() -> tuple[int, dict[str, Any]] | None:
    try:
        return await _readyz()
    except (aiohttp.ClientError, OSError):
        return None


def _page_in_use(database: Path) -> int:
    """The offset of the root page of the restores' table (the agent is stopped: its WAL is
    checkpointed into the file)."""
    with contextlib.closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as db:
        [(page_size,)] = db.execute("PRAGMA page_size").fetchall()
        [(root,)] = db.execute(
            "SELECT rootpage FROM sqlite_schema WHERE name = 'restore_state'"
        ).fetchall()
    return int(page_size) * (int(root) - 1)


async def state_damaged(node: Node) -> str:
    """A damaged database: exit 65, not restarted, why in `status`; salvage, connected."""
    (await node.unit.systemctl("stop")).expect()
    database = _STATE / "state.sqlite3"
    offset = _page_in_use(database)
    with database.open("r+b") as raw:
        raw.seek(offset)
        raw.write(b"\xa5" * 2048)
    cursor = await journal_cursor()
    await node.unit.systemctl("reset-failed")
    await node.unit.systemctl("start")

    async def settled() -> dict[str, str] | None:
        values = await node.unit.show("ActiveState", "SubState", "Result", "ExecMainStatus")
        final = values["ActiveState"] in ("failed", "inactive")
        return values if final or values["SubState"] == "auto-restart" else None

    values = await until(settled, timeout=60, what="the damaged start to end")
    seen = (values["ActiveState"], values["SubState"], values["Result"], values["ExecMainStatus"])
    if seen != ("failed", "failed", "exit-code", "65"):
        raise CheckFailed(
            "{}/{}, Result={}, exit status {}: not failed for good with 65".format(*seen)
        )

    async def refusal() -> str | None:
        entries = await node.unit.journal(after=cursor, priority="err")
        return next((e.message for e in entries if "is damaged" in e.message), None)

    line = await until(refusal, timeout=15, what="the refusal at priority err")
    status = await run(str(AGENT), "status", "--config", str(CONFIG), timeout=30)
    if status.code != 1 or "(exit 65): restore-agent: the state database" not in status.out:
        raise CheckFailed(f"status said {status.code}: {status.out.strip()} {status.err.strip()}")
    salvaged = await run(str(AGENT), "state", "salvage", "--config", str(CONFIG), timeout=300)
    if salvaged.code != 0 or "TABLE" not in salvaged.out:
        raise CheckFailed(f"salvage exited {salvaged.code}: {salvaged.err.strip()}")
    record = json.loads((_STATE / "state-recovery.json").read_text())
    owner = os.stat(database).st_uid == os.stat(_STATE).st_uid
    back = await node.start()
    kept = sum(int(count["kept"]) for count in record["counts"].values())
    return (
        f"exit 65, failed, no restart; -p err: `{line[:90]}...`; status: "
        f"`{status.out.strip()[:60]}...`; salvage kept {kept} rows (owner kept: {owner});"
        f" started: {back}"
    )
