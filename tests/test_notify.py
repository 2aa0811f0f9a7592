"""sd_notify: where messages go, what they say, and that failing to send never stops the agent."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from agent.watch.notify import Notifier, watchdog_seconds


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[tuple[str, socket.socket]]:
    """A datagram socket at a path, as systemd's notify socket."""
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(5)
    yield str(path), sock
    sock.close()


def test_messages_arrive_in_order(receiver: tuple[str, socket.socket]) -> None:
    """READY=1 with a status, a status, a watchdog ping and STOPPING=1, each one datagram."""
    address, sock = receiver
    notifier = Notifier.from_environment({"NOTIFY_SOCKET": address})
    notifier.ready("starting")
    notifier.status("connected to Cloudly")
    notifier.watchdog()
    notifier.stopping("stopping")
    notifier.close()
    assert [sock.recv(4096).decode() for _ in range(4)] == [
        "READY=1\nSTATUS=starting",
        "STATUS=connected to Cloudly",
        "WATCHDOG=1",
        "STOPPING=1\nSTATUS=stopping",
    ]


def test_an_abstract_socket_name_is_used_as_such() -> None:
    """`@name` addresses the abstract socket `\\0name`."""
    name = f"restore-agent-test-{uuid.uuid4().hex}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + name.encode())
    sock.settimeout(5)
    notifier = Notifier(f"@{name}")
    try:
        notifier.watchdog()
        assert sock.recv(4096) == b"WATCHDOG=1"
    finally:
        notifier.close()
        sock.close()


def test_a_status_cannot_add_assignments(receiver: tuple[str, socket.socket]) -> None:
    """A newline in a status text (an error message) becomes a space, so it cannot say
    READY=1 or anything else on its own line."""
    address, sock = receiver
    notifier = Notifier(address)
    notifier.status("Cloudly unreachable:\nREADY=1\n  really")
    notifier.close()
    assert sock.recv(4096) == b"STATUS=Cloudly unreachable: READY=1 really"


def test_without_notify_socket_nothing_is_sent() -> None:
    """Outside a Type=notify unit the notifier is disabled and every call is a no-op."""
    notifier = Notifier.from_environment({})
    notifier.ready("x")
    notifier.watchdog()
    assert notifier.enabled is False


def test_a_relative_address_is_ignored() -> None:
    """Only absolute paths and @names are notify sockets."""
    assert Notifier("relative/path").enabled is False


def test_a_manager_that_went_away_is_warned_about_once(tmp_path: Path) -> None:
    """Sending to a socket nobody listens on logs one warning and never raises."""
    notifier = Notifier(str(tmp_path / "gone.sock"))
    with structlog.testing.capture_logs() as logs:
        notifier.watchdog()
        notifier.watchdog()
    notifier.close()
    assert [entry["event"] for entry in logs] == ["notify_failed"]


@pytest.mark.parametrize(
    ("environ", "seconds"),
    [
        ({"WATCHDOG_USEC": "30000000"}, 30.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}, 30.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "soon"}, None),
        ({}, None),
    ],
)
def test_the_watchdog_period_is_read_for_this_process(
    environ: dict[str, str], seconds: float | None
) -> None:
    """WATCHDOG_USEC counts only when WATCHDOG_PID is unset or names this process."""
    assert watchdog_seconds(environ) == seconds
