"""Specification of start-up: what refuses it (one line; exit 2 or 75), what it creates and
when, and `check-config`'s parity with `run`."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import structlog

from agent.config import load_config
from agent.credentials.keys import KEY_FILE
from agent.entry import app
from agent.entry.cli import main
from agent.errors import ConfigError, StartupBlocked
from agent.watch.status import AgentStatus, SessionState
from devstack.cloudly import StandInCloudly, cluster_document
from tests.processes import agent_environ

REPO = Path(__file__).resolve().parents[1]
TOKEN = "startup-machine-token-5e8a0c1d2b"
CREDENTIAL = "startup-corestore-credential-91f2"

# A Cloudly that never answers (nothing resolves .invalid): start-up must refuse, or the agent
# keeps retrying, which the tests below catch by their timeouts.
NOWHERE = "wss://cloudly.invalid"


def _secret(path: Path, value: str) -> Path:
    path.write_text(value + "\n")
    path.chmod(0o600)
    return path


def _write(tmp_path: Path, *, url: str = NOWHERE, sealed: bool = False, **extra: str) -> Path:
    """`agent.toml` in `tmp_path` beside a token (and credential) file; `extra` holds whole
    `key = value` lines by section (`cloudly`, `state`, `health`)."""
    _secret(tmp_path / "machine-token", TOKEN)
    lines = ["[cloudly]", f'url = "{url}"', 'token_file = "machine-token"', "backoff_cap_s = 1.0"]
    lines += extra.get("cloudly", "").splitlines()
    lines += ["[corestore]"]
    if not sealed:
        _secret(tmp_path / "corestore-credential", CREDENTIAL)
        lines += ['credential_source = "file"', 'credential_file = "corestore-credential"']
    lines += ["[state]", extra.get("state", 'directory = "state"')]
    lines += ["[health]", extra.get("health", 'listen = "127.0.0.1:0"')]
    lines += ["[log]", 'format = "json"']
    path = tmp_path / "agent.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def _agent(
    *args: str, env: dict[str, str] | None = None, prefix: tuple[str, ...] = (), timeout: float = 20
) -> subprocess.CompletedProcess[str]:
    """`python -m agent ARGS` in a fresh interpreter (after `prefix`, e.g. an unshare)."""
    return subprocess.run(
        [*prefix, sys.executable, "-m", "agent", *args],
        capture_output=True,
        text=True,
        env=agent_environ(**(env or {})),
        cwd=REPO,
        timeout=timeout,
        check=False,
    )


def _one_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


# --- check-config says OK only when run would start ---------------------------------------------


def _ca_file_missing(tmp_path: Path) -> Path:
    return _write(tmp_path, cloudly='ca_file = "absent-ca.pem"')


def _ca_file_not_pem(tmp_path: Path) -> Path:
    (tmp_path / "ca.pem").write_text("not a certificate\n")
    return _write(tmp_path, cloudly='ca_file = "ca.pem"')


def _state_is_a_file(tmp_path: Path) -> Path:
    (tmp_path / "state").write_text("a file where the state directory should be\n")
    return _write(tmp_path)


def _state_parent_missing(tmp_path: Path) -> Path:
    return _write(tmp_path, state='directory = "no/such/state"')


def _key_readable_by_others(tmp_path: Path) -> Path:
    (tmp_path / "state").mkdir(mode=0o700)
    key = tmp_path / "state" / KEY_FILE
    key.write_bytes(bytes(range(32)))
    key.chmod(0o644)
    return _write(tmp_path, sealed=True)


REFUSED = {
    "ca-file-missing": (_ca_file_missing, "config cloudly.ca_file: "),
    "ca-file-not-pem": (_ca_file_not_pem, "config cloudly.ca_file: "),
    "state-is-a-file": (_state_is_a_file, "config state.directory: "),
    "state-parent-missing": (_state_parent_missing, "config state.directory: "),
    "key-readable-by-others": (_key_readable_by_others, "config state.directory: "),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_check_config_refuses_what_run_refuses(tmp_path: Path, case: str) -> None:
    """For each fault `run` refuses before it connects, `check-config` prints no "config OK"
    but the very line `run` prints, and both exit 2."""
    make, key = REFUSED[case]
    config = make(tmp_path)
    checked = _agent("check-config", "--config", str(config))
    ran = _agent("run", "--config", str(config))
    assert (checked.returncode, ran.returncode) == (2, 2), ran.stderr
    assert checked.stdout == ""
    line = _one_line(checked.stderr)
    assert line.startswith(f"restore-agent: {key}")
    assert _one_line(ran.stderr) == line


def test_connect_without_the_credentials_refuses_before_saying_ok(tmp_path: Path) -> None:
    """`check-config --connect` outside the unit cannot read a systemd credential: one line
    naming the key, exit 2, and no "config OK" first."""
    config = _write(tmp_path)
    text = config.read_text().replace('"machine-token"', '"${CREDENTIALS_DIRECTORY}/machine-token"')
    config.write_text(text)
    env = agent_environ()
    env.pop("CREDENTIALS_DIRECTORY", None)
    done = subprocess.run(
        [sys.executable, "-m", "agent", "check-config", "--config", str(config), "--connect"],
        capture_output=True,
        text=True,
        env=env,
        timeout=20,
        check=False,
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert _one_line(done.stderr).startswith(
        "restore-agent: config cloudly.token_file: ${CREDENTIALS_DIRECTORY}/machine-token: "
        "$CREDENTIALS_DIRECTORY is not set"
    )


def test_check_config_accepts_the_config_option_and_the_positional_path(tmp_path: Path) -> None:
    """`check-config --config PATH`, as every other command, and the older `check-config
    PATH` both check the file."""
    config = _write(tmp_path)
    for args in (["--config", str(config)], [str(config)]):
        assert main(["check-config", *args]) == 0


# --- the state directory ------------------------------------------------------------------------


@contextmanager
def _read_only(directory: Path) -> Iterator[tuple[str, ...]]:
    """A command prefix under which `directory` cannot be written: a read-only bind mount in
    a private mount namespace for root (as ProtectSystem=strict makes it; gone with the
    process), the write bits taken away for anyone else."""
    directory.mkdir(mode=0o700)
    if os.geteuid() != 0:
        directory.chmod(0o500)
        try:
            yield ()
        finally:
            directory.chmod(0o700)
        return
    unshare = shutil.which("unshare")
    script = 'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"'
    prefix = (str(unshare), "--mount", "--propagation", "private", "sh", "-c", script, "sh")
    probe = subprocess.run(
        [*prefix, str(directory), "true"], capture_output=True, timeout=20, check=False
    )
    if unshare is None or probe.returncode != 0:
        pytest.skip("root without a private mount namespace cannot make a read-only directory")
    yield (*prefix, str(directory))


def test_a_read_only_state_directory_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """A state directory the agent cannot write (outside ReadWritePaths=): no traceback, no
    restart loop, one line naming state.directory from both run and check-config."""
    config = _write(tmp_path)
    with _read_only(tmp_path / "state") as prefix:
        ran = _agent("run", "--config", str(config), prefix=prefix)
        checked = _agent("check-config", "--config", str(config), prefix=prefix)
    assert (ran.returncode, checked.returncode) == (2, 2), ran.stderr
    line = _one_line(ran.stderr)
    assert line.startswith(f"restore-agent: config state.directory: {tmp_path / 'state'}: ")
    assert "is not writable" in line
    assert _one_line(checked.stderr) == line
    assert list((tmp_path / "state").iterdir()) == []


def test_a_missing_parent_is_not_created(tmp_path: Path) -> None:
    """A mistyped state.directory whose parent does not exist: exit 2 with one line saying the
    agent creates only the directory itself, and nothing is created."""
    config = _write(tmp_path, state='directory = "var/lib/restore-agnet"')
    ran = _agent("run", "--config", str(config))
    assert ran.returncode == 2
    line = _one_line(ran.stderr)
    assert line.startswith(
        f"restore-agent: config state.directory: {tmp_path / 'var/lib/restore-agnet'}: "
    )
    assert "the agent creates only the directory itself (under systemd, StateDirectory=" in line
    assert not (tmp_path / "var").exists()


async def _start_and_stop(config_path: Path, **options: Any) -> list[dict[str, Any]]:
    """Run the agent from `config_path` until its health endpoint listens, then stop it; its
    log events."""
    config = load_config(config_path)
    stop, ready = asyncio.Event(), asyncio.Event()
    with structlog.testing.capture_logs() as logs:
        task = asyncio.create_task(
            app.run(config, stop=stop, on_ready=lambda _: ready.set(), **options)
        )
        waiting = asyncio.create_task(ready.wait())
        await asyncio.wait({task, waiting}, timeout=15, return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
        stop.set()
        await task
    return logs


async def test_a_missing_state_directory_is_created_alone_with_a_warning(tmp_path: Path) -> None:
    """Only the directory itself is created (0700), and the start-up says so at warning: a
    new store and key may mean a mistyped path."""
    logs = await _start_and_stop(_write(tmp_path))
    assert stat.S_IMODE((tmp_path / "state").stat().st_mode) == 0o700
    [created] = [entry for entry in logs if entry["event"] == "state_directory_created"]
    assert created["log_level"] == "warning"
    assert created["state_directory"] == str(tmp_path / "state")
    assert "StateDirectory=" in created["hint"]


async def test_an_existing_state_directory_brings_no_warning(tmp_path: Path) -> None:
    """A second start finds its directory: no state_directory_created line."""
    config = _write(tmp_path)
    await _start_and_stop(config)
    logs = await _start_and_stop(config)
    assert [entry for entry in logs if entry["event"] == "state_directory_created"] == []


async def test_a_bad_key_file_refuses_before_the_store_is_created(tmp_path: Path) -> None:
    """A key file others may read stops start-up before the database exists."""
    config = load_config(_key_readable_by_others(tmp_path))
    with pytest.raises(ConfigError, match=r"state\.directory: .*group or others have access"):
        async with asyncio.timeout(15):
            await app.run(config, stop=asyncio.Event())
    assert sorted(path.name for path in (tmp_path / "state").iterdir()) == [KEY_FILE]


async def test_two_file_mode_agents_cannot_share_a_state_directory(tmp_path: Path) -> None:
    """With credential_source = "file" too, a second agent on a running agent's state
    directory stops at once: one line naming state.directory, exit 75 (it may start once the
    first is gone); the first stays connected."""
    document = cluster_document("cluster-1", {"node-1": "http://10.0.0.1:3000"})
    async with StandInCloudly(token=TOKEN, cluster=document) as cloudly:
        config_path = _write(tmp_path, url=cloudly.url)
        status, stop = AgentStatus(), asyncio.Event()
        first = asyncio.create_task(app.run(load_config(config_path), stop=stop, status=status))
        try:
            async with asyncio.timeout(15):
                await status.wait_until(lambda s: s.state is SessionState.CONNECTED)
            second = await asyncio.to_thread(
                _agent, "run", "--config", str(config_path), timeout=30
            )
            assert status.snapshot().state is SessionState.CONNECTED
        finally:
            stop.set()
            await first
    assert second.returncode == 75
    assert _one_line(second.stderr) == (
        f"restore-agent: state.directory: {tmp_path / 'state'}: another restore-agent uses this "
        "state directory"
    )
    assert cloudly.count("connected") == 1


async def test_the_second_agent_in_one_process_is_refused_too(tmp_path: Path) -> None:
    """`app.run` itself takes the lock: StartupBlocked for a second run on the directory."""
    config = load_config(_write(tmp_path))
    stop, ready = asyncio.Event(), asyncio.Event()
    first = asyncio.create_task(app.run(config, stop=stop, on_ready=lambda _: ready.set()))
    try:
        async with asyncio.timeout(15):
            await ready.wait()
        with pytest.raises(StartupBlocked, match="another restore-agent uses this state"):
            async with asyncio.timeout(15):  # a second agent that starts would run on
                await app.run(config, stop=asyncio.Event())
    finally:
        stop.set()
        await first


# --- start-up warnings --------------------------------------------------------------------------


async def test_allowed_cleartext_is_warned_at_start_up(tmp_path: Path) -> None:
    """cloudly.allow_cleartext lets a remote http:// URL through, and every start says so at
    warning level."""
    config = _write(tmp_path, url="http://cloudly.invalid", cloudly="allow_cleartext = true")
    logs = await _start_and_stop(config)
    [warning] = [entry for entry in logs if entry["event"] == "cloudly_cleartext"]
    assert warning["log_level"] == "warning"
    assert warning["cloudly_url"] == "ws://cloudly.invalid"


def _wait_for_line(path: Path, needle: str, process: subprocess.Popen[bytes]) -> str:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and process.poll() is None:
        for line in path.read_text().splitlines():
            if needle in line:
                return line
        time.sleep(0.05)
    raise AssertionError(f"{needle!r} not logged: {path.read_text()}")


def test_the_pure_decode_path_is_a_warning_at_start_up(tmp_path: Path) -> None:
    """An install without the native decoder (a wheel built without a compiler) starts, and
    its start-up says so at warning level, not only in the info line's chunk_decoders."""
    config = _write(tmp_path)
    stderr = tmp_path / "agent.err"
    without_native = (
        "import sys; sys.modules['agent._bufferform'] = None; "
        "from agent.entry.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    with stderr.open("wb") as err:
        process = subprocess.Popen(
            [sys.executable, "-c", without_native, "run", "--config", str(config)],
            stderr=err,
            env=agent_environ(),
            cwd=REPO,
        )
    try:
        line = _wait_for_line(stderr, "chunk_decoder_pure", process)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)
    assert '"level": "warning"' in line
    assert '"buffer": "simdjson"' in line


# --- fatal lines in the journal -----------------------------------------------------------------


# Each case: the command that fails and its exit code.
FATAL = {"config-error": ("run", 2), "port-in-use": ("run", 75), "status-unreadable": ("status", 1)}


@pytest.mark.parametrize("case", sorted(FATAL))
def test_a_fatal_line_carries_the_error_priority_in_the_journal(tmp_path: Path, case: str) -> None:
    """When stderr is the journal ($JOURNAL_STREAM names it), the one line that says why the
    command failed starts with <3>, so `journalctl -p warning` shows it."""
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = int(taken.getsockname()[1])
        health = f'listen = "127.0.0.1:{port}"'
        if case == "config-error":
            config = _write(tmp_path, health=health, state='directory = ""')
        else:
            config = _write(tmp_path, health=health)
        if case == "status-unreadable":
            taken.close()  # nothing answers there
        command, code = FATAL[case]
        journal = tmp_path / "journal"
        with journal.open("wb") as stream:
            info = os.fstat(stream.fileno())
            done = subprocess.run(
                [sys.executable, "-m", "agent", command, "--config", str(config)],
                stdout=subprocess.DEVNULL,
                stderr=stream,
                env=agent_environ(JOURNAL_STREAM=f"{info.st_dev}:{info.st_ino}"),
                cwd=REPO,
                timeout=20,
                check=False,
            )
    assert done.returncode == code
    assert len(journal.read_text().splitlines()) == 1, journal.read_text()
    [line] = journal.read_text().splitlines()
    assert line.startswith("<3>restore-agent: ")
