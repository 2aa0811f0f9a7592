"""The checks of the unit's life cycle: a broken configuration (exit 2, its journal line), the
hardening with `SystemCallErrorNumber=kill`, the drain on `systemctl stop`, the watchdog,
restarts and the start limit, and the machine's reboot.

Each takes the `Node` and returns what it saw, or raises `CheckFailed`. The waits are bounded
by the unit's own settings (`WatchdogSec=`, `RestartSec=`, `TimeoutStopSec=`) plus a margin.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

from agent.config import ShutdownConfig
from agent.startup.preflight import longest_stop
from devstack.corestore.storage import Storage
from devstack.driver import MiB, StageProgress, demo_plan
from devstack.systemdcheck.node import AGENT, CONFIG, DROP_IN, SMALL, Node, expect_status
from devstack.systemdcheck.systemd import (
    CheckFailed,
    JournalEntry,
    cgroup_hierarchy,
    journal_cursor,
    parse_timespan,
    process_state,
    run,
    until,
)

__all__ = [
    "exit_2",
    "journal_fatal",
    "rebooted",
    "save_for_reboot",
    "start_limit",
    "stop_drain",
    "syscall_kill",
    "watchdog",
]

_DEACTIVATED: Final = "Deactivated successfully"  # systemd: stopped, Result=success
_EXITED: Final = "1"  # ExecMainCode: CLD_EXITED
_FAILED: Final = "Failed with result"
_LARGE: Final = 1024 * MiB  # the object staged during the stop (outlasts the 5 s drain here)
_UNDER_WAY: Final = 64 * MiB  # stop once this much of it was sent


async def exit_2(node: Node) -> str:
    """An unknown key: the unit exits 2 and systemd schedules no restart."""
    good = node.good_config or CONFIG.read_text()
    broken = good.replace("\n[health]\n", "\n[health]\nlisten_port = 9733\n", 1)
    if broken == good:
        raise CheckFailed("the configuration has no [health] section to break")
    CONFIG.write_text(broken)
    try:
        # The line `run` prints for this config, outside the unit (it stops at the config).
        direct = await run(str(AGENT), "run", "--config", str(CONFIG), timeout=30)
        if direct.code != 2 or not direct.err.strip():
            raise CheckFailed(f"the broken config gave exit {direct.code}, not 2 and a line")
        node.broken_start = (await journal_cursor(), direct.err.strip().splitlines()[-1])
        await node.unit.systemctl("reset-failed")
        await node.unit.systemctl("restart")  # fails: the unit exits 2

        async def settled() -> dict[str, str] | None:
            values = await node.unit.show("ActiveState", "SubState", "Result", "ExecMainStatus")
            final = values["ActiveState"] in ("failed", "inactive")
            return values if final or values["SubState"] == "auto-restart" else None

        values = await until(settled, timeout=30, what="the broken start to end")
    finally:
        CONFIG.write_text(good)
    seen = (values["ActiveState"], values["SubState"], values["Result"], values["ExecMainStatus"])
    if seen != ("failed", "failed", "exit-code", "2"):
        raise CheckFailed(
            "{}/{}, Result={}, exit status {}: not failed for good with exit 2".format(*seen)
        )
    back = await node.start()
    return (
        "an unknown key: exit status 2, failed (Result=exit-code) with no restart scheduled"
        f" (RestartPreventExitStatus=2); the config fixed and started: {back}"
    )


async def journal_fatal(node: Node) -> str:
    """`journalctl -u restore-agent -p warning` shows the line a broken config stopped on."""
    if node.broken_start is None:
        raise CheckFailed("needs the broken start of exit-2")
    cursor, line = node.broken_start

    async def logged() -> JournalEntry | None:
        entries = await node.unit.journal(after=cursor)
        return next((entry for entry in entries if _same_line(entry.message, line)), None)

    entry = await until(logged, timeout=15, what=f"`{line}` in the unit's journal")
    shown = await node.unit.journal(after=cursor, priority="warning")
    if not any(_same_line(item.message, line) for item in shown):
        raise CheckFailed(
            f"`{line}` reached the journal at priority {entry.priority}: journalctl -u"
            " restore-agent -p warning does not show it"
        )
    return f"`{line}` at priority {entry.priority}, shown by journalctl -p warning"


def _same_line(message: str, line: str) -> bool:
    """The same text, or the same JSON record but for its timestamp."""
    if message == line:
        return True
    try:
        ours, theirs = json.loads(message), json.loads(line)
    except ValueError:
        return False
    if not isinstance(ours, dict) or not isinstance(theirs, dict):
        return False
    ours.pop("timestamp", None)
    theirs.pop("timestamp", None)
    return bool(ours == theirs)


async def syscall_kill(node: Node) -> str:
    """A copy of the unit with `SystemCallErrorNumber=kill` (a drop-in) runs a restore and a
    service backup and restore and stops cleanly: no call outside the filter."""
    DROP_IN.parent.mkdir(parents=True, exist_ok=True)
    DROP_IN.write_text("[Service]\nSystemCallErrorNumber=kill\n")
    try:
        (await run("systemctl", "daemon-reload")).expect()
        if str(DROP_IN) not in await node.unit.prop("DropInPaths"):
            raise CheckFailed("systemd did not load the SystemCallErrorNumber=kill drop-in")
        cursor = await journal_cursor()
        await node.start("restart")
        restarts = await node.unit.prop("NRestarts")
        restored = await node.restore_scenario("kill")
        relayed = await node.relay_scenario("kill")
        restarted = await node.unit.prop("NRestarts")
        stopping = await journal_cursor()
        (await node.unit.systemctl("stop")).expect()
        killed = [
            entry.message
            for entry in await node.unit.journal(after=cursor)
            if "status=31/SYS" in entry.message or "SIGSYS" in entry.message
        ]
    finally:
        DROP_IN.unlink(missing_ok=True)
        await run("systemctl", "daemon-reload")
    if killed:
        raise CheckFailed(f"a system call killed the agent: {killed[0]}")
    if restarted != restarts:
        raise CheckFailed(f"the agent restarted ({restarts} -> {restarted})")
    await _expect_clean_stop(node, stopping)
    await node.start()
    return (
        f"with SystemCallErrorNumber=kill: {restored.split(':')[0]} ready and cleaned,"
        f" {relayed.split(' of ')[0]} backed up and restored, stopped with exit 0; no"
        " status=31/SYS, no restart"
    )


async def _expect_clean_stop(node: Node, cursor: str | None) -> None:
    """The stop after `cursor` was clean: the agent logged `agent_stopped` (the end of its
    ordered shutdown), systemd logged `Deactivated successfully` and neither `Main process
    exited` nor `Failed with result` (a timeout, a kill), and the exit status is 0. systemd's
    word comes from the journal: a unit nothing references is unloaded once stopped, and
    `systemctl show` then knows no exit status (when it does, it must say exited 0)."""

    async def ended() -> list[JournalEntry] | None:
        entries = await node.unit.journal(after=cursor)
        said = [entry.message for entry in entries if entry.pid == 1]
        return entries if any(_DEACTIVATED in text or _FAILED in text for text in said) else None

    entries = await until(ended, timeout=15, what="systemd's word on the stop")
    wrong = [
        entry.message
        for entry in entries
        if entry.pid == 1 and (_FAILED in entry.message or "Main process exited" in entry.message)
    ]
    if wrong:
        raise CheckFailed(f"the stop: {' / '.join(wrong)}")
    if not any((entry.agent_record() or {}).get("event") == "agent_stopped" for entry in entries):
        raise CheckFailed("the agent did not log agent_stopped: its shutdown did not finish")
    values = await node.unit.show("ExecMainPID", "ExecMainCode", "ExecMainStatus")
    if values["ExecMainPID"] != "0" and (values["ExecMainCode"], values["ExecMainStatus"]) != (
        _EXITED,
        "0",
    ):
        raise CheckFailed(
            f"the agent ended with code {values['ExecMainCode']}, status {values['ExecMainStatus']}"
        )


async def stop_drain(node: Node) -> str:
    """`systemctl stop` during a large stage ends within the drain and the close steps (and
    TimeoutStopSec=), exit 0; after `systemctl start` the restore resumes and finishes."""
    settings = tomllib.loads(CONFIG.read_text())
    chunk = int(settings.get("corestore", {}).get("chunk_size", 4 * MiB))
    shutdown = ShutdownConfig.model_validate(settings.get("shutdown", {}))
    drain = shutdown.drain_timeout_s
    # The agent's own arithmetic: the drain, then six close steps, each + 1 s of grace.
    bound = longest_stop(shutdown)
    stop_limit = await node.seconds("TimeoutStopUSec")
    plan = node.plan("drain", _LARGE)
    big = plan.objects[-1]
    under_way = asyncio.Event()

    path = big.path

    def watch(event: object) -> None:
        if (
            isinstance(event, StageProgress)
            and event.path == path
            and event.sent_bytes >= _UNDER_WAY
        ):
            under_way.set()

    driver = node.driver(plan, retries=0, on_progress=watch)
    expect_status(await driver.prepare(), "prepared")
    for spec in plan.objects[:-1]:
        await driver.stage(spec)
    stage = asyncio.create_task(driver.stage(big), name="large-stage")
    try:
        waiting = asyncio.create_task(under_way.wait())
        await asyncio.wait({stage, waiting}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
        if not under_way.is_set():
            raise CheckFailed(f"the {_LARGE // MiB} MiB stage did not get under way")
        cursor = await journal_cursor()
        started = time.monotonic()
        stopped = await node.unit.systemctl("stop", timeout=stop_limit + 30)
        took = time.monotonic() - started
        await asyncio.wait({stage}, timeout=30)
    finally:
        stage.cancel()
        await asyncio.wait({stage})
    stopped.expect()
    if took > bound or took >= stop_limit:
        raise CheckFailed(
            f"stop took {took:.1f} s (bound {bound:g} s, TimeoutStopSec {stop_limit:g} s)"
        )
    await _expect_clean_stop(node, cursor)
    cut = stage.cancelled() or stage.exception() is not None
    verified = await asyncio.to_thread(_verified_bytes, node, plan.staging_archive_id, big.path)
    await node.start()
    driver.retries = 3
    outcome = "finished within the drain"
    if cut:
        await driver.stage(big)  # the same request again, on a fresh stream
        sent = await node.metric("restore_agent_staged_bytes_total")
        if verified and sent > big.size - verified + chunk:
            raise CheckFailed(
                f"the resend staged {sent / MiB:.0f} MiB though {verified / MiB:.0f} MiB were"
                " verified before the stop"
            )
        outcome = (
            f"was cut at the drain deadline with {verified / MiB:.0f} MiB verified; the resend"
            f" staged the other {sent / MiB:.0f} MiB"
        )
    ready, cleaned = await node.finish_restore(driver)
    return (
        f"stop during a {big.size // MiB} MiB stage: {took:.1f} s (drain {drain:g} s, bound"
        f" {bound:g} s, TimeoutStopSec {stop_limit:g} s), exit 0; the stage {outcome}; after"
        f" start the restore went on: ready at revision {ready}, cleaned at {cleaned}"
    )


def _verified_bytes(node: Node, archive: str, path: str) -> int:
    return int(Storage(node.stack.corestore.data_dir).progress(archive, path)["verifiedBytes"])


async def watchdog(node: Node) -> str:
    """SIGSTOP the agent: systemd's watchdog fires, the unit restarts and connects again."""
    limit, restart = await node.seconds("WatchdogUSec"), await node.seconds("RestartUSec")
    if limit == 0:
        raise CheckFailed("the unit sets no WatchdogSec=")
    pid, cursor = await node.main_pid(), await journal_cursor()
    before = await node.unit.prop("NRestarts")
    os.kill(pid, signal.SIGSTOP)
    started = time.monotonic()
    try:

        async def timed_out() -> str | None:
            entries = await node.unit.journal(after=cursor)
            return next((e.message for e in entries if "Watchdog timeout" in e.message), None)

        message = await until(timed_out, timeout=limit + 15, what="a watchdog timeout")
        fired = time.monotonic() - started
        new_pid = await node.restarted(pid, restart + 30)
        back = time.monotonic() - started
    finally:
        if process_state(pid) == "T":
            os.kill(pid, signal.SIGCONT)
    after = await node.unit.prop("NRestarts")
    text = await node.connected()
    return (
        f"SIGSTOP to PID {pid}: `{message.split(': ', 1)[-1]}` after {fired:.1f} s, running"
        f" again as PID {new_pid} at {back:.1f} s (NRestarts {before} -> {after}): {text}"
    )


async def sigkill(node: Node) -> str:
    """SIGKILL the agent: `Restart=on-failure` starts it again after `RestartSec=`."""
    restart = await node.seconds("RestartUSec")
    await node.unit.systemctl("reset-failed")  # the start limit counts from here
    node.restarts_since_reset = 0
    pid = await node.main_pid()
    os.kill(pid, signal.SIGKILL)
    started = time.monotonic()
    new_pid = await node.restarted(pid, restart + 30)
    took = time.monotonic() - started
    node.restarts_since_reset = 1
    text = await node.connected()
    return (
        f"SIGKILL to PID {pid}: running again as PID {new_pid} after {took:.1f} s"
        f" (RestartSec={restart:g}): {text}"
    )


async def start_limit(node: Node) -> str:
    """Killed again and again, the unit restarts `StartLimitBurst=` times, then systemd
    refuses the next start and the unit stays failed."""
    values = await node.unit.show("StartLimitBurst", "StartLimitIntervalUSec", "RestartUSec")
    burst = int(values["StartLimitBurst"])
    interval = parse_timespan(values["StartLimitIntervalUSec"])
    restart = parse_timespan(values["RestartUSec"])
    if node.restarts_since_reset is None:
        await node.unit.systemctl("reset-failed")
        node.restarts_since_reset = 0
    restarts, started = node.restarts_since_reset, time.monotonic()
    cursor = await journal_cursor()
    while True:
        pid = await node.main_pid()
        os.kill(pid, signal.SIGKILL)

        async def outcome(old: int = pid) -> str | None:
            state = await node.unit.show("MainPID", "ActiveState", "SubState")
            if state["ActiveState"] == "failed":
                return "failed"
            new = int(state["MainPID"] or 0)
            running = (state["ActiveState"], state["SubState"]) == ("active", "running")
            return "running" if running and new not in (0, old) else None

        if await until(outcome, timeout=restart + 30, what="a restart or the limit") == "failed":
            break
        restarts += 1
        if restarts > burst:
            raise CheckFailed(f"{restarts} restarts, more than StartLimitBurst={burst}")
    took = time.monotonic() - started
    if restarts != burst:
        raise CheckFailed(f"failed after {restarts} restarts, not StartLimitBurst={burst}")

    async def refused() -> str | None:
        entries = await node.unit.journal(after=cursor)
        return next((e.message for e in entries if "repeated too quickly" in e.message), None)

    message = await until(refused, timeout=15, what="systemd refusing the next start")
    if await node.unit.prop("SubState") != "failed":
        raise CheckFailed("the unit did not stay failed after the refused start")
    back = await node.start()
    return (
        f"{restarts} restarts after SIGKILLs in {took:.0f} s, then the next refused"
        f" (`{message.split(': ', 1)[-1]}`, StartLimitBurst={burst} in {interval:g} s):"
        f" failed until reset-failed; started again: {back}"
    )


def save_for_reboot(node: Node) -> None:
    """What `rebooted` compares with: this boot and the last restore that was cleaned."""
    state = {"boot_id": _boot_id(), "restore": node.last_restore}
    (node.workdir / "before-reboot.json").write_text(json.dumps(state))


async def rebooted(node: Node) -> str:
    """In the machine booted again: the enabled unit started with it, runs and connects, and
    its state directory kept the restores."""
    before = json.loads((node.workdir / "before-reboot.json").read_text())
    if _boot_id() == before["boot_id"]:
        raise CheckFailed("the machine did not boot again (same boot id)")
    enabled = (await node.unit.systemctl("is-enabled")).out.strip()
    if enabled != "enabled":
        raise CheckFailed(f"the unit is {enabled}, not enabled")
    text = await node.connected(timeout=60)
    restarts = await node.unit.prop("NRestarts")
    if restarts != "0":
        raise CheckFailed(f"the unit restarted {restarts} times since the boot")
    kept = ""
    restore: dict[str, Any] | None = before.get("restore")
    if restore is not None:
        plan = replace(demo_plan(big_size=SMALL), restore_id=restore["restore_id"])
        state = await node.driver(plan).status()
        found = None if state is None else (state["status"], state["revision"])
        if found != ("cleaned", restore["revision"]):
            raise CheckFailed(f"{restore['restore_id']} after the reboot: {found}")
        kept = f"; {restore['restore_id']} still cleaned at revision {restore['revision']}"
    return (
        f"booted again (cgroup {await cgroup_hierarchy()}): the enabled unit started with the"
        f" machine, active (running), no restart: {text}{kept}"
    )


def _boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
