"""`Node`: the machine the checks act on: the installed unit, its configuration, the stand-ins,
and what the checks learn on the way (the good configuration, journal cursors, the last restore).

Its helpers are the moves every check makes: start the unit (after `reset-failed`: the start
limit counts every start), wait until STATUS= says connected, read what `systemctl status`
shows, wait for a restart under a new PID, drive a restore or a service backup and restore
through the unit, read one of the agent's metrics over its health socket.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

import aiohttp

from devstack.corestore.services import RELAY_ENTRIES
from devstack.corestore.storage import Storage, sha256_file
from devstack.demo_relay import SERVICE_ID, backup_and_restore
from devstack.driver import MiB, RestoreDriver, RestorePlan, demo_plan
from devstack.systemdcheck.stack import NODE, Stack
from devstack.systemdcheck.systemd import CheckFailed, Unit, parse_timespan, until

__all__ = [
    "AGENT",
    "CONFIG",
    "CONNECTED",
    "DROP_IN",
    "HEALTH_SOCKET",
    "SMALL",
    "UNIT",
    "UNREACHABLE",
    "Node",
    "expect_status",
]

UNIT: Final = "restore-agent.service"
CONFIG: Final = Path("/etc/restore-agent/config.toml")
AGENT: Final = Path("/opt/restore-agent/venv/bin/restore-agent")
HEALTH_SOCKET: Final = "/run/restore-agent/health.sock"
DROP_IN: Final = Path(f"/etc/systemd/system/{UNIT}.d/50-syscall-kill.conf")
CONNECTED: Final = "connected to Cloudly"
UNREACHABLE: Final = "Cloudly unreachable since "
SMALL: Final = 32 * MiB  # the volume image of a scenario restore
_CLOSURE: Final = 8 * MiB  # the service database of a scenario backup


@dataclass(slots=True)
class Node:
    """The installed unit and the stand-ins it works against (see the module docstring)."""

    checkout: Path
    workdir: Path
    stack: Stack
    unit: Unit = field(default_factory=lambda: Unit(UNIT))
    good_config: str | None = None  # the configuration after the operator's edit
    installed_at: str | None = None  # journal cursor from before the install
    broken_start: tuple[str | None, str] | None = None  # (cursor, the line `run` printed)
    restarts_since_reset: int | None = None  # automatic restarts since the start limit reset
    last_restore: dict[str, Any] | None = None  # {restore_id, revision} of the last cleaned

    # --- the unit -------------------------------------------------------------------------

    async def start(self, verb: str = "start") -> str:
        """`reset-failed`, then `systemctl start` (or `restart`); the STATUS= once connected."""
        await self.unit.systemctl("reset-failed")
        (await self.unit.systemctl(verb)).expect()
        return await self.connected()

    async def connected(self, timeout: float = 30.0) -> str:  # noqa: ASYNC109
        """The STATUS= text once it says connected while the unit is active."""

        async def probe() -> str | None:
            values = await self.unit.show("ActiveState", "StatusText")
            text = values.get("StatusText", "")
            active = values.get("ActiveState") == "active"
            return text if active and text.startswith(CONNECTED) else None

        return await until(probe, timeout=timeout, what="the unit connected to Cloudly")

    async def status_shown(self, accept: Callable[[str], bool], what: str) -> str:
        """The `Status: "..."` text of `systemctl status` once `accept` takes it, shown while
        the unit is active (running)."""

        async def probe() -> str | None:
            out = (await self.unit.systemctl("status", "--full", "--lines=0")).out
            match = re.search(r'^\s*Status: "(.*)"$', out, re.MULTILINE)
            running = re.search(r"^\s*Active: active \(running\)", out, re.MULTILINE)
            return match.group(1) if match and running and accept(match.group(1)) else None

        return await until(probe, timeout=30, what=what)

    async def main_pid(self) -> int:
        """The unit's main PID (`CheckFailed` when it has none)."""
        pid = int(await self.unit.prop("MainPID") or 0)
        if pid <= 0:
            raise CheckFailed("the unit has no main process")
        return pid

    async def restarted(self, old_pid: int, timeout: float) -> int:  # noqa: ASYNC109
        """The new main PID once the unit runs again under another process."""

        async def probe() -> int | None:
            values = await self.unit.show("MainPID", "ActiveState", "SubState")
            pid = int(values.get("MainPID") or 0)
            running = (values.get("ActiveState"), values.get("SubState")) == ("active", "running")
            return pid if running and pid not in (0, old_pid) else None

        return await until(probe, timeout=timeout, what="the unit running again")

    async def seconds(self, prop: str) -> float:
        """A time span property of the unit (`WatchdogUSec`, `RestartUSec`...) in seconds."""
        return parse_timespan(await self.unit.prop(prop))

    async def metric(self, name: str) -> float:
        """One unlabelled sample of the agent's /metrics (over its health socket)."""
        connector = aiohttp.UnixConnector(path=HEALTH_SOCKET)
        timeout = aiohttp.ClientTimeout(total=10)
        async with (
            aiohttp.ClientSession(connector=connector, timeout=timeout) as session,
            session.get("http://agent/metrics") as answer,
        ):
            text = await answer.text()
        match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
        if match is None:
            raise CheckFailed(f"/metrics has no {name}")
        return float(match.group(1))

    # --- Cloudly's side ---------------------------------------------------------------------

    def plan(self, suffix: str, big: int) -> RestorePlan:
        """The demo plan under ids of its own (each scenario is a new restore)."""
        return replace(
            demo_plan(big_size=big),
            restore_id=f"restore-{suffix}",
            staging_archive_id=f"staging-{suffix}",
            scratch_namespace_id=f"scratch-{suffix}",
        )

    def driver(self, plan: RestorePlan, **options: Any) -> RestoreDriver:
        """A driver of `plan` through the stand-in Cloudly (3 retries unless told)."""
        options.setdefault("retries", 3)
        return RestoreDriver(self.stack.cloudly, plan, poll_interval=0.05, **options)

    async def finish_restore(self, driver: RestoreDriver) -> tuple[int, int]:
        """Execute, `ready`, each object's sha256 on Corestore's disk, cleanup, `cleaned`,
        nothing of it left; the revisions at `ready` and at `cleaned`."""
        await driver.execute()
        state = await driver.wait_until({"ready", "failed"})
        expect_status(state, "ready")
        ready = int(state["revision"])
        await asyncio.to_thread(_verify_on_disk, self.stack.corestore.data_dir, driver.plan)
        await driver.cleanup()
        state = await driver.wait_until({"cleaned", "cleanup-failed"})
        expect_status(state, "cleaned")
        left = await asyncio.to_thread(_leftovers, self.stack.corestore.data_dir)
        if left:
            raise CheckFailed(f"cleanup left {len(left)} file(s) on Corestore, e.g. {left[0]}")
        self.last_restore = {"restore_id": driver.plan.restore_id, "revision": state["revision"]}
        return ready, int(state["revision"])

    async def restore_scenario(self, suffix: str) -> str:
        """A whole isolated restore of the demo plan (a small volume image), to `cleaned`."""
        plan = self.plan(suffix, SMALL)
        driver = self.driver(plan)
        expect_status(await driver.prepare(), "prepared")
        started = time.monotonic()
        await driver.stage_all()
        staged_s = time.monotonic() - started
        total = sum(spec.size for spec in plan.objects)
        ready, cleaned = await self.finish_restore(driver)
        return (
            f"{plan.restore_id}: {len(plan.objects)} objects ({total / MiB:.0f} MiB) staged in"
            f" {staged_s:.1f} s, ready at revision {ready} (each object's sha256 checked on"
            f" Corestore's disk), cleaned at revision {cleaned}, nothing of it left on Corestore"
        )

    async def relay_scenario(self, suffix: str) -> str:
        """A service backup (its database closure to the stand-in Cloudly) and its restore
        into a fresh database, byte-identical."""
        moved = await backup_and_restore(
            self.stack.cloudly,
            self.stack.corestore,
            NODE,
            _CLOSURE,
            lambda *args, **fields: None,
            backup_id=f"backup-{suffix}",
        )
        return (
            f"backup-{suffix} of {SERVICE_ID}: its {_CLOSURE // MiB} MiB database closure held by"
            f" Cloudly (sha256 {moved['closure_sha256'][:12]}...), restored byte-identical into"
            " a fresh database"
        )


def expect_status(state: Mapping[str, Any], status: str) -> None:
    """`CheckFailed` unless the node state has `status`."""
    if state.get("status") != status:
        error = state.get("lastErrorCode") or "no error code"
        raise CheckFailed(f"expected {status}, got {state.get('status')} ({error})")


def _verify_on_disk(data_dir: Path, plan: RestorePlan) -> None:
    storage = Storage(data_dir)
    for spec in plan.objects:
        found = sha256_file(storage.object_path(plan.staging_archive_id, spec.path))
        if found != (spec.size, spec.sha256):
            raise CheckFailed(f"{spec.path} on Corestore's disk does not match its sha256")


def _leftovers(data_dir: Path) -> list[str]:
    """Files of isolated restores on Corestore's disk (the relay's service data aside)."""
    files = Storage(data_dir).files()
    return [path for path in files if path.split("/")[0] not in RELAY_ENTRIES]
