"""Specification of `agent.log`: output formats and the redaction of secrets."""

from __future__ import annotations

import io
import json
import logging
import os
import secrets
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import structlog

from agent.log import configure_logging, redact_secrets, register_secret, scrub_text
from agent.secret import MASK, Secret


class Terminal(io.StringIO):
    """A text stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _reset_logging() -> Iterator[None]:
    """Leave structlog and the root logger as the test found them."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    websockets_level = logging.getLogger("websockets").level
    yield
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()
    root.handlers[:] = handlers
    root.setLevel(level)
    logging.getLogger("websockets").setLevel(websockets_level)


def json_lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def make_grant() -> str:
    """A compact JWS shaped like a restore grant (header.payload.signature)."""
    payload, signature = secrets.token_urlsafe(24), secrets.token_urlsafe(48)
    return f"eyJhbGciOiJFZERTQSJ9.eyJyZXN0b3JlIjoi{payload}.{signature}"


def make_token() -> str:
    """An opaque machine token, a shape no pattern recognises."""
    return f"mt{secrets.token_hex(20)}"


def fail(exc: Exception) -> None:
    raise exc


# --- formats ------------------------------------------------------------------------------------


def test_json_lines_when_not_a_terminal() -> None:
    """Off a terminal each event is one JSON object with timestamp, level, logger and event."""
    stream = io.StringIO()
    configure_logging(stream=stream)
    structlog.get_logger("agent.test").info("restore_started", restore_id="r-1")
    [line] = json_lines(stream)
    assert line["event"] == "restore_started"
    assert line["restore_id"] == "r-1"
    assert line["level"] == "info"
    assert line["logger"] == "agent.test"
    assert datetime.fromisoformat(line["timestamp"]).tzinfo is not None


def test_readable_console_output_on_a_terminal() -> None:
    """On a terminal the event is rendered as text, not JSON."""
    stream = Terminal()
    configure_logging(stream=stream)
    structlog.get_logger("agent.test").info("restore_started", restore_id="r-1")
    output = stream.getvalue()
    assert "restore_started" in output
    assert "restore_id" in output
    assert not output.lstrip().startswith("{")


def test_json_format_is_forced_on_a_terminal() -> None:
    """format="json" writes JSON even to a terminal."""
    stream = Terminal()
    configure_logging(format="json", stream=stream)
    structlog.get_logger().info("hello")
    assert json_lines(stream)[0]["event"] == "hello"


def test_console_format_off_a_terminal_has_no_colour_codes() -> None:
    """format="console" to a file is text without ANSI escape sequences."""
    stream = io.StringIO()
    configure_logging(format="console", stream=stream)
    structlog.get_logger().warning("hello", n=1)
    output = stream.getvalue()
    assert "hello" in output
    assert "\x1b[" not in output


def test_lines_into_the_journal_carry_their_priority(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When $JOURNAL_STREAM names the stream's file, each line starts with its syslog
    priority (journald stores it: `journalctl -p warning` finds the warnings)."""
    with (tmp_path / "journal").open("w+") as stream:
        info = os.fstat(stream.fileno())
        monkeypatch.setenv("JOURNAL_STREAM", f"{info.st_dev}:{info.st_ino}")
        configure_logging(format="json", level="debug", stream=stream)
        log = structlog.get_logger("agent.test")
        log.debug("d")
        log.info("i")
        log.warning("cloudly_session_lost")
        log.error("e")
        log.critical("c")
        logging.getLogger("aiohttp.test").warning("foreign")
        stream.flush()
        stream.seek(0)
        lines = stream.read().splitlines()
    priorities = [line[: line.index(">") + 1] for line in lines]
    assert priorities == ["<7>", "<6>", "<4>", "<3>", "<2>", "<4>"]
    assert json.loads(lines[2][3:])["event"] == "cloudly_session_lost"


def test_other_streams_get_no_priority_prefix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A $JOURNAL_STREAM naming another file (stderr redirected elsewhere) adds no prefix."""
    monkeypatch.setenv("JOURNAL_STREAM", "1:2")
    with (tmp_path / "file").open("w+") as stream:
        configure_logging(format="json", stream=stream)
        structlog.get_logger("agent.test").warning("w")
        stream.flush()
        stream.seek(0)
        assert stream.read().startswith("{")


def test_a_console_traceback_is_prefixed_line_by_line() -> None:
    """Forced on, the prefix starts every line, so a multi-line record keeps its priority."""
    stream = io.StringIO()
    configure_logging(format="console", stream=stream, priority_prefix=True)
    try:
        fail(RuntimeError("boom"))
    except RuntimeError:
        structlog.get_logger("agent.test").exception("crashed")
    lines = stream.getvalue().splitlines()
    assert len(lines) > 3
    assert all(line.startswith("<3>") for line in lines)


def test_contextvars_are_merged() -> None:
    """Values bound with structlog.contextvars appear in every event."""
    stream = io.StringIO()
    configure_logging(stream=stream)
    with structlog.contextvars.bound_contextvars(request_id="q-7"):
        structlog.get_logger().info("handled")
    assert json_lines(stream)[0]["request_id"] == "q-7"


def test_level_filters_lower_events() -> None:
    """At level warning, info and debug events are dropped."""
    stream = io.StringIO()
    configure_logging(level="warning", stream=stream)
    log = structlog.get_logger()
    log.debug("d")
    log.info("i")
    log.warning("w")
    assert [line["event"] for line in json_lines(stream)] == ["w"]


def test_stdlib_records_share_the_format() -> None:
    """Records of third-party stdlib loggers come out as the same JSON lines."""
    stream = io.StringIO()
    configure_logging(stream=stream)
    logging.getLogger("aiohttp.client").warning("retrying %s", "GET /x")
    [line] = json_lines(stream)
    assert (line["event"], line["logger"], line["level"]) == (
        "retrying GET /x",
        "aiohttp.client",
        "warning",
    )


def test_websockets_debug_output_is_capped() -> None:
    """Even at level debug, websockets' frame dumps are not logged."""
    stream = io.StringIO()
    configure_logging(level="debug", stream=stream)
    logging.getLogger("websockets.client").debug("> TEXT '...'")
    logging.getLogger("agent.session").debug("kept")
    assert [line["event"] for line in json_lines(stream)] == ["kept"]


def test_configuring_twice_does_not_duplicate_lines() -> None:
    """A second configure_logging replaces the first handler."""
    first, second = io.StringIO(), io.StringIO()
    configure_logging(stream=first)
    configure_logging(stream=second)
    structlog.get_logger().info("once")
    assert first.getvalue() == ""
    assert len(json_lines(second)) == 1


@pytest.mark.parametrize(("format", "level"), [("xml", "info"), ("json", "verbose")])
def test_unknown_format_or_level_is_refused(format: str, level: str) -> None:
    """configure_logging refuses a format or level it does not know."""
    with pytest.raises(ValueError, match="must be one of"):
        configure_logging(format=format, level=level, stream=io.StringIO())


# --- redaction ----------------------------------------------------------------------------------


@pytest.mark.parametrize("stream_type", [io.StringIO, Terminal], ids=["json", "console"])
def test_grant_and_token_never_reach_the_output(stream_type: type[io.StringIO]) -> None:
    """A grant and a token logged every way a value can travel appear nowhere in the output."""
    grant, token = make_grant(), make_token()
    register_secret(Secret(token))  # as read_secret_file does for the machine token
    stream = stream_type()
    configure_logging(level="debug", stream=stream)
    log = structlog.get_logger("agent.test")

    log.info("plain", restoreGrant=grant, machine_token=token)
    log.info("wrapped", value=Secret(grant), other=Secret(token))
    log.info(
        "nested",
        request={"identity": {"jwt": grant}, "items": [{"authToken": token}], "note": grant},
        pairs=[("x", Secret(token))],
    )
    log.info(f"event text carries {grant} and {token}")  # noqa: G004  # what is tested
    log.info("fragments", body=f'{{"restoreGrant": "{grant}"}}', header=f"Bearer {token}")
    try:
        fail(RuntimeError(f"Cloudly refused grant {grant} for token {token}"))
    except RuntimeError:
        log.exception("call_failed")
    try:
        fail(ValueError(f"bad {grant}"))
    except ValueError:
        logging.getLogger("aiohttp.client").exception("stdlib %s", token)

    output = stream.getvalue()
    assert "call_failed" in output
    assert "RuntimeError" in output
    assert grant not in output
    assert token not in output
    for part in grant.split("."):
        assert part not in output
    assert MASK in output


@pytest.mark.parametrize(
    ("template", "kept"),
    [
        ("grant {v} expired", "grant  expired"),
        ('{{"restoreGrant": "{v}", "n": 1}}', '{"restoreGrant": "", "n": 1}'),
        ("{{'authToken': '{v}'}}", "{'authToken': ''}"),
        ("Request(restore_grant='{v}', node_id='n1')", "Request(restore_grant='', node_id='n1')"),
        ("wss://cloudly.example.com/?token={v}&x=1", "wss://cloudly.example.com/?token=&x=1"),
        ("Authorization: Bearer {v}", "Authorization: "),
        ("header Bearer {v}", "header Bearer "),
        ("password={v}", "password="),
    ],
)
def test_secret_looking_text_is_scrubbed(template: str, kept: str) -> None:
    """Unregistered secrets are masked where their shape or their key gives them away."""
    value = make_grant() if "grant {v}" in template else f"s3cr3t{secrets.token_hex(8)}"
    scrubbed = scrub_text(template.format(v=value))
    assert value not in scrubbed
    assert scrubbed.replace(MASK, "") == kept


def test_ordinary_values_survive_unchanged() -> None:
    """Values that are no secret come out exactly as they went in."""
    stream = io.StringIO()
    configure_logging(stream=stream)
    fields: dict[str, Any] = {
        "restore_id": "r-2024-01-01",
        "node": "node-1",
        "path": "/var/lib/restore-agent/state.sqlite",
        "url": "wss://cloudly.example.com/typedrequest?cluster=c1",
        "sha256": "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
        "size": 4194304,
        "ratio": 0.25,
        "ok": True,
        "missing": None,
        "nested": {"objects": [{"path": "db/dump.sql", "size": 12}], "basic": "a=b"},
        "message": "basic validation failed: 'x': 'y', n=3",
    }
    structlog.get_logger("agent.test").info("restore_started: stage 1 of 3", **fields)
    [line] = json_lines(stream)
    assert line["event"] == "restore_started: stage 1 of 3"
    for key, value in fields.items():
        assert line[key] == value


def test_presence_flags_under_secret_names_are_kept() -> None:
    """`grant_present=True` or `token=None` says nothing secret and stays readable."""
    redacted = redact_secrets(None, "info", {"event": "e", "grant_present": True, "token": None})
    assert redacted == {"event": "e", "grant_present": True, "token": None}


def test_bytes_are_logged_as_their_size() -> None:
    """Payload bytes never reach the log, only their length."""
    redacted = redact_secrets(None, "info", {"event": "e", "chunk": b"\x00secret-bytes"})
    assert redacted["chunk"] == "<13 bytes>"


def test_arbitrary_objects_are_rendered_scrubbed() -> None:
    """An object logged as a value is rendered through repr and scrubbed."""

    class Request:
        def __repr__(self) -> str:
            return f"Request(token='{token}')"

    token = make_token()
    redacted = redact_secrets(None, "info", {"event": "e", "request": Request()})
    assert redacted["request"] == f"Request(token='{MASK}')"


def test_redaction_does_not_change_the_logged_objects() -> None:
    """The dicts and lists handed to the logger are left as they were."""
    grant = make_grant()
    request = {"restoreGrant": grant, "items": [{"token": "t" * 20}]}
    redact_secrets(None, "info", {"event": "e", "request": request})
    assert request == {"restoreGrant": grant, "items": [{"token": "t" * 20}]}


def test_short_values_are_not_registered() -> None:
    """Registering a very short secret does not shred ordinary text."""
    register_secret(Secret("on"))
    assert scrub_text("connection is on") == "connection is on"


def test_registered_secret_containing_another_is_masked_whole() -> None:
    """The longest registered value is masked first, so no tail of it survives."""
    short = make_token()
    long = short + "-suffix-" + secrets.token_hex(8)
    register_secret(Secret(short))
    register_secret(Secret(long))
    assert scrub_text(f"a {long} b {short}") == f"a {MASK} b {MASK}"
