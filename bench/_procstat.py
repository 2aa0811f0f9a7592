"""Process and machine facts for the benchmarks, read from /proc (Linux only).

- `cpu_seconds(pid)`: user + system CPU time of a process so far (/proc/<pid>/stat, 10 ms
  ticks on most kernels), so a benchmark can charge a span of work to a child process.
- `memory_kib(pid)`: its current and peak resident set size (VmRSS, VmHWM).
- `machine_facts()`: nproc, CPU model, kernel, Python and Node versions, for the record.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

__all__ = ["cpu_seconds", "filesystem_of", "machine_facts", "memory_kib"]

_TICKS = os.sysconf("SC_CLK_TCK")
_OCTAL = re.compile(r"\\([0-7]{3})")  # how /proc/mounts escapes a space, tab, newline, backslash


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds `pid` has used."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    return (utime + stime) / _TICKS


def memory_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of `pid` in KiB: resident now, and the peak so far."""
    values: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0])
    return values["VmRSS"], values["VmHWM"]


def filesystem_of(path: Path) -> str:
    """The filesystem `path` lives on, with its mount options ("ext4 rw,relatime,discard"):
    a Corestore writing and syncing every chunk there moves with it (docs/benchmarks.md)."""
    target = path.resolve()
    best: tuple[int, str] = (-1, "unknown")
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return "unknown"
    for line in mounts:
        fields = line.split()
        if len(fields) < 4:
            continue
        point = Path(_OCTAL.sub(lambda m: chr(int(m[1], 8)), fields[1]))
        if (target == point or point in target.parents) and len(point.parts) > best[0]:
            best = (len(point.parts), f"{fields[2]} {fields[3]}")
    return best[1]


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.partition(":")[2].strip()
    return platform.processor() or "unknown"


def _node_version() -> str:
    node = shutil.which("node")
    if node is None:
        return "absent"
    return subprocess.run(
        [node, "--version"], capture_output=True, text=True, check=True
    ).stdout.strip()


def machine_facts() -> dict[str, str]:
    """What the figures were measured on."""
    return {
        "nproc": str(len(os.sched_getaffinity(0))),
        "cpu": _cpu_model(),
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "node": _node_version(),
    }
