"""systemd's notify protocol (sd_notify(3)): `READY=1`, `STATUS=`, `WATCHDOG=1`, `STOPPING=1`.

`Notifier.from_environment()` reads `$NOTIFY_SOCKET` (an absolute path, or `@name` for an
abstract socket) and sends each message as one datagram on a non-blocking unix socket; with
the variable unset (not started by a `Type=notify` unit: tests, a terminal) every call does
nothing. A message that cannot be sent (the manager went away, its queue is full) is logged
once at warning and dropped: telling systemd must never stop the agent. `watchdog_seconds()`
reads `$WATCHDOG_USEC` (for this process, when `$WATCHDOG_PID` names another one it is not).

A `STATUS=` text is one line: newlines would start further assignments, so they become
spaces. Our own module rather than `sdnotify` (unmaintained since 2017, no abstract sockets
until a fork) or `systemd-python` (a C extension linking libsystemd, for four messages).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import Final

import structlog

__all__ = ["Notifier", "watchdog_seconds"]

_log = structlog.get_logger("agent.watch.notify")

# Longer status texts are cut: systemctl shows one line, and a datagram must stay small.
_MAX_STATUS: Final = 400


def watchdog_seconds(environ: Mapping[str, str] | None = None) -> float | None:
    """`WatchdogSec=` as systemd passed it (`$WATCHDOG_USEC`), None when there is no watchdog
    for this process."""
    env = os.environ if environ is None else environ
    usec, pid = env.get("WATCHDOG_USEC", ""), env.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    if pid and (not pid.isdigit() or int(pid) != os.getpid()):
        return None
    return int(usec) / 1_000_000


class Notifier:
    """Messages to the service manager; every method is a no-op without `$NOTIFY_SOCKET`."""

    def __init__(self, address: str | None) -> None:
        """`address` is `$NOTIFY_SOCKET`'s value (a path, or `@name` for an abstract socket)."""
        self._address: str | bytes | None = None
        self._socket: socket.socket | None = None
        self._warned = False
        if address:
            if address.startswith("@"):
                self._address = b"\0" + address[1:].encode()
            elif address.startswith("/"):
                self._address = address
            else:
                _log.warning("notify_socket_ignored", reason="neither an absolute path nor @name")

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> Notifier:
        """The notifier for `$NOTIFY_SOCKET` (none when unset)."""
        env = os.environ if environ is None else environ
        return cls(env.get("NOTIFY_SOCKET"))

    @property
    def enabled(self) -> bool:
        """Whether messages go anywhere."""
        return self._address is not None

    def ready(self, status: str) -> None:
        """The agent serves: `READY=1` with its first status line."""
        self._send(f"READY=1\nSTATUS={_one_line(status)}")

    def status(self, text: str) -> None:
        """What `systemctl status` shows as the agent's state."""
        self._send(f"STATUS={_one_line(text)}")

    def watchdog(self) -> None:
        """The event loop is healthy (`WATCHDOG=1`)."""
        self._send("WATCHDOG=1")

    def stopping(self, status: str) -> None:
        """The agent began its ordered shutdown."""
        self._send(f"STOPPING=1\nSTATUS={_one_line(status)}")

    def close(self) -> None:
        """Close the socket (idempotent); later messages open it again."""
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    def _send(self, message: str) -> None:
        if self._address is None:
            return
        try:
            if self._socket is None:
                self._socket = socket.socket(
                    socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK
                )
            self._socket.sendto(message.encode(), self._address)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                _log.warning("notify_failed", error=exc.strerror or str(exc), message=message)
            return


def _one_line(text: str) -> str:
    return " ".join(text.split())[:_MAX_STATUS]
