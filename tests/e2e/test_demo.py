"""`python -m devstack.demo`: one isolated restore against the embedded stack, then nothing left."""

from __future__ import annotations

import errno
import json
import logging
import shutil
import socket
import tempfile
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
