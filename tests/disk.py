"""A small real file system that fills up: a tmpfs mounted for one test (root only).

`small_disk(directory, size)` mounts a tmpfs of `size` bytes on `directory` (made if missing)
and unmounts it afterwards; the test is skipped where it cannot mount (not root, no mount
namespace rights). `Disk.fill()` writes a filler file until the file system has no room left
(ENOSPC), `Disk.free()` removes it: the disk refuses writes exactly as a full node disk does,
with no fault injection in between.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

__all__ = ["Disk", "small_disk"]

_FILLER = ".filler"


@dataclass(frozen=True, slots=True)
class Disk:
    """A mounted tmpfs."""

    path: Path

    def fill(self) -> None:
        """Write until the file system refuses (ENOSPC); nothing is left free."""
        block = b"\0" * 65536
        with (self.path / _FILLER).open("ab", buffering=0) as filler:
            for size in (65536, 4096, 512, 1):
                try:
                    while True:
                        filler.write(block[:size])
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise

    def free(self) -> None:
        """Remove the filler: the room comes back."""
        with contextlib.suppress(FileNotFoundError):
            (self.path / _FILLER).unlink()

    def free_bytes(self) -> int:
        info = os.statvfs(self.path)
        return info.f_bavail * info.f_frsize


@contextlib.contextmanager
def small_disk(directory: Path, size: int) -> Iterator[Disk]:
    """A tmpfs of `size` bytes on `directory` for the duration of the block."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    directory.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(directory)],
        capture_output=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.decode().strip()}")
    try:
        yield Disk(directory)
    finally:
        subprocess.run(["umount", "-l", str(directory)], capture_output=True, check=False)
