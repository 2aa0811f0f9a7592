"""The `topology` check: a second agent with the same machine token on the node, as the operator
sees it (readme.md, "Where it runs"; docs/operations.md, RestoreAgentDuplicateAgent).

With the installed unit running and ready, a second agent starts beside it as a transient unit
(`systemd-run`) run as the unit runs its agent (`SECOND_PROPERTIES`: a DynamicUser= of its own,
the same machine token through the same LoadCredential=, Type=notify) from a config of its own
(`second_config`: the installed one with its own state directory and health socket, so neither
the state lock nor the health address stops it; the same Cloudly URL and token file). That is
what configuration management that installs the agent on two nodes of a cluster makes: each
enrollment retires the other's recipient (the stand-in Cloudly keeps one per cluster, as
Cloudly does). Then, at the defaults (`[cloudly] recipient_check_s`, 10 s):

- the installed agent's `restore-agent status` exits 3 (it answers, not ready) with the reason
  `duplicate-agent`, `/metrics` says `restore_agent_duplicate_agent 1`, and
  `journalctl -u restore-agent -p err` holds the `duplicate_agent_suspected` line;
- the runbook's fix on the second agent (`systemctl disable --now` on its node; a transient
  unit has no unit file to disable, so it is stopped), and the installed agent is ready again
  (`restore-agent status` exits 0, `duplicate_agent_gone` in the journal) within the bound its
  own checks give.

The waits poll the metric over the health socket (cheap: the status command is a process
each time) and then show what `restore-agent status` prints; the readiness reason and the
metric move together (one observer call).
"""

from __future__ import annotations

import os
import re
import shutil
import time
import tomllib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Final

from agent.credentials.contest import CLEAR_AFTER
from devstack.systemdcheck.node import AGENT, CONFIG, Node
from devstack.systemdcheck.readme import set_keys
from devstack.systemdcheck.systemd import (
    CheckFailed,
    JournalEntry,
    Unit,
    journal_cursor,
    run,
    until,
)

__all__ = ["SECOND_PROPERTIES", "SECOND_UNIT", "second_config", "topology"]

SECOND_UNIT: Final = "restore-agent-second.service"
_SECOND: Final = "restore-agent-second"  # its state and runtime directories' names
_SECOND_CONFIG: Final = CONFIG.with_name("second-agent.toml")
# With DynamicUser= the state directory is under /var/lib/private, /var/lib/NAME links to it.
_SECOND_STATE: Final = Path(f"/var/lib/private/{_SECOND}")
_SECOND_LINK: Final = Path(f"/var/lib/{_SECOND}")
_SECOND_HEALTH: Final = f"/run/{_SECOND}/health.sock"
_COMMAND: Final = "/usr/local/bin/restore-agent"  # what readme.md's step 2 puts on the PATH
_METRIC: Final = "restore_agent_duplicate_agent"
_EXIT_NOT_READY: Final = 3  # `restore-agent status`: it answers, not ready (operations.md)
_DEFAULT_CHECK_S: Final = 10.0  # [cloudly] recipient_check_s when the config does not set it
_SLACK_S: Final = 20.0  # a connect, an enrollment, a journal write on a shared 2-core host

# The installed unit's properties that make the second agent one of this cluster's agents, run
# as the unit runs it (tests/test_systemdcheck.py holds each equal to the unit file's line);
# the directories are its own, as on another node.
SECOND_PROPERTIES: Final = (
    "Type=notify",
    "NotifyAccess=main",
    "DynamicUser=yes",
    "UMask=0077",
    "LoadCredential=machine-token:/etc/restore-agent/credentials/machine-token",
    f"StateDirectory={_SECOND}",
    "StateDirectoryMode=0700",
    f"RuntimeDirectory={_SECOND}",
    "RuntimeDirectoryMode=0700",
)


def second_config(installed: str) -> str:
    """The second agent's config: the installed one with a state directory and a health socket
    of its own (the same Cloudly, the same token file)."""
    return set_keys(
        installed,
        {
            ("state", "directory"): f'"/var/lib/{_SECOND}"',
            ("health", "listen"): f'"unix:{_SECOND_HEALTH}"',
        },
    )


def _check_interval(config: str) -> float:
    cloudly = tomllib.loads(config).get("cloudly", {})
    return float(cloudly.get("recipient_check_s", _DEFAULT_CHECK_S))


async def topology(node: Node) -> str:
    """Two agents with one machine token: the installed one says `duplicate-agent` and is not
    ready; the second stopped, it is ready again."""
    installed = CONFIG.read_text()
    interval = _check_interval(installed)
    # Contested: the second's enrollment retires the installed agent's recipient, its next
    # check (within an interval) sees it and enrolls again, which retires the second's; the
    # second's own check (within an interval of its start) enrolls again and retires the
    # installed one's, which its next check (a fifth of an interval after a retirement, or a
    # whole one) sees as the second retirement.
    contest_s = 2.2 * interval + _SLACK_S
    # Over: the installed agent's next check may still find the second's last retirement (an
    # interval), then CLEAR_AFTER checks find its recipient enrolled (the first a fifth of an
    # interval later).
    clear_s = (CLEAR_AFTER + 0.2) * interval + _SLACK_S
    # Ready first (the check before may have ended with a recovery's start).
    await _expect_status(0, "the installed agent before the second starts", wait_s=_SLACK_S)
    if await node.metric(_METRIC) != 0:
        raise CheckFailed(f"{_METRIC} is not 0 before the second agent starts")
    cursor = await journal_cursor()
    enrolled = _enrollments(node)
    second = Unit(SECOND_UNIT)
    try:
        started = time.monotonic()
        await _start_second(second)
        await _until_metric(node, second, 1, contest_s, "the installed agent contested")
        contested_after = time.monotonic() - started
        contested = await _expect_status(_EXIT_NOT_READY, "the installed agent contested")
        reason = _line(contested, r"^\s+duplicate-agent: (.*)$", "no `duplicate-agent:` reason")
        suspected = await _until_event(node, cursor, "duplicate_agent_suspected", "err")
        enrollments = _enrollments(node) - enrolled
        # The runbook's fix, on the second agent (its node's `disable --now`).
        (await second.systemctl("stop", timeout=120)).expect()
        stopped = time.monotonic()
    finally:
        await _remove_second(second)
    await _until_metric(node, second, 0, clear_s, "the installed agent no longer contested")
    await _expect_status(0, "the installed agent after the second stopped", wait_s=_SLACK_S)
    cleared_after = time.monotonic() - stopped
    await _until_event(node, cursor, "duplicate_agent_gone", None)
    return (
        f"a second agent ({SECOND_UNIT}: the same token, its own state and health socket):"
        f" after {contested_after:.0f} s (bound {contest_s:g}) restore-agent status exited"
        f" {_EXIT_NOT_READY}, not ready, duplicate-agent: {reason[:48]}...; -p err:"
        f" duplicate_agent_suspected (retirements={suspected.get('retirements')}); {_METRIC} 1;"
        f" {enrollments} enrollments at the stand-in Cloudly; the second stopped: ready again"
        f" after {cleared_after:.0f} s (bound {clear_s:g}), duplicate_agent_gone"
    )


async def _start_second(second: Unit) -> None:
    """The second agent's config and its transient unit, started (Type=notify: systemd-run
    returns once the agent said READY=1, or its start failed)."""
    descriptor = os.open(_SECOND_CONFIG, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(second_config(CONFIG.read_text()))
    os.chmod(_SECOND_CONFIG, CONFIG.stat().st_mode & 0o777)  # readable as the installed one
    properties = [item for line in SECOND_PROPERTIES for item in ("-p", line)]
    done = await run(
        "systemd-run", f"--unit={SECOND_UNIT}", "--collect", "--quiet", *properties,
        str(AGENT), "run", "--config", str(_SECOND_CONFIG), timeout=120,
    )  # fmt: skip
    state = await second.show("ActiveState", "SubState")
    if done.code != 0 or (state.get("ActiveState"), state.get("SubState")) != ("active", "running"):
        tail = " | ".join(entry.message for entry in (await second.journal())[-3:])
        raise CheckFailed(
            f"the second agent did not start (systemd-run {done.code}, {state}): {tail}"
        )


async def _remove_second(second: Unit) -> None:
    """Stop the second agent (once more: a check that failed half way leaves it running, and
    the next checks need the installed agent alone) and remove what it left."""
    await second.systemctl("stop", timeout=120)  # not loaded any more: exits 5, nothing to do
    _SECOND_CONFIG.unlink(missing_ok=True)
    _SECOND_LINK.unlink(missing_ok=True)
    shutil.rmtree(_SECOND_STATE, ignore_errors=True)


async def _expect_status(code: int, what: str, *, wait_s: float = 0.0) -> str:
    """`restore-agent status` (with `--wait` when asked) exiting `code`; its output."""
    argv = [_COMMAND, "status", *(["--wait", f"{wait_s:g}"] if wait_s else [])]
    done = await run(*argv, timeout=wait_s + 60)
    if done.code != code:
        head = " | ".join(done.out.strip().splitlines()[:3]) or done.err.strip()
        raise CheckFailed(f"{what}: `restore-agent status` exited {done.code}, not {code}: {head}")
    return done.out


async def _until_metric(node: Node, second: Unit, value: int, timeout: float, what: str) -> None:  # noqa: ASYNC109
    async def probe() -> bool | None:
        return True if await node.metric(_METRIC) == value else None

    try:
        await until(probe, timeout=timeout, what=f"{what} ({_METRIC} {value})")
    except CheckFailed as exc:
        state = await second.show("ActiveState", "SubState")
        raise CheckFailed(f"{exc}; the second agent: {state}") from None


async def _until_event(
    node: Node, cursor: str | None, event: str, priority: str | None
) -> dict[str, Any]:
    """The installed agent's journal record `event` after `cursor` (journald writes it a moment
    after the agent's observers moved)."""

    async def probe() -> dict[str, Any] | None:
        entries = await node.unit.journal(after=cursor, priority=priority)
        return next(_records(entries, event), None)

    shown = f" -p {priority}" if priority else ""
    return await until(probe, timeout=_SLACK_S, what=f"journalctl -u restore-agent{shown}: {event}")


def _records(entries: Iterable[JournalEntry], event: str) -> Iterator[dict[str, Any]]:
    for entry in entries:
        record = entry.agent_record()
        if record is not None and record.get("event") == event:
            yield record


def _line(text: str, pattern: str, missing: str) -> str:
    match = re.search(pattern, text, re.MULTILINE)
    if match is None:
        raise CheckFailed(f"`restore-agent status`: {missing}: {text.strip()[:200]}")
    return match.group(1)


def _enrollments(node: Node) -> int:
    return sum(1 for event in node.stack.cloudly.events if event.kind == "recipient-enrolled")
