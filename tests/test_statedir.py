"""Specification of `agent.store.statedir`: the state directory's checks, creation and lock."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from agent.errors import ConfigError, StartupBlocked
from agent.store import statedir


def test_an_existing_writable_directory_passes(tmp_path: Path) -> None:
    """A directory the agent may write is accepted and nothing is created in it."""
    statedir.check(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_missing_directory_with_a_parent_passes_and_is_created_alone(tmp_path: Path) -> None:
    """`check` accepts a missing leaf; `create` makes it (0700) and says it did, once."""
    directory = tmp_path / "state"
    statedir.check(directory)
    assert not directory.exists()
    assert statedir.create(directory) is True
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert statedir.create(directory) is False


def test_a_regular_file_is_refused(tmp_path: Path) -> None:
    """A file where the directory should be names state.directory."""
    path = tmp_path / "state"
    path.write_text("")
    with pytest.raises(ConfigError, match=r"config state\.directory: .*: is not a directory$"):
        statedir.check(path)


def test_a_missing_parent_is_refused_and_not_created(tmp_path: Path) -> None:
    """Two missing levels: refused with the systemd hint, nothing made."""
    with pytest.raises(ConfigError, match="creates only the directory itself"):
        statedir.create(tmp_path / "a" / "state")
    assert not (tmp_path / "a").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes where the mode says it may not")
def test_a_directory_without_write_permission_is_refused(tmp_path: Path) -> None:
    """No write bit for the agent: refused as not writable."""
    tmp_path.joinpath("state").mkdir(mode=0o500)
    try:
        with pytest.raises(ConfigError, match="is not writable"):
            statedir.check(tmp_path / "state")
    finally:
        tmp_path.joinpath("state").chmod(0o700)


def test_the_lock_is_held_until_closed(tmp_path: Path) -> None:
    """A second lock on the directory is StartupBlocked while the first is held; after close
    it is free again."""
    held = statedir.lock(tmp_path)
    try:
        with pytest.raises(StartupBlocked, match="another restore-agent uses this state"):
            statedir.lock(tmp_path)
    finally:
        held.close()
    statedir.lock(tmp_path).close()
    assert stat.S_IMODE((tmp_path / statedir.LOCK_FILE).stat().st_mode) == 0o600


def _short_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every `os.write` takes at most 7 bytes, as a write may on a busy or nearly full disk."""
    write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: write(fd, bytes(data)[:7]))


def test_the_record_of_a_refused_start_is_whole_even_when_writes_are_short(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that takes fewer bytes than it was given is followed by another: the record
    `status` prints is the whole line, not its first bytes."""
    _short_writes(monkeypatch)
    message = "restore-agent: the state database is damaged; run state salvage"
    assert statedir.record_down(
        tmp_path, reason="state-damaged", message=message, exit_code=65, at_ms=1, version="1"
    )
    down = statedir.read_down(tmp_path)
    assert down is not None
    assert down["message"] == message
    assert stat.S_IMODE((tmp_path / statedir.DOWN_FILE).stat().st_mode) == 0o600


def test_give_back_changes_nothing_for_another_user_than_root(tmp_path: Path) -> None:
    (tmp_path / "recipient.key").write_bytes(b"k")
    assert statedir.give_back(tmp_path, euid=1000) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can own a file for another user")
def test_give_back_hands_what_root_wrote_to_the_directorys_owner(tmp_path: Path) -> None:
    """rotate-key run as root: the new key belongs to the unit's user, as the directory does."""
    directory = tmp_path / "state"
    directory.mkdir()
    os.chown(directory, 4321, 4321)
    (directory / "recipient.key").write_bytes(b"k")
    (directory / "agent.lock").write_bytes(b"")
    assert statedir.give_back(directory) == ["agent.lock", "recipient.key"]
    owners = {(p.stat().st_uid, p.stat().st_gid) for p in directory.iterdir()}
    assert owners == {(4321, 4321)}
