"""`python -m devstack.demo`: one isolated restore against the embedded stack, then nothing left."""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from devstack import demo


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """The demo configures logging for its run; leave it as the test found it."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    websockets_level = logging.getLogger("websockets").level
    yield
    structlog.reset_defaults()
    root.handlers[:] = handlers
    root.setLevel(level)
    logging.getLogger("websockets").setLevel(websockets_level)


@pytest.fixture(autouse=True)
def _scratch_in_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The demo's scratch directories go under the test's own tmp dir: a failing `--keep` test
    leaves no 0600 secret files in the machine's temp dir."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    return scratch


def _events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines()]


def test_the_demo_restores_verifies_and_cleans_up_leaving_nothing_behind(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`demo --json`: exit 0, every status up to cleaned, sha256 verified, the workdir removed."""
    code = demo.main(["--size", "3MiB", "--json"])
    out, err = capsys.readouterr()
    events = _events(out)
    assert (code, err) == (0, "")
    statuses = [event["status"] for event in events if event["event"] == "state"]
    assert statuses[:2] == ["preparing", "prepared"]  # the answer, then the settled state
    assert statuses[-1] == "cleaned"
    assert "ready" in statuses
    summary = events[-1]
    assert summary["event"] == "summary"
    assert (summary["objects"], summary["resources"]) == (9, 3)
    verified = next(event for event in events if event["event"] == "verified")
    assert verified["objects"] == 9
    assert not Path(events[0]["workdir"]).exists()
    assert not list(Path(tempfile.gettempdir()).iterdir())


def test_the_demo_backs_a_service_up_and_restores_its_database_byte_identical(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The closure goes to the stand-in Cloudly and comes back into a fresh database with the
    same sha256, with progress lines both ways."""
    code = demo.main(["--size", "1k", "--closure-size", "3MiB", "--json"])
    out, err = capsys.readouterr()
    events = {event["event"]: event for event in _events(out)}
    assert (code, err) == (0, "")
    assert events["backed-up"]["snapshots"] == ["database", "objectstorage"]
    assert events["restored"]["sha256"] == events["backed-up"]["sha256"]
    assert events["summary"]["closure_bytes"] == 3 * 1024 * 1024
    directions = {e["direction"] for e in _events(out) if e["event"] == "closure-progress"}
    assert directions == {"received", "served"}


def test_the_demo_keeps_its_directory_when_asked(capsys: pytest.CaptureFixture[str]) -> None:
    """`--keep` leaves the directory (config, the 0600 machine token and recipient key, the agent
    log) and says where; by default no Corestore credential file exists: it came sealed."""
    code = demo.main(["--size", "1k", "--keep"])
    out, _ = capsys.readouterr()
    kept = Path(out.splitlines()[-2].removeprefix("kept "))
    try:
        assert code == 0
        assert out.splitlines()[-1].startswith("done in ")
        assert "credential sealed per node by the stand-in Cloudly" in out
        log = (kept / "agent.log").read_text()
        assert '"event": "recipient_enrolled"' in log
        assert '"event": "corestore_credential_fetched"' in log
        for secret in ("machine-token", "state/recipient.key"):
            assert (kept / secret).stat().st_mode & 0o777 == 0o600
        assert not (kept / "corestore-credential").exists()
    finally:
        shutil.rmtree(kept, ignore_errors=True)


def test_the_demo_runs_the_file_credential_option_too(capsys: pytest.CaptureFixture[str]) -> None:
    """`--credential-source file`: the bearer comes from a 0600 file; no key is made."""
    code = demo.main(["--size", "1k", "--keep", "--credential-source", "file"])
    out, _ = capsys.readouterr()
    kept = Path(out.splitlines()[-2].removeprefix("kept "))
    try:
        assert code == 0
        assert "one bearer from a 0600 file (development option)" in out
        assert (kept / "corestore-credential").stat().st_mode & 0o777 == 0o600
        assert not (kept / "state" / "recipient.key").exists()
    finally:
        shutil.rmtree(kept, ignore_errors=True)


@pytest.fixture
def _default_health_port_held() -> Iterator[None]:
    """127.0.0.1:9733 (the default `[health] listen`) taken, as on a node running an agent."""
    holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        holder.bind(("127.0.0.1", 9733))
        holder.listen(1)
    except OSError as exc:  # someone else holds it already: the condition this test wants
        if exc.errno != errno.EADDRINUSE:
            raise
    try:
        yield
    finally:
        holder.close()


@pytest.mark.usefixtures("_default_health_port_held")
def test_the_demo_runs_where_an_agent_already_holds_the_default_health_port(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Nodes and dev boxes run an agent on 127.0.0.1:9733: the demo listens on a free port."""
    code = demo.main(["--size", "1k", "--closure-size", "64k", "--json"])
    out, err = capsys.readouterr()
    assert (code, err) == (0, "")
    assert _events(out)[-1]["event"] == "summary"


REPO = Path(__file__).resolve().parents[2]


def _start_demo(scratch: Path) -> subprocess.Popen[str]:
    """`scripts/run` (the demo) in a subprocess whose temp dir is `scratch`; returns once it
    stages (the agent, both stand-ins and the scratch directory exist, a stream is in flight)."""
    process = subprocess.Popen(
        # A large object, so that the interrupt lands mid-stage.
        [str(REPO / "scripts" / "run"), "--size", "256MiB"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "TMPDIR": str(scratch)},
    )
    assert process.stdout is not None
    for line in process.stdout:
        if line.lstrip().startswith("stage "):
            return process
    process.kill()
    raise AssertionError(f"the demo never staged: {process.communicate()}")


def _scratch(tmp_path: Path) -> Path:
    scratch = tmp_path / "demo-tmp"
    scratch.mkdir()
    return scratch


def test_ctrl_c_stops_the_demo_within_seconds_leaving_nothing(tmp_path: Path) -> None:
    """SIGINT mid-stage: the demo says it stops, exits 130 within a few seconds (not after its
    calls time out) and leaves nothing in its temp dir."""
    scratch = _scratch(tmp_path)
    process = _start_demo(scratch)
    interrupted = time.monotonic()
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=30)
    seconds = time.monotonic() - interrupted
    assert process.returncode == 130, err
    assert seconds < 5
    assert err.splitlines()[-1] == "scripts/run: interrupted"
    assert "failed" not in err
    assert list(scratch.iterdir()) == []


def test_a_second_ctrl_c_quits_the_demo_at_once(tmp_path: Path) -> None:
    """Two SIGINTs in a row: exit 130 at once, and the scratch directory is gone all the same."""
    scratch = _scratch(tmp_path)
    process = _start_demo(scratch)
    interrupted = time.monotonic()
    process.send_signal(signal.SIGINT)
    process.send_signal(signal.SIGINT)
    process.communicate(timeout=30)
    assert process.returncode == 130
    assert time.monotonic() - interrupted < 5
    assert list(scratch.iterdir()) == []


def _scripts_run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(REPO / "scripts" / "run"), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )


def test_scripts_run_names_itself_in_its_help() -> None:
    """`scripts/run --help` shows `usage: scripts/run`, names `scripts/run --config PATH` and
    no command that does not exist."""
    done = _scripts_run("--help")
    assert done.returncode == 0
    assert done.stdout.startswith("usage: scripts/run ")
    assert "scripts/run --config PATH" in done.stdout
    assert "restore-agent demo" not in done.stdout
    assert "python -m devstack.demo" not in done.stdout


@pytest.mark.parametrize("form", ["--config=PATH", "--config PATH"])
def test_scripts_run_with_a_config_runs_the_daemon(tmp_path: Path, form: str) -> None:
    """Both spellings of `--config` start the daemon (here: refused, the file is missing),
    never the demo."""
    missing = tmp_path / "absent.toml"
    args = [f"--config={missing}"] if "=" in form else ["--config", str(missing)]
    done = _scripts_run(*args)
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1] == f"restore-agent: config: {missing}: no such file"
    assert done.stdout == ""
