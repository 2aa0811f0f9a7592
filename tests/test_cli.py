"""Specification of the `restore-agent` command line: commands, output and exit codes."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import subprocess
import sys
import types
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from agent import __version__
from agent.config import Config, Secrets
from agent.contracts.credentials import b64url
from agent.credentials.keys import ENROLLMENT_FILE, KEY_FILE, KeyStore
from agent.entry.cli import main
from agent.errors import ConfigError
from devstack.cloudly import ABSENT, StandInCloudly, cluster_document
from tests.processes import run_agent

REPO = Path(__file__).resolve().parents[1]
TOKEN = "machine-token-7f3a9c2e51d04b88"
CREDENTIAL = "corestore-credential-c41d9e77a02b"

CONFIG = """\
[cloudly]
url = "https://cloudly.example.com"
token_file = "machine-token"

[corestore]
credential_source = "file"
credential_file = "corestore-credential"

[state]
directory = "state"

[log]
format = "json"
level = "info"
"""

AppRun = Callable[..., Coroutine[Any, Any, None]]


@pytest.fixture(autouse=True)
def _reset_logging() -> Iterator[None]:
    """Leave structlog and the root logger as the test found them."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    structlog.reset_defaults()
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture(name="config_path")
def _config_path(tmp_path: Path) -> Path:
    """A valid config file beside owner-only token and credential files."""
    for name, value in (("machine-token", TOKEN), ("corestore-credential", CREDENTIAL)):
        (tmp_path / name).write_text(value + "\n", encoding="utf-8")
        (tmp_path / name).chmod(0o600)
    path = tmp_path / "config.toml"
    path.write_text(CONFIG, encoding="utf-8")
    return path


def install_app(monkeypatch: pytest.MonkeyPatch, run: AppRun) -> None:
    """Stand in for agent.entry.app (owned by the composition root) with a module exposing `run`."""
    module = types.ModuleType("agent.entry.app")
    module.run = run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "agent.entry.app", module)


@pytest.fixture
def app_runs(monkeypatch: pytest.MonkeyPatch) -> list[Config]:
    """agent.entry.app stood in by a `run` that records each Config it is started with."""
    runs: list[Config] = []

    async def run(config: Config, *, secrets: Secrets, config_path: Path) -> None:
        assert secrets.machine_token.reveal() == TOKEN  # read once, by the CLI, and passed on
        assert config_path.name == "config.toml"  # named in the start-up line
        runs.append(config)

    install_app(monkeypatch, run)
    return runs


def one_error_line(stderr: str) -> str:
    """The single line a configuration error prints; fails if there is more."""
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


# --- check-config -------------------------------------------------------------------------------


def test_check_config_accepts_a_good_file(
    config_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A valid file with valid secret files prints "config OK" and a summary, exit 0."""
    assert main(["check-config", str(config_path)]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"config OK: {config_path}\n")
    assert "wss://cloudly.example.com" in out
    assert str(config_path.parent / "machine-token") in out
    assert err == ""


def test_check_config_prints_no_secret(
    config_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The summary names the secret files but never their content."""
    main(["check-config", str(config_path)])
    out, err = capsys.readouterr()
    assert TOKEN not in out + err
    assert CREDENTIAL not in out + err


def test_check_config_refuses_an_unknown_key(
    config_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unknown key is one line on stderr naming it, exit 2."""
    config_path.write_text(CONFIG.replace("[log]", "[log]\ncolour = true"), encoding="utf-8")
    assert main(["check-config", str(config_path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert one_error_line(err) == "restore-agent: config log.colour: unknown key"


def test_check_config_refuses_a_wrong_type(
    config_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A value of the wrong type is one line naming key and types, exit 2."""
    config_path.write_text(CONFIG.replace('level = "info"', "level = 3"), encoding="utf-8")
    assert main(["check-config", str(config_path)]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        "restore-agent: config log.level: "
        "must be 'debug', 'info', 'warning', 'error' or 'critical', got an integer"
    )


def test_check_config_refuses_a_missing_token_file(
    config_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A token file that does not exist is reported under cloudly.token_file, exit 2."""
    token_file = config_path.parent / "machine-token"
    token_file.unlink()
    assert main(["check-config", str(config_path)]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"restore-agent: config cloudly.token_file: {token_file}: no such file"
    )


def test_check_config_refuses_a_world_readable_token_file(
    config_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A token file others can read is refused with its mode, exit 2, content not shown."""
    token_file = config_path.parent / "machine-token"
    token_file.chmod(0o644)
    assert main(["check-config", str(config_path)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line == (
        f"restore-agent: config cloudly.token_file: {token_file}: group or others have access "
        "(mode 0644); use 0600 or 0400"
    )
    assert TOKEN not in line


def test_check_config_refuses_a_missing_config_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A config path that does not exist is one line, exit 2."""
    assert main(["check-config", str(tmp_path / "absent.toml")]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"restore-agent: config: {tmp_path / 'absent.toml'}: no such file"
    )


def test_python_m_agent_accepts_a_good_file(config_path: Path) -> None:
    """`python -m agent check-config` on a good file prints "config OK", exit 0."""
    done = run_agent("check-config", str(config_path), cwd=config_path.parent)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith(f"config OK: {config_path}\n")


def test_python_m_agent_refuses_a_bad_file(config_path: Path) -> None:
    """`python -m agent check-config` on a bad file prints one line on stderr, exit 2."""
    config_path.write_text(CONFIG.replace("[corestore]", "[corestore]\nchunk_size = 1"))
    done = run_agent("check-config", str(config_path), cwd=config_path.parent)
    assert (done.returncode, done.stdout) == (2, "")
    assert one_error_line(done.stderr) == (
        "restore-agent: config corestore.chunk_size: must be >= 65536, got 1"
    )


# --- general ------------------------------------------------------------------------------------


def test_version_is_printed(capsys: pytest.CaptureFixture[str]) -> None:
    """--version prints the package version, exit 0."""
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"restore-agent {__version__}\n"


def test_missing_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """No command prints usage to stderr, exit 2."""
    assert main([]) == 2
    assert "usage: restore-agent" in capsys.readouterr().err


def test_run_requires_a_config_option(capsys: pytest.CaptureFixture[str]) -> None:
    """`run` without --config is a usage error, exit 2."""
    assert main(["run"]) == 2
    assert "--config" in capsys.readouterr().err


# --- run ----------------------------------------------------------------------------------------


def test_run_starts_the_app_with_the_loaded_config(
    config_path: Path, app_runs: list[Config]
) -> None:
    """`run --config PATH` awaits agent.entry.app.run with the validated Config, exit 0."""
    assert main(["run", "--config", str(config_path)]) == 0
    [config] = app_runs
    assert config.websocket_url == "wss://cloudly.example.com"


def test_run_configures_logging_from_the_config(
    config_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The app logs as [log] says: JSON lines at the configured level, on stderr."""
    config_path.write_text(CONFIG.replace('"info"', '"warning"'), encoding="utf-8")

    async def run(config: Config, *, secrets: Secrets, config_path: Path) -> None:
        log = structlog.get_logger("agent.entry.app")
        log.info("not_shown")
        log.warning("shown", token=TOKEN)

    install_app(monkeypatch, run)
    assert main(["run", "--config", str(config_path)]) == 0
    out, err = capsys.readouterr()
    assert out == ""
    [line] = [json.loads(text) for text in err.splitlines()]
    assert (line["event"], line["level"], line["logger"]) == ("shown", "warning", "agent.entry.app")
    assert TOKEN not in err


def test_run_with_a_bad_config_never_starts_the_app(
    config_path: Path, app_runs: list[Config], capsys: pytest.CaptureFixture[str]
) -> None:
    """A configuration error stops `run` before agent.entry.app is called, exit 2."""
    config_path.write_text(CONFIG + "[streams]\nwindow = 0\n", encoding="utf-8")
    assert main(["run", "--config", str(config_path)]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        "restore-agent: config streams.window: must be >= 1, got 0"
    )
    assert app_runs == []


SEATS = "max_stream_requests = 1024\nmax_stream_requests_per_node = {per_node}\n"


@pytest.mark.parametrize("per_node", [32, 0])
def test_check_config_and_run_agree_on_the_request_class_bounds(
    per_node: int, config_path: Path, app_runs: list[Config]
) -> None:
    """`check-config` accepts the request class bounds exactly when `run` does (a share of
    zero seats is refused by both)."""
    seats = SEATS.format(per_node=per_node)
    config_path.write_text(
        CONFIG.replace('token_file = "machine-token"\n', f'token_file = "machine-token"\n{seats}'),
        encoding="utf-8",
    )
    checked = main(["check-config", str(config_path)])
    ran = main(["run", "--config", str(config_path)])
    assert (checked, ran) == ((0, 0) if per_node else (2, 2))
    assert [config.cloudly.max_stream_requests_per_node for config in app_runs] == (
        [per_node] if per_node else []
    )


def test_run_with_a_bad_secret_file_never_starts_the_app(
    config_path: Path, app_runs: list[Config], capsys: pytest.CaptureFixture[str]
) -> None:
    """An unusable Corestore credential file stops `run` with exit 2."""
    (config_path.parent / "corestore-credential").write_text("", encoding="utf-8")
    assert main(["run", "--config", str(config_path)]) == 2
    assert "config corestore.credential_file:" in one_error_line(capsys.readouterr().err)
    assert app_runs == []


@pytest.mark.parametrize(
    "raised",
    [
        ConfigError("state.directory", "is not writable"),
        ExceptionGroup("app", [ConfigError("state.directory", "is not writable")]),
    ],
    ids=["plain", "in-group"],
)
def test_config_error_from_the_app_exits_2(
    config_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    raised: Exception,
) -> None:
    """A ConfigError the app raises at start-up (alone or from a TaskGroup) is exit 2."""

    async def run(config: Config, *, secrets: Secrets, config_path: Path) -> None:
        raise raised

    install_app(monkeypatch, run)
    assert main(["run", "--config", str(config_path)]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        "restore-agent: config state.directory: is not writable"
    )


def test_crash_is_logged_once_without_secrets_and_exits_1(
    config_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """An unexpected exception is one redacted log event with its traceback, exit 1."""

    async def run(config: Config, *, secrets: Secrets, config_path: Path) -> None:
        raise RuntimeError(f"unexpected while sending {TOKEN}")

    install_app(monkeypatch, run)
    assert main(["run", "--config", str(config_path)]) == 1
    err = capsys.readouterr().err
    events = [json.loads(text) for text in err.splitlines()]
    assert [event["event"] for event in events] == ["agent_crashed"]
    assert "RuntimeError: unexpected while sending" in events[0]["exception"]
    assert TOKEN not in err


def test_keyboard_interrupt_exits_130(config_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C in the foreground ends with the shell's SIGINT status and no traceback."""

    async def run(config: Config, *, secrets: Secrets, config_path: Path) -> None:
        raise KeyboardInterrupt

    install_app(monkeypatch, run)
    assert main(["run", "--config", str(config_path)]) == 130


def test_a_run_cancelled_by_a_second_ctrl_c_exits_130(
    config_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The app cancels itself on a second Ctrl-C: the shell's SIGINT status, no traceback."""

    async def run(config: Config, *, secrets: Secrets, config_path: Path) -> None:
        raise asyncio.CancelledError

    install_app(monkeypatch, run)
    assert main(["run", "--config", str(config_path)]) == 130
    assert capsys.readouterr().err == ""


# --- rotate-key ---------------------------------------------------------------------------------

SEALED_CONFIG = """\
[cloudly]
url = "https://cloudly.example.com"
token_file = "machine-token"

[state]
directory = "state"
"""


@pytest.fixture(name="sealed_config")
def _sealed_config(tmp_path: Path) -> Path:
    """A production-shaped config: no credential source named, so sealed."""
    path = tmp_path / "sealed.toml"
    path.write_text(SEALED_CONFIG, encoding="utf-8")
    return path


def test_rotate_key_replaces_the_key_and_forgets_the_enrollment(
    sealed_config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A new key (printed by its public half only), no enrollment left: exit 0."""
    state = sealed_config.parent / "state"
    KeyStore.open(state).close()
    old = (state / KEY_FILE).read_bytes()
    (state / ENROLLMENT_FILE).write_text("{}")
    assert main(["rotate-key", "--config", str(sealed_config)]) == 0
    out, err = capsys.readouterr()
    new = (state / KEY_FILE).read_bytes()
    assert new != old
    assert not (state / ENROLLMENT_FILE).exists()
    public = X25519PrivateKey.from_private_bytes(new).public_key().public_bytes_raw()
    assert out.splitlines()[0] == f"recipient key rotated: public key {b64url(public)}"
    assert new.hex() not in out + err
    assert err == ""


def test_rotate_key_refuses_while_an_agent_runs(
    sealed_config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The state directory is held by a running agent: exit 2, one line, the key unchanged."""
    state = sealed_config.parent / "state"
    store = KeyStore.open(state)
    try:
        assert main(["rotate-key", "--config", str(sealed_config)]) == 2
    finally:
        store.close()
    line = one_error_line(capsys.readouterr().err)
    assert line == (
        f"restore-agent: config state.directory: {state}: another restore-agent uses this "
        "state directory (stop it first)"
    )
    assert (state / KEY_FILE).read_bytes() == store.key.private_key.private_bytes_raw()


def test_rotate_key_refuses_the_file_credential_option(
    config_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With credential_source = "file" there is no key to rotate: exit 2, nothing written."""
    assert main(["rotate-key", "--config", str(config_path)]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        'restore-agent: config corestore.credential_source: is "file": the agent holds no '
        "recipient key to rotate"
    )


def test_check_config_names_the_credential_source(
    sealed_config: Path, config_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The summary says where each node's credential comes from."""
    assert main(["check-config", str(sealed_config)]) == 0
    assert "credential: sealed per node by Cloudly" in capsys.readouterr().out
    assert main(["check-config", str(config_path)]) == 0
    out = capsys.readouterr().out
    assert f"credential: file {config_path.parent / 'corestore-credential'}" in out


# --- check-config --connect, status, broken pipes ------------------------------------------------


def _point_at(config_path: Path, url: str, **sections: str) -> None:
    text = CONFIG.replace("https://cloudly.example.com", url)
    for name, body in sections.items():
        text += f"\n[{name}]\n{body}\n"
    config_path.write_text(text, encoding="utf-8")


async def test_connect_probe_says_what_works(
    config_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--connect: TLS (here none), the machine token and the cluster document, exit 0; nothing
    stays connected."""
    document = cluster_document("cluster-7", {"node-1": "http://10.0.0.1:3000", "node-2": ABSENT})
    async with StandInCloudly(token=TOKEN, cluster=document) as cloudly:
        _point_at(config_path, cloudly.url)
        code = await asyncio.to_thread(main, ["check-config", str(config_path), "--connect"])
        closed = await cloudly.wait_for("disconnected")
    out = capsys.readouterr().out
    assert code == 0
    assert f"cloudly: OK: connected to {cloudly.url.replace('http:', 'ws:')}" in out
    assert "  cluster cluster-7: 2 nodes, 1 with a valid Corestore endpoint\n" in out
    assert "  node node-2: no Corestore endpoint: " in out
    assert closed.detail["code"] == 1000
    assert cloudly.count("tag-set") == 0  # a probe is not the agent: no tag
    assert TOKEN not in out


async def test_connect_probe_names_a_refused_token(
    config_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A token Cloudly refuses: FAILED (token-refused) with the hint, exit 3."""
    async with StandInCloudly(
        token="another-token-0123456789", cluster=cluster_document("c", {})
    ) as cloudly:
        _point_at(config_path, cloudly.url)
        code = await asyncio.to_thread(main, ["check-config", str(config_path), "--connect"])
    out = capsys.readouterr().out
    assert code == 3
    assert "cloudly: FAILED (token-refused): Cloudly refused the machine token" in out
    assert "  hint: check the machine token credential (cloudly.token_file)\n" in out
    assert TOKEN not in out


def test_connect_probe_names_an_unreachable_cloudly(
    config_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing listening: FAILED (refused), a transient fault without a hint, exit 3."""
    port = _free_port()
    _point_at(config_path, f"http://127.0.0.1:{port}")
    assert main(["check-config", str(config_path), "--connect"]) == 3
    out = capsys.readouterr().out
    assert f"cloudly: FAILED (refused): could not reach Cloudly at 127.0.0.1:{port}" in out
    assert "hint" not in out


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _credentials_unset(config_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    config_path.write_text(
        CONFIG.replace('"machine-token"', '"${CREDENTIALS_DIRECTORY}/machine-token"'),
        encoding="utf-8",
    )


def _shutdown_past_the_unit(config_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    del monkeypatch
    config_path.write_text(
        CONFIG + "\n[shutdown]\ndrain_timeout_s = 200\nclose_timeout_s = 60\n", encoding="utf-8"
    )


def _ca_without_certificate(config_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    del monkeypatch
    (config_path.parent / "ca.pem").write_text("not a certificate\n", encoding="utf-8")
    config_path.write_text(
        CONFIG.replace(
            'token_file = "machine-token"', 'token_file = "machine-token"\nca_file = "ca.pem"'
        ),
        encoding="utf-8",
    )


def _state_directory_a_file(config_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    del monkeypatch
    (config_path.parent / "state").write_text("", encoding="utf-8")


@pytest.mark.parametrize(
    ("breakage", "line"),
    [
        (
            _credentials_unset,
            "restore-agent: config cloudly.token_file: ${CREDENTIALS_DIRECTORY}/machine-token: "
            "$CREDENTIALS_DIRECTORY is not set",
        ),
        (
            _shutdown_past_the_unit,
            "restore-agent: config shutdown.drain_timeout_s: a stop may take 567 s",
        ),
        (
            _ca_without_certificate,
            "restore-agent: config cloudly.ca_file: ",
        ),
        (_state_directory_a_file, "restore-agent: config state.directory: "),
    ],
    ids=["credentials-unset", "shutdown-budget", "ca-without-certificate", "state-a-file"],
)
def test_check_config_refuses_exactly_what_run_refuses(
    config_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    app_runs: list[Config],
    breakage: Callable[[Path, pytest.MonkeyPatch], None],
    line: str,
) -> None:
    """One preflight: where `run` stops with exit 2, `check-config` prints the very same line
    and exits 2, never `config OK` (it used to skip credentials outside the unit)."""
    breakage(config_path, monkeypatch)
    check_exit = main(["check-config", str(config_path)])
    checked = capsys.readouterr()
    run_exit = main(["run", "--config", str(config_path)])
    ran = capsys.readouterr()
    assert check_exit == run_exit == 2
    assert "config OK" not in checked.out
    assert one_error_line(checked.err) == one_error_line(ran.err)
    assert one_error_line(checked.err).startswith(line)
    assert app_runs == []


def test_check_config_says_what_start_up_tightens(
    config_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A state directory of mode 0777 passes, and check-config says start-up makes it 0700."""
    state = config_path.parent / "state"
    state.mkdir()
    state.chmod(0o777)
    assert main(["check-config", str(config_path)]) == 0
    out = capsys.readouterr().out
    assert f"  tightens:   state.directory {state}: mode 0777, start-up makes it 0700\n" in out


def test_check_config_states_the_shutdown_budget(
    config_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The summary says how long a stop may take against the unit's TimeoutStopSec=."""
    assert main(["check-config", str(config_path)]) == 0
    out = capsys.readouterr().out
    assert (
        "  shutdown:   at most 57 s, below stop_timeout_s 90 (the unit's TimeoutStopSec=)\n" in out
    )


def test_a_config_with_a_utf8_byte_order_mark_is_read(
    config_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A BOM (some Windows editors write one) is dropped, not reported as invalid TOML at
    line 1, column 1."""
    config_path.write_bytes(b"\xef\xbb\xbf" + CONFIG.encode())
    assert main(["check-config", str(config_path)]) == 0
    assert capsys.readouterr().out.startswith("config OK: ")


def test_status_of_an_agent_that_is_not_running_exits_1(
    config_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing answers at the health address: one line saying so, exit 1."""
    port = _free_port()
    _point_at(config_path, "https://cloudly.example.com", health=f'listen = "127.0.0.1:{port}"')
    assert main(["status", "--config", str(config_path)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert one_error_line(err).startswith(
        f"restore-agent: cannot read the agent's health endpoint at 127.0.0.1:{port}: "
    )


def test_output_into_a_closed_pipe_exits_141_quietly(config_path: Path) -> None:
    """`restore-agent ... | head` that stopped reading: exit 141 (128 + SIGPIPE), no
    traceback, no "Exception ignored" on stderr."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first line is written
    try:
        result = subprocess.run(
            [sys.executable, "-m", "agent", "check-config", str(config_path)],
            stdout=write_end,
            stderr=subprocess.PIPE,
            cwd=REPO,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert result.returncode == 141
    assert result.stderr == b""


def test_status_json_is_written_at_once_with_its_newline(
    config_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`status --json` writes the body and its newline in one write: a reader that stops after
    the body (`| head`) sees a complete answer, not a broken pipe on a newline written later."""
    writes: list[str] = []

    class Recorder:
        def write(self, text: str) -> int:
            writes.append(text)
            return len(text)

        def flush(self) -> None:
            pass

    monkeypatch.setattr("agent.entry.cli.fetch", lambda listen: {"ready": True, "session": {}})
    monkeypatch.setattr(sys, "stdout", Recorder())
    assert main(["status", "--config", str(config_path), "--json"]) == 0
    assert len(writes) == 1
    assert writes[0].endswith("}\n")


def test_status_of_an_agent_that_answers_not_ready_exits_3(
    config_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The agent answers but /readyz says 503: its reasons are printed, exit 3 (as
    `systemctl is-active` says 3 for a unit that is not active), so a script can tell."""
    answer = {"ready": False, "reasons": {"session": "the Cloudly session is connecting"}}
    monkeypatch.setattr("agent.entry.cli.fetch", lambda listen: answer)
    assert main(["status", "--config", str(config_path), "--json"]) == 3
    assert json.loads(capsys.readouterr().out)["reasons"] == answer["reasons"]


def test_rotate_key_without_config_reads_the_units_configuration(
    sealed_config: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`restore-agent rotate-key` as a runbook writes it: the installed config by default."""
    monkeypatch.setattr("agent.entry.cli.DEFAULT_CONFIG", sealed_config)
    state = sealed_config.parent / "state"
    KeyStore.open(state).close()
    old = (state / KEY_FILE).read_bytes()
    assert main(["rotate-key"]) == 0
    assert (state / KEY_FILE).read_bytes() != old
    assert capsys.readouterr().out.startswith("recipient key rotated: public key ")


def test_state_reset_without_config_reads_the_units_configuration(
    sealed_config: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("agent.entry.cli.DEFAULT_CONFIG", sealed_config)
    (sealed_config.parent / "state").mkdir()
    assert main(["state", "reset", "--start-empty"]) == 0
    assert capsys.readouterr().out.startswith("state reset: ")


def test_status_wait_asks_again_until_the_agent_is_ready(
    config_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`status --wait 60` after a restart: not ready twice, then ready: exit 0, one second
    between the asks, the ready answer printed."""
    answers = [{"ready": False}, {"ready": False}, {"ready": True, "session": {}}]
    slept: list[float] = []
    monkeypatch.setattr("agent.entry.cli.fetch", lambda listen: answers.pop(0))
    monkeypatch.setattr("agent.entry.cli.time.sleep", slept.append)
    assert main(["status", "--config", str(config_path), "--json", "--wait", "60"]) == 0
    assert slept == [1.0, 1.0]
    assert json.loads(capsys.readouterr().out)["ready"] is True


def test_check_config_names_the_metrics_listener_when_there_is_one(
    config_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with config_path.open("a") as config:
        config.write('\n[health]\nmetrics_listen = "127.0.0.2:9734"\n')
    assert main(["check-config", str(config_path)]) == 0
    assert (
        "  metrics:    127.0.0.2:9734 (/metrics alone, for Prometheus)" in capsys.readouterr().out
    )
