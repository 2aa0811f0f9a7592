"""The systemd unit: how the agent is run, and how little it may touch.

`systemd-analyze security --offline=yes` rates the unit file itself (no running system
needed); the figure is recorded in docs/operations.md. The rest reads the file: the settings the
agent relies on (notify, watchdog, credentials, directories) and that the stop timeout outlasts
the agent's own shutdown deadlines.
"""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from agent.config import CloudlyConfig, MemoryConfig, ShutdownConfig
from agent.startup.preflight import longest_stop
from agent.transfers.memory import memory_high

ROOT = Path(__file__).resolve().parent.parent
UNIT = ROOT / "systemd" / "restore-agent.service"
MAX_EXPOSURE = 1.5


def _unit() -> dict[str, dict[str, list[str]]]:
    """The unit's sections, each key with all its values (keys may repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for raw in UNIT.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key, []).append(value)
    return sections


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="needs systemd-analyze")
def test_the_unit_is_hardened_to_an_exposure_of_at_most_1_5() -> None:
    """`systemd-analyze security --offline=yes` rates the unit at most 1.5 (of 10)."""
    result = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", str(UNIT)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    match = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", result.stdout)
    assert match is not None, result.stdout + result.stderr
    assert float(match.group(1)) <= MAX_EXPOSURE


def test_the_unit_is_a_notify_service_with_a_watchdog_and_start_limits() -> None:
    """Type=notify (READY=1 from the agent), a watchdog, restarts bounded by start limits."""
    unit = _unit()
    service = unit["Service"]
    assert service["Type"] == ["notify"]
    assert int(service["WatchdogSec"][0]) >= 10
    assert service["Restart"] == ["on-failure"]
    # A config error (or a newer state schema) and a damaged state database are not retried.
    assert service["RestartPreventExitStatus"] == ["2 65"]
    assert {"StartLimitIntervalSec", "StartLimitBurst", "Documentation"} <= set(unit["Unit"])


def test_secrets_and_state_come_from_systemd_directories() -> None:
    """The machine token by LoadCredential= (Corestore's credentials come sealed from Cloudly,
    never from a file), state and runtime directories made by systemd."""
    service = _unit()["Service"]
    names = sorted(value.split(":", 1)[0] for value in service["LoadCredential"])
    assert names == ["machine-token"]
    assert service["StateDirectory"] == ["restore-agent"]
    assert service["RuntimeDirectory"] == ["restore-agent"]
    assert "/run/credentials" not in UNIT.read_text()


def test_the_stop_timeout_outlasts_the_agents_own_shutdown() -> None:
    """TimeoutStopSec exceeds the drain deadline plus the bounded close steps (socket,
    engine, relay jobs, health endpoint, clients, store), each with its second of grace
    (`agent.startup.preflight.longest_stop`), so systemd never kills a clean shutdown."""
    assert float(_unit()["Service"]["TimeoutStopSec"][0]) > longest_stop(ShutdownConfig())


def test_execstart_runs_the_installed_console_script() -> None:
    """The unit runs `restore-agent run --config ...` from the venv the README installs."""
    [exec_start] = _unit()["Service"]["ExecStart"]
    assert exec_start == (
        "/opt/restore-agent/venv/bin/restore-agent run --config /etc/restore-agent/config.toml"
    )
    readme = (ROOT / "readme.md").read_text()
    assert "python3 -m venv /opt/restore-agent/venv" in readme


def test_the_unit_parses_as_an_ini_file() -> None:
    """No stray syntax: every line is a section, a comment or key=value."""
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(UNIT.read_text())
    assert parser.sections() == ["Unit", "Service", "Install"]


def test_the_agents_stop_timeout_is_the_units() -> None:
    """`[shutdown] stop_timeout_s`, against which `run` and `check-config` check the shutdown
    budget, defaults to the unit's TimeoutStopSec=: the check is against the real unit."""
    assert ShutdownConfig().stop_timeout_s == float(_unit()["Service"]["TimeoutStopSec"][0])


def _size(value: str) -> int:
    units = {"K": 1024, "M": 1024**2, "G": 1024**3}
    return int(value[:-1]) * units[value[-1]] if value[-1] in units else int(value)


def test_the_unit_declares_the_memory_ceiling_the_budget_implies() -> None:
    """MemoryHigh= is idle + the default byte budget + the measured constant for the default
    frame limit (agent.transfers.memory.memory_high); MemoryMax= is a hard stop above it."""
    service = _unit()["Service"]
    frame = CloudlyConfig.model_fields["max_frame_bytes"].default
    high = memory_high(MemoryConfig().budget_bytes, frame)
    assert _size(service["MemoryHigh"][0]) == high
    assert _size(service["MemoryMax"][0]) >= high * 4 // 3


WRAPPER = ROOT / "systemd" / "restore-agent"


def test_the_wrapper_runs_check_config_with_the_units_user_credentials_and_sandbox() -> None:
    """The command on the PATH runs `check-config` through systemd-run with the very
    properties of the unit that decide what `run` can read and write."""
    text = WRAPPER.read_text()
    given = dict(value.split("=", 1) for value in re.findall(r"-p (\S+)", text))
    service = _unit()["Service"]
    for key in ("DynamicUser", "StateDirectory", "StateDirectoryMode", "ProtectSystem"):
        assert given[key] == service[key][0], key
    assert given["ProtectHome"] == service["ProtectHome"][0]
    assert [given["LoadCredential"]] == service["LoadCredential"]


def test_the_wrapper_runs_the_binary_the_unit_runs() -> None:
    [exec_start] = _unit()["Service"]["ExecStart"]
    [agent] = re.findall(r"^AGENT=(\S+)$", WRAPPER.read_text(), re.MULTILINE)
    assert exec_start.split()[0] == agent
    assert WRAPPER.stat().st_mode & 0o111, "the wrapper is executable in the checkout"
