"""Logging: the one `structlog.configure()` call and the redaction every log line passes through.

`configure_logging()` routes structlog *and* the standard library's `logging` (websockets,
aiohttp, asyncio) through one handler and one processor chain, so third-party records get the
same timestamps, JSON shape and redaction as ours. Output is JSON lines (one object per line, for
journald) unless the stream is a terminal or `format="console"` asks for readable text.

When the stream is the journal (`$JOURNAL_STREAM` names its device and inode, as systemd sets it
for a service's stdout/stderr, see systemd.exec(5)), every line starts with its syslog priority
(`<3>` error, `<4>` warning, `<6>` info, `<7>` debug, `<2>` critical; sd-daemon(3)), which
journald strips and stores, so `journalctl -p warning` finds the agent's warnings.

`redact_secrets` is the last processor before the renderer, after exceptions were turned into
text, so a secret cannot reach the output through a value, a nested container, the event text or
a traceback. It masks, in order of certainty:

- every `agent.secret.Secret`;
- the values of keys whose name mentions a secret (`restoreGrant`, `authToken`, `jwt`, ...);
- literal occurrences of the secrets registered with `register_secret` (the machine token and
  the Corestore credential register themselves when read from their files);
- secret-looking text inside strings: compact JWS/JWT, `Bearer` values, `Authorization:`
  header values and `"restoreGrant": "..."` / `token=...` fragments.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from collections.abc import Mapping
from typing import Any, Final, TextIO

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

from agent.secret import MASK, Secret

__all__ = [
    "LOG_FORMATS",
    "LOG_LEVELS",
    "PRIORITIES",
    "configure_logging",
    "is_journal",
    "redact_secrets",
    "register_secret",
    "scrub_text",
]

LOG_FORMATS: Final = ("auto", "json", "console")
LOG_LEVELS: Final = ("debug", "info", "warning", "error", "critical")
# syslog priorities (sd-daemon(3) prefixes) of the levels.
PRIORITIES: Final = {"debug": 7, "info": 6, "warning": 4, "error": 3, "critical": 2}

# Marks the handler configure_logging() installs, so a second call replaces it instead of
# doubling every line.
_HANDLER_NAME: Final = "restore-agent"

# Third-party loggers whose verbose levels would dump wire frames (payload bytes and the
# getIdentityByToken request) into the log: never below INFO whatever the agent's level.
_CAPPED_LOGGERS: Final = ("websockets",)

_SENSITIVE_WORD: Final = (
    r"(?:grant|token|jwt|bearer|authori[sz]ation|credential|password|secret|cookie)"
)
_SENSITIVE_KEY: Final = re.compile(_SENSITIVE_WORD, re.IGNORECASE)

# Quoted keys (`"restoreGrant": "..."` in JSON, `'authToken': '...'` in a Python repr) and
# `key=value` pairs (`?token=...` in a URL, `restore_grant='...'` in a model repr). The key is
# matched possessively and checked in `_mask_keyed_fragment`: a regex that looked for the
# sensitive word inside the key would backtrack quadratically over long unbroken strings.
_QUOTED_VALUE: Final = r"""(?P<vq>["'])(?:\\.|(?!(?P=vq))[^\n])*+(?P=vq)"""
_KEYED_FRAGMENTS: Final = (
    re.compile(r"""(?P<key>(?P<kq>["'])[^"'\n]{1,128}+(?P=kq))(?P<sep>\s*:\s*)""" + _QUOTED_VALUE),
    re.compile(
        r"(?<![\w.-])(?P<key>[\w.-]{1,128}+)(?P<sep>\s*=\s*)"
        rf"""(?:{_QUOTED_VALUE}|[^\s&,;"'<>()\[\]{{}}]++)"""
    ),
)
# Whatever follows these is a credential by construction.
_CREDENTIAL_PATTERNS: Final = (
    # A bearer token after its scheme word.
    re.compile(r"(?P<keep>\bbearer\s+)[A-Za-z0-9._~+/=-]++", re.IGNORECASE),
    # The value of an Authorization header line (scheme and credential).
    re.compile(
        r"(?P<keep>\b(?:proxy-)?authorization:[ \t]*)[^\s\"',;]++(?:[ \t]+[^\s\"',;]+)?",
        re.IGNORECASE,
    ),
    # Compact JWS (three parts, the signature may be empty) or JWE (five parts).
    re.compile(r"(?P<keep>)eyJ[A-Za-z0-9_-]++(?:\.[A-Za-z0-9_-]*+){2,4}"),
)

# Registered secret values, longest first so a secret containing another is masked whole.
# Copy-on-write under a lock: readers (any thread that logs) take the tuple without locking.
_MIN_REGISTERED_LENGTH: Final = 8
_MAX_REGISTERED: Final = 256
_registry_lock = threading.Lock()
_registered: tuple[str, ...] = ()


def register_secret(secret: Secret) -> None:
    """Mask every literal occurrence of `secret` in log output from now on.

    For secrets whose format no pattern recognises (an opaque machine token). Values shorter
    than 8 characters are ignored: masking them would shred ordinary text. The registry keeps
    the 256 most recently registered values.
    """
    value = secret.reveal()
    if len(value) < _MIN_REGISTERED_LENGTH:
        return
    global _registered
    with _registry_lock:
        kept = [known for known in _registered if known != value]
        kept.append(value)
        # The oldest registration goes first; order by length only for matching.
        recent = kept[-_MAX_REGISTERED:]
        _registered = tuple(sorted(recent, key=len, reverse=True))


def scrub_text(text: str) -> str:
    """`text` with registered secrets and secret-looking fragments replaced by the mask."""
    for value in _registered:
        if value in text:
            text = text.replace(value, MASK)
    for pattern in _KEYED_FRAGMENTS:
        text = pattern.sub(_mask_keyed_fragment, text)
    for pattern in _CREDENTIAL_PATTERNS:
        text = pattern.sub(_mask_credential, text)
    return text


def _mask_keyed_fragment(match: re.Match[str]) -> str:
    key = match.group("key")
    if not _is_sensitive_key(key):
        return match.group(0)
    quote = match.group("vq") or ""
    return f"{key}{match.group('sep')}{quote}{MASK}{quote}"


def _mask_credential(match: re.Match[str]) -> str:
    return f"{match.group('keep')}{MASK}"


def _is_sensitive_key(key: object) -> bool:
    return isinstance(key, str) and _SENSITIVE_KEY.search(key) is not None


def _redact_value(value: Any) -> Any:
    """A redacted copy of `value`; never mutates it (it may be a live request or state)."""
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, str):
        return scrub_text(value)
    if isinstance(value, Secret):
        return MASK
    if isinstance(value, Mapping):
        return {
            key: _mask_keyed(value_) if _is_sensitive_key(key) else _redact_value(value_)
            for key, value_ in value.items()
        }
    if isinstance(value, list | tuple | set | frozenset):
        return [_redact_value(item) for item in value]
    if isinstance(value, bytes | bytearray | memoryview):
        # Payload bytes never belong in a log; their size is what helps.
        return f"<{len(value)} bytes>"
    # Anything else would be rendered through repr(), which may quote a secret.
    return scrub_text(repr(value))


def _mask_keyed(value: Any) -> Any:
    # None and booleans carry no secret and say whether one was present, which helps debugging.
    if value is None or isinstance(value, bool):
        return value
    return MASK


def redact_secrets(logger: WrappedLogger, method: str, event_dict: EventDict) -> EventDict:
    """structlog processor: mask secrets anywhere in the event (see the module docstring)."""
    del logger, method
    return {
        key: _mask_keyed(value) if _is_sensitive_key(key) else _redact_value(value)
        for key, value in event_dict.items()
    }


def _cap_third_party_levels(level: int) -> None:
    for name in _CAPPED_LOGGERS:
        logging.getLogger(name).setLevel(max(level, logging.INFO))


def _renderer(format: str, stream: TextIO) -> Processor:
    is_tty = _isatty(stream)
    if format == "console" or (format == "auto" and is_tty):
        return structlog.dev.ConsoleRenderer(colors=is_tty)
    return structlog.processors.JSONRenderer()


def is_journal(stream: TextIO, environ: Mapping[str, str] | None = None) -> bool:
    """Whether `stream` is connected to the journal: `$JOURNAL_STREAM` (`DEVICE:INODE`) names
    the file it writes to."""
    value = (os.environ if environ is None else environ).get("JOURNAL_STREAM", "")
    device, _, inode = value.partition(":")
    if not (device.isdigit() and inode.isdigit()):
        return False
    try:
        info = os.fstat(stream.fileno())
    except (AttributeError, OSError, ValueError):  # no descriptor: a test buffer, a closed file
        return False
    return (info.st_dev, info.st_ino) == (int(device), int(inode))


class _WithPriority:
    """Wraps the renderer: each output line starts with the record's `<priority>`."""

    def __init__(self, renderer: Processor) -> None:
        self._renderer = renderer

    def __call__(self, logger: WrappedLogger, method: str, event_dict: EventDict) -> str:
        prefix = f"<{PRIORITIES.get(str(event_dict.get('level', 'info')), 6)}>"
        rendered = self._renderer(logger, method, event_dict)
        assert isinstance(rendered, str)  # both renderers render text
        # Every line: journald reads each as its own entry (a console traceback has many).
        return "\n".join(prefix + line for line in rendered.split("\n"))


def _isatty(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or minimal stream is no terminal
        return False


def configure_logging(
    format: str = "auto",
    level: str = "info",
    stream: TextIO | None = None,
    *,
    priority_prefix: bool | None = None,
) -> None:
    """Send all logging (structlog and stdlib) to `stream` (default: stderr), redacted.

    `format` is `auto` (JSON lines unless `stream` is a terminal), `json` or `console`;
    `level` one of `LOG_LEVELS`. `priority_prefix` starts each line with its `<N>` syslog
    priority; None decides by `is_journal(stream)`. Calling it again replaces the previous
    configuration.
    """
    if format not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, not {format!r}")
    if level not in LOG_LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LOG_LEVELS)}, not {level!r}")
    numeric_level = logging.getLevelName(level.upper())
    target = sys.stderr if stream is None else stream
    renderer = _renderer(format, target)
    if priority_prefix is None:
        priority_prefix = is_journal(target)

    # Shared by structlog events and foreign stdlib records before they reach the formatter.
    pre_chain: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=pre_chain,
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            structlog.processors.StackInfoRenderer(),
            # Exceptions become text here so redaction sees the traceback before rendering.
            structlog.processors.format_exc_info,
            redact_secrets,
            _WithPriority(renderer) if priority_prefix else renderer,
        ],
    )
    handler = logging.StreamHandler(target)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(formatter)

    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric_level)
    _cap_third_party_levels(numeric_level)

    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *pre_chain,
            structlog.stdlib.PositionalArgumentsFormatter(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        # Not cached: module-level loggers must follow a reconfiguration (tests, `run` after
        # the start-up defaults); the lookup costs little next to formatting a line.
        cache_logger_on_first_use=False,
    )
