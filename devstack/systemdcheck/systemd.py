"""The systemd side of the checks: `systemctl`, `journalctl` and `systemd-analyze` run as
subprocesses (through asyncio, so the stand-ins in the same loop keep serving the agent while a
command waits), each with a deadline, and `until()`, the one way a check waits: it polls a
probe until it answers or the deadline passes. Nothing here sleeps to let time pass."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeVar

__all__ = [
    "CheckFailed",
    "Completed",
    "JournalEntry",
    "Unit",
    "cgroup_hierarchy",
    "journal_cursor",
    "parse_timespan",
    "proc_argv",
    "proc_environ",
    "proc_uid",
    "process_state",
    "run",
    "until",
]

T = TypeVar("T")
_POLL_S: Final = 0.1
_SPAN: Final = re.compile(r"(\d+(?:\.\d+)?)(us|ms|s|min|h|d)")
_SPAN_UNITS: Final = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


class CheckFailed(Exception):
    """A check's expectation did not hold; the message says what was seen instead."""


@dataclass(frozen=True, slots=True)
class Completed:
    """A finished command: its exit code and its output."""

    argv: tuple[str, ...]
    code: int
    out: str
    err: str

    def expect(self, *codes: int) -> Completed:
        """Self if the exit code is one of `codes` (default 0), else `CheckFailed`."""
        if self.code not in (codes or (0,)):
            tail = (self.err.strip() or self.out.strip()).splitlines()[-3:]
            raise CheckFailed(f"`{' '.join(self.argv)}` exited {self.code}: {' | '.join(tail)}")
        return self


async def run(
    *argv: str,
    timeout: float = 120.0,  # noqa: ASYNC109  # the command's own deadline
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    stdin: bytes | None = None,
) -> Completed:
    """Run `argv`; `CheckFailed` (after killing it) if it takes longer than `timeout`."""
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=cwd,
        env=dict(env) if env is not None else None,
    )
    try:
        async with asyncio.timeout(timeout):
            out, err = await process.communicate(stdin)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise CheckFailed(f"`{' '.join(argv)}` took longer than {timeout:g} s") from None
    assert process.returncode is not None
    return Completed(tuple(argv), process.returncode, out.decode(errors="replace"), err.decode())


async def until(
    probe: Callable[[], Awaitable[T | None]],
    *,
    timeout: float,  # noqa: ASYNC109  # the overall deadline of many probes
    what: str,
) -> T:
    """The first answer of `probe` that is not None, polled every 0.1 s; `CheckFailed`
    naming `what` once `timeout` seconds passed without one."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        answer = await probe()
        if answer is not None:
            return answer
        if loop.time() >= deadline:
            raise CheckFailed(f"{what}: not within {timeout:g} s")
        await asyncio.sleep(_POLL_S)


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """One journal entry: its text, its syslog priority and who wrote it."""

    message: str
    priority: int
    pid: int | None
    identifier: str

    @classmethod
    def from_json(cls, record: Mapping[str, Any]) -> JournalEntry:
        """From `journalctl -o json` (a MESSAGE that is not UTF-8 is a list of byte values)."""
        message = record.get("MESSAGE", "")
        if isinstance(message, list):
            message = bytes(message).decode(errors="replace")
        pid = record.get("_PID")
        return cls(
            str(message),
            int(record.get("PRIORITY", 6)),
            int(pid) if pid is not None else None,
            str(record.get("SYSLOG_IDENTIFIER", "")),
        )

    def agent_record(self) -> dict[str, Any] | None:
        """The agent's JSON log line, parsed, or None for any other text."""
        if not self.message.startswith("{"):
            return None
        try:
            parsed = json.loads(self.message)
        except ValueError:
            return None
        return parsed if isinstance(parsed, dict) else None


async def journal_cursor() -> str | None:
    """The cursor of the newest journal entry: `Unit.journal(after=...)` reads what follows."""
    done = (await run("journalctl", "-o", "json", "-n", "1", "--no-pager")).expect()
    lines = done.out.strip().splitlines()
    return str(json.loads(lines[-1])["__CURSOR"]) if lines else None


def _parse_show(text: str) -> dict[str, str]:
    values: dict[str, str] = {}
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        if sep:
            values[name] = value
    return values


class Unit:
    """One systemd unit, through `systemctl` and `journalctl`."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def systemctl(self, *arguments: str, timeout: float = 120.0) -> Completed:  # noqa: ASYNC109
        """`systemctl <arguments> <unit>` (the exit code is the caller's to judge)."""
        return await run("systemctl", "--no-pager", *arguments, self.name, timeout=timeout)

    async def show(self, *properties: str) -> dict[str, str]:
        """`systemctl show -p ...`: the named properties as text."""
        arguments = [item for name in properties for item in ("-p", name)]
        return _parse_show((await self.systemctl("show", *arguments)).expect().out)

    async def prop(self, name: str) -> str:
        """One property as text."""
        return (await self.show(name)).get(name, "")

    async def journal(
        self, *, after: str | None = None, priority: str | None = None
    ) -> list[JournalEntry]:
        """`journalctl -u <unit> [-p priority]` as entries, those after cursor `after` only.

        Not `--after-cursor`: with a filter, journalctl 252 seeks to the first *matching* entry
        at or after the cursor and then skips it as if it were the cursor's own entry, so the
        first match after an unmatched cursor is lost. `--cursor` (inclusive) and dropping the
        cursor's own entry says exactly "what came after".
        """
        argv = ["journalctl", "-u", self.name, "-o", "json", "--no-pager"]
        if priority is not None:
            argv += ["-p", priority]
        if after is not None:
            argv.append(f"--cursor={after}")
        done = (await run(*argv)).expect()
        records = (json.loads(line) for line in done.out.splitlines() if line)
        return [
            JournalEntry.from_json(record)
            for record in records
            if after is None or record.get("__CURSOR") != after
        ]


def proc_environ(pid: int) -> dict[str, str]:
    """The environment a process started with (`/proc/PID/environ`)."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    pairs = (item.partition(b"=") for item in raw.split(b"\0") if item)
    return {key.decode(errors="replace"): value.decode(errors="replace") for key, _, value in pairs}


def proc_argv(pid: int) -> Sequence[str]:
    """A process's command line (`/proc/PID/cmdline`)."""
    raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    return [item.decode(errors="replace") for item in raw.split(b"\0") if item]


def proc_uid(pid: int) -> int:
    """A process's real uid (`/proc/PID/status`)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise CheckFailed(f"/proc/{pid}/status names no uid")


def process_state(pid: int) -> str | None:
    """A process's state letter (`T` stopped), or None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    return stat.rpartition(")")[2].split()[0]


def parse_timespan(text: str) -> float:
    """Seconds of a systemd time span as `systemctl show` prints it (`1min 30s`, `500ms`,
    `0`)."""
    compact = text.replace(" ", "")
    if compact == "0":  # how systemctl shows a span that is off
        return 0.0
    parts = _SPAN.findall(compact)
    if not parts or "".join(number + unit for number, unit in parts) != compact:
        raise ValueError(f"not a time span: {text!r}")
    return sum(float(number) * _SPAN_UNITS[unit] for number, unit in parts)


async def cgroup_hierarchy() -> str:
    """`unified` (cgroup2 at /sys/fs/cgroup), `hybrid` (v1 controllers and a cgroup2 mount at
    /sys/fs/cgroup/unified) or `legacy`."""
    kinds = (await run("stat", "-fc", "%T", "/sys/fs/cgroup", "/sys/fs/cgroup/unified")).out
    found = kinds.split()
    if found[:1] == ["cgroup2fs"]:
        return "unified"
    return "hybrid" if found[1:2] == ["cgroup2fs"] else "legacy"
