"""The checks of the running service: the README's install, readiness and STATUS=, the work
through the unit, the credentials, the hardening score, the journal's priorities.

Each takes the `Node` and returns what it saw, or raises `CheckFailed` saying what it saw
instead.
"""

from __future__ import annotations

import json
import os
import re
import stat
import zipfile
from pathlib import Path
from typing import Final

from devstack.systemdcheck.node import CONFIG, CONNECTED, HEALTH_SOCKET, UNIT, UNREACHABLE, Node
from devstack.systemdcheck.readme import install_steps, set_keys
from devstack.systemdcheck.systemd import (
    CheckFailed,
    cgroup_hierarchy,
    journal_cursor,
    proc_argv,
    proc_environ,
    proc_uid,
    run,
)

__all__ = [
    "credentials",
    "install",
    "journal_warning",
    "ready",
    "relay",
    "restore",
    "security",
    "status_down",
    "status_token",
]

# The operator's edit between steps 3 and 4 ("set cloudly.url"), besides the URL itself: the
# health endpoint on a socket in the unit's RuntimeDirectory= (the machine shares the host's
# network: no fixed port), reconnects and Corestore polls that no check waits long for, and a
# drain shorter than the 20 s default so that the large stage of stop-drain outlasts it.
TEST_NODE_KEYS: Final = {
    ("cloudly", "backoff_base_s"): "0.2",
    ("cloudly", "backoff_cap_s"): "2.0",
    ("corestore", "restore_poll_interval_s"): "0.05",
    ("health", "listen"): f'"unix:{HEALTH_SOCKET}"',
    ("shutdown", "drain_timeout_s"): "5.0",
}
_DYNAMIC_UIDS: Final = range(61184, 65520)  # systemd's DynamicUser= range


async def install(node: Node) -> str:
    """readme.md's "Install on a node", steps 1 to 5 as written (the config edited after 3)."""
    node.installed_at = await journal_cursor()
    steps = install_steps((node.checkout / "readme.md").read_text())
    numbers = [step.number for step in steps]
    if numbers != [1, 2, 3, 4, 5]:
        raise CheckFailed(f"the install block's steps are {numbers}, not 1 to 5")
    environment = {**os.environ, "MACHINE_TOKEN": node.stack.token}
    outputs: dict[int, str] = {}
    for step in steps:
        if step.number == 4:
            configure(node)
        done = await run(
            "bash", "-euo", "pipefail", "-c", step.script, cwd=node.checkout, env=environment,
            timeout=900,
        )  # fmt: skip
        log = node.workdir / f"install-step-{step.number}.log"
        log.write_text(f"$ {step.script}\n{done.out}\n{done.err}")
        if done.code != 0:
            tail = " | ".join((done.err.strip() or done.out.strip()).splitlines()[-4:])
            raise CheckFailed(f"step {step.number} ({step.title}) exited {done.code}: {tail}")
        outputs[step.number] = done.out
    wheel = _native_wheel(node.checkout / "dist")
    if "cloudly: OK" not in outputs[4]:
        raise CheckFailed(f"step 4 printed no `cloudly: OK`: {outputs[4].strip()[-200:]}")
    if "Active: active (running)" not in outputs[5]:
        raise CheckFailed("step 5's `systemctl status` does not say active (running)")
    cloudly = node.stack.cloudly
    tagged = {event.connection for event in cloudly.events if event.kind == "tag-set"}
    probes = [
        event
        for event in cloudly.events
        if event.kind == "disconnected" and event.connection not in tagged
    ]
    if not probes or probes[0].detail.get("code") != 1000:
        raise CheckFailed("the stand-in Cloudly saw no probe that closed with 1000")
    if not tagged or min(tagged) < probes[0].connection:
        raise CheckFailed("the stand-in Cloudly saw no agent session after the probe")
    systemd = (await run("systemctl", "--version")).expect().out.split("\n")[0]
    return (
        f"steps 1-5 ran as written ({systemd}, cgroup {await cgroup_hierarchy()}): {wheel}"
        " (with the native chunk decoder) in /opt/restore-agent/venv; check-config --connect"
        " said cloudly OK (the stand-in Cloudly saw the probe close with 1000, untagged, then"
        " the agent's tagged session); the unit enabled, active"
    )


def configure(node: Node) -> None:
    """The operator's edit of the installed config (readme: "set cloudly.url")."""
    url = {("cloudly", "url"): json.dumps(node.stack.cloudly.url)}
    node.good_config = set_keys(CONFIG.read_text(), {**url, **TEST_NODE_KEYS})
    CONFIG.write_text(node.good_config)


async def ready(node: Node) -> str:
    """READY=1 took the notify unit to active (running); `systemctl status` shows STATUS=."""
    values = await node.unit.show(
        "Type",
        "ActiveState",
        "SubState",
        "ExecMainStartTimestampMonotonic",
        "ActiveEnterTimestampMonotonic",
    )
    seen = (values["Type"], values["ActiveState"], values["SubState"])
    if seen != ("notify", "active", "running"):
        raise CheckFailed("Type={} {}/{}".format(*seen))
    to_ready = (
        int(values["ActiveEnterTimestampMonotonic"])
        - int(values["ExecMainStartTimestampMonotonic"])
    ) / 1e6
    text = await node.status_shown(lambda text: text.startswith(CONNECTED), "status: connected")
    return (
        f"Type=notify, active (running) {to_ready:.1f} s after exec (READY=1);"
        f' systemctl status: Status: "{text}"'
    )


async def status_down(node: Node) -> str:
    """While Cloudly is down, `systemctl status` says so; the unit stays active (running)."""
    await node.stack.cloudly.stop()
    try:
        text = await node.status_shown(
            lambda text: text.startswith(UNREACHABLE), "systemctl status showing Cloudly down"
        )
    finally:
        await node.stack.cloudly.start()
    back = await node.connected()
    return f'Cloudly stopped: Status: "{text}", active (running); Cloudly back: "{back}"'


async def status_token(node: Node) -> str:
    """After a refused machine token, `systemctl status` names it."""
    cloudly = node.stack.cloudly
    cloudly.set_token(f"another-{node.stack.token}")
    try:
        await cloudly.drop_connections()
        text = await node.status_shown(
            lambda text: text.startswith(UNREACHABLE) and "token" in text.lower(),
            "systemctl status naming the refused token",
        )
    finally:
        cloudly.set_token(node.stack.token)
    back = await node.connected()
    return f'token refused: Status: "{text}", active (running); token valid again: "{back}"'


async def restore(node: Node) -> str:
    """A whole isolated restore through the unit."""
    return await node.restore_scenario("unit")


async def relay(node: Node) -> str:
    """A service backup and restore through the unit."""
    return await node.relay_scenario("unit")


async def credentials(node: Node) -> str:
    """The machine token arrives as a 0400 credential of the dynamic user, and nowhere else."""
    pid = await node.main_pid()
    environ, argv, uid = proc_environ(pid), proc_argv(pid), proc_uid(pid)
    directory = environ.get("CREDENTIALS_DIRECTORY")
    if directory is None:
        raise CheckFailed("the agent has no $CREDENTIALS_DIRECTORY")
    # What the agent itself sees, through its own mount namespace.
    path = Path(f"/proc/{pid}/root") / directory.lstrip("/") / "machine-token"
    info = path.stat()
    mode = stat.S_IMODE(info.st_mode)
    if mode != 0o400:
        raise CheckFailed(f"{directory}/machine-token has mode {mode:04o}, not 0400")
    if uid not in _DYNAMIC_UIDS:
        raise CheckFailed(f"the agent runs as uid {uid}, not a dynamic user")
    if info.st_uid != uid:
        raise CheckFailed(f"the credential is owned by uid {info.st_uid}, the agent is {uid}")
    token = node.stack.token
    if path.read_text().strip() != token:
        raise CheckFailed("the credential does not hold the machine token")
    if any(token in key or token in value for key, value in environ.items()):
        raise CheckFailed("the machine token is in the agent's environment")
    if any(token in item for item in argv):
        raise CheckFailed("the machine token is on the agent's command line")
    if token in (await node.unit.systemctl("show")).out:
        raise CheckFailed("the machine token is in `systemctl show`")
    if any(token in entry.message for entry in await node.unit.journal()):
        raise CheckFailed("the machine token is in the unit's journal")
    return (
        f"{directory}/machine-token: mode 0400, owner uid {uid}, the agent's DynamicUser= uid;"
        " the token is in neither its environment, its argv, systemctl show nor the journal"
    )


async def security(node: Node) -> str:
    """`systemd-analyze security` of the loaded unit in the machine: at most 1.5."""
    done = (await run("systemd-analyze", "security", "--no-pager", UNIT)).expect()
    match = re.search(r"Overall exposure level for \S+: (\d+(?:\.\d+)?) (\w+)", done.out)
    if match is None:
        raise CheckFailed("systemd-analyze security printed no overall exposure level")
    score = float(match.group(1))
    if score > 1.5:
        raise CheckFailed(f"exposure {score} {match.group(2)} is above 1.5")
    return f"systemd-analyze security {UNIT} (the loaded unit): {score} {match.group(2)}"


async def journal_warning(node: Node) -> str:
    """`journalctl -u restore-agent -p warning` shows the agent's warnings (Cloudly was down),
    and none of its info lines (which the unfiltered journal holds)."""
    shown = await node.unit.journal(after=node.installed_at, priority="warning")
    every = await node.unit.journal(after=node.installed_at)
    records = [record for entry in shown if (record := entry.agent_record()) is not None]
    warnings = [record for record in records if record.get("level") == "warning"]
    below = [record for record in records if record.get("level") in ("info", "debug")]
    infos = [
        record
        for entry in every
        if (record := entry.agent_record()) is not None and record.get("level") == "info"
    ]
    if not infos:
        raise CheckFailed("the unit's journal holds no info line of the agent at all")
    if not warnings:
        raise CheckFailed("-p warning shows no warning of the agent")
    if below:
        raise CheckFailed(f"-p warning shows an info line: {below[0].get('event')}")
    events = sorted({str(record.get("event")) for record in warnings})
    errors = sum(1 for record in records if record.get("level") in ("error", "critical"))
    return (
        f"-p warning: {_count(len(warnings), 'warning')} ({', '.join(events)}) and"
        f" {_count(errors, 'error')} of the agent, none of its {len(infos)} info lines"
    )


def _count(number: int, thing: str) -> str:
    return f"{number} {thing}" if number == 1 else f"{number} {thing}s"


def _native_wheel(dist: Path) -> str:
    wheels = sorted(dist.glob("serve_zone_restore_agent-*.whl"))
    if len(wheels) != 1:
        raise CheckFailed(f"step 1 left {len(wheels)} wheels in dist/")
    with zipfile.ZipFile(wheels[0]) as wheel:
        names = wheel.namelist()
    if not any(name.startswith("agent/_bufferform") and name.endswith(".so") for name in names):
        raise CheckFailed(f"{wheels[0].name} lacks the native chunk decoder")
    return wheels[0].name
