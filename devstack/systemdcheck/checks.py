"""The checks of the unit under a real systemd, in the order they run, and their report.

`CHECKS` is the one table: name, what it proves, the check (`service.py`, `topology.py`,
`daytwo.py`, `lifecycle.py`...). Each prints one line, `PASS  name  what was seen` or
`FAIL  name  what was seen instead`, appended to the results file the host script counts. After
a failed check a recovery (no drop-in, the good configuration, `reset-failed`, start,
connected) lets the next one start from a running unit; when the install fails, or a recovery
does, the rest is not run (the host counts those as failed). `reboot` runs in the machine
booted again (`after_reboot`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Final

from devstack.systemdcheck import daytwo, lifecycle, service, state
from devstack.systemdcheck.memory import memory
from devstack.systemdcheck.node import CONFIG, DROP_IN, Node
from devstack.systemdcheck.stack import Stack
from devstack.systemdcheck.systemd import CheckFailed, run
from devstack.systemdcheck.topology import topology

__all__ = ["CHECKS", "Report", "after_reboot", "run_checks"]

Check = Callable[[Node], Awaitable[str]]

CHECKS: Final[tuple[tuple[str, str, Check], ...]] = (
    ("install", "readme.md's 'Install on a node', steps 1-5 as written", service.install),
    ("ready", "READY=1: active (running); systemctl status shows STATUS=", service.ready),
    ("status-down", "STATUS= while Cloudly is down", service.status_down),
    ("status-token", "STATUS= after a refused machine token", service.status_token),
    ("restore", "an isolated restore through the unit, to cleaned", service.restore),
    ("relay", "a service backup and restore through the unit", service.relay),
    ("memory", "16 stages over 4 nodes under MemoryHigh=/MemoryMax=: no OOM kill", memory),
    (
        "credentials",
        "the token: 0400, the dynamic user's, not in environ/argv",
        service.credentials,
    ),
    ("security", "systemd-analyze security of the loaded unit <= 1.5", service.security),
    ("journal-warning", "-p warning: the agent's warnings, no info", service.journal_warning),
    (
        "topology",
        "a second agent with the same token: duplicate-agent; stopped, ready again",
        topology,
    ),
    ("runbooks", "docs/operations.md's runbook blocks run as written", daytwo.runbooks),
    (
        "token-rotation",
        "'Rotating the machine token' as written: checked, restarted, ready",
        daytwo.token_rotation,
    ),
    ("rotate-key", "rotate-key as root: the unit's user's key, enrolled, ready", daytwo.rotate_key),
    (
        "upgrade",
        "A -> B (a migration more) -> rollback to A, as written; no work lost",
        daytwo.upgrade,
    ),
    ("exit-2", "a broken config exits 2 and is not restarted", lifecycle.exit_2),
    ("journal-fatal", "-p warning shows the broken config's line", lifecycle.journal_fatal),
    ("state-full", "a full state disk: up, not ready, no restart", state.state_full),
    ("state-damaged", "a damaged state: exit 65, status, salvage", state.state_damaged),
    ("syscall-kill", "SystemCallErrorNumber=kill: no status=31/SYS", lifecycle.syscall_kill),
    ("stop-drain", "stop during a large stage: bounded, exit 0, resumes", lifecycle.stop_drain),
    ("watchdog", "SIGSTOP: Watchdog timeout, restart, connected", lifecycle.watchdog),
    ("sigkill", "Restart=on-failure after SIGKILL", lifecycle.sigkill),
    ("start-limit", "the start limit holds", lifecycle.start_limit),
    ("reboot", "after a reboot the enabled unit runs and connects", lifecycle.rebooted),
)
_LIMIT_S: Final = {
    "install": 900.0,
    "upgrade": 1800.0,
}  # each check's overall deadline; the rest 240 s


class Report:
    """Prints each check's line and appends it to the results file."""

    def __init__(self, results: Path) -> None:
        self._results = results

    def record(self, name: str, passed: bool, detail: str) -> None:
        """One line for `name`."""
        line = f"{'PASS' if passed else 'FAIL'}  {name:<16} {' '.join(detail.split())}"
        print(line, flush=True)
        with self._results.open("a") as handle:
            handle.write(line + "\n")


async def attempt(report: Report, name: str, check: Check, node: Node) -> bool:
    """Run one check with its deadline and record its line."""
    try:
        async with asyncio.timeout(_LIMIT_S.get(name, 240.0)):
            detail = await check(node)
    except CheckFailed as exc:
        report.record(name, False, str(exc))
        return False
    except TimeoutError:
        report.record(name, False, f"did not finish within {_LIMIT_S.get(name, 240.0):g} s")
        return False
    except Exception as exc:  # noqa: BLE001  # whatever breaks a check is that check's verdict
        report.record(name, False, f"{type(exc).__name__}: {exc}")
        return False
    report.record(name, True, detail)
    return True


async def recover(node: Node) -> bool:
    """The unit back to running and connected with the good configuration."""
    try:
        DROP_IN.unlink(missing_ok=True)
        await run("systemctl", "daemon-reload")
        if node.good_config is not None:
            CONFIG.write_text(node.good_config)
        await node.start()
    except CheckFailed as exc:
        print(f"recovery failed: {exc}", flush=True)
        return False
    return True


async def run_checks(checkout: Path, workdir: Path, results: Path) -> None:
    """Every check before the reboot, in order."""
    report = Report(results)
    stack = await Stack.start(workdir)
    try:
        node = Node(checkout, workdir, stack)
        for name, _, check in CHECKS:
            if name == "reboot":
                lifecycle.save_for_reboot(node)
                break
            if not await attempt(report, name, check, node) and (
                name == "install" or not await recover(node)
            ):
                break
    finally:
        await stack.stop()


async def after_reboot(checkout: Path, workdir: Path, results: Path) -> None:
    """The `reboot` check, in the machine booted again (the stand-ins back on their ports)."""
    stack = await Stack.start(workdir, saved=True)
    try:
        await attempt(Report(results), "reboot", lifecycle.rebooted, Node(checkout, workdir, stack))
    finally:
        await stack.stop()
