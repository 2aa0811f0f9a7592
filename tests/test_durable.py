"""Specification of `agent.durable`: a private file replaced atomically, whole, or not at all."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from agent.durable import write_atomically


def test_the_file_holds_every_byte_even_when_writes_are_short(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write may take fewer bytes than it was given: the rest follows."""
    write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: write(fd, bytes(data)[:5]))
    data = bytes(range(256)) * 3
    write_atomically(tmp_path / "f", data)
    assert (tmp_path / "f").read_bytes() == data


def test_the_file_is_private_and_replaces_the_old_one(tmp_path: Path) -> None:
    """Mode 0600 whatever the umask, and the old content is gone; no temporary file stays."""
    path = tmp_path / "f"
    path.write_bytes(b"old")
    path.chmod(0o644)
    write_atomically(path, b"new")
    assert path.read_bytes() == b"new"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk refuses (the fsync fails): `OSError`, the old file as it was, nothing else."""
    path = tmp_path / "f"
    path.write_bytes(b"old")

    def refused(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", refused)
    with pytest.raises(OSError, match="No space left"):
        write_atomically(path, b"new")
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def test_a_temporary_file_a_crash_left_is_replaced(tmp_path: Path) -> None:
    """The temporary name of a crashed writer with this pid does not block the next write."""
    path = tmp_path / "f"
    (tmp_path / f".f.{os.getpid()}.tmp").write_bytes(b"half")
    write_atomically(path, b"whole")
    assert path.read_bytes() == b"whole"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]
