"""`restore-agent`: the command line (`run`, `check-config`, `rotate-key`, `--version`).

`rotate-key --config PATH` replaces the agent's X25519 recipient key in the state directory and
forgets its enrollment, so the next start enrolls the new key with Cloudly (docs/credentials.md,
"Rotation"). It refuses while an agent runs on that directory: stop the service, rotate, start.

Exit codes: 0 success, 2 configuration error (one line on stderr, no traceback; argparse uses 2
for usage errors too), 1 unexpected crash (logged once, with its traceback, through the
redacting logger). `agent.app` is imported only by `run`, so `check-config` works without the
daemon's dependencies being importable. The demo is not part of the product: it lives in the
repository's `devstack` package (`python -m devstack.demo`).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, Final

import structlog

from agent import __version__
from agent.config import Config, load_config, load_secrets
from agent.credentials.keys import rotate_key
from agent.errors import ConfigError
from agent.log import configure_logging, register_secret

__all__ = ["EXIT_CONFIG", "EXIT_CRASH", "EXIT_OK", "main"]

EXIT_OK: Final = 0
EXIT_CRASH: Final = 1
EXIT_CONFIG: Final = 2
# What a shell reports for a process ended by SIGINT (Ctrl-C in the foreground).
_EXIT_INTERRUPTED: Final = 130

_PROG: Final = "restore-agent"

_log = structlog.get_logger(__name__)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command in `argv` (default: `sys.argv[1:]`) and return its exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        namespace = _parser().parse_args(args)
    except SystemExit as exc:  # --help, --version and usage errors
        return exc.code if isinstance(exc.code, int) else EXIT_CONFIG
    command: Callable[[argparse.Namespace], int] = namespace.command
    return _guarded(lambda: command(namespace))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=_PROG,
        description="serve.zone relay-side restore agent",
    )
    parser.add_argument("--version", action="version", version=f"{_PROG} {__version__}")
    commands = parser.add_subparsers(title="commands", required=True, metavar="COMMAND")

    run = commands.add_parser("run", help="run the agent daemon")
    run.add_argument("--config", type=Path, required=True, metavar="PATH", help="TOML file")
    run.set_defaults(command=_run)

    check = commands.add_parser(
        "check-config", help="validate a configuration file and the secret files it names"
    )
    check.add_argument("path", type=Path, metavar="PATH", help="TOML file")
    check.set_defaults(command=_check_config)

    rotate = commands.add_parser(
        "rotate-key",
        help="replace the recipient key Cloudly seals credentials to (the agent must be stopped)",
    )
    rotate.add_argument("--config", type=Path, required=True, metavar="PATH", help="TOML file")
    rotate.set_defaults(command=_rotate_key)
    return parser


def _guarded(command: Callable[[], int]) -> int:
    """Run `command`, mapping a configuration error to 2 and anything unexpected to 1."""
    try:
        return command()
    except KeyboardInterrupt:
        return _EXIT_INTERRUPTED
    except ConfigError as exc:
        _fail(exc)
        return EXIT_CONFIG
    except Exception as exc:  # noqa: BLE001  # the top of the process: report once, exit 1
        config_error = _config_error_in(exc)
        if config_error is not None:
            _fail(config_error)
            return EXIT_CONFIG
        if not structlog.is_configured():
            configure_logging()
        # critical: a crash must show whatever level the operator chose.
        _log.critical("agent_crashed", exc_info=True)
        return EXIT_CRASH


def _config_error_in(exc: BaseException) -> ConfigError | None:
    """The ConfigError an exception group (from a TaskGroup) carries, if any."""
    if isinstance(exc, ConfigError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _config_error_in(inner)
            if found is not None:
                return found
    return None


def _fail(exc: ConfigError) -> None:
    line = " ".join(str(exc).split())  # one line, whatever the message holds
    print(f"{_PROG}: {line}", file=sys.stderr)


def _check_config(namespace: argparse.Namespace) -> int:
    config = load_config(namespace.path)
    load_secrets(config)
    print(f"config OK: {namespace.path}")
    for line in _summary(config):
        print(f"  {line}")
    return EXIT_OK


def _summary(config: Config) -> list[str]:
    """What an operator checks at a glance; paths and settings only, never a secret."""
    return [
        f"cloudly:    {config.websocket_url}",
        f"token:      {config.cloudly.token_file}",
        f"credential: {_credential_summary(config)}",
        f"state:      {config.state.directory}",
        f"log:        {config.log.format}, {config.log.level}",
    ]


def _credential_summary(config: Config) -> str:
    path = config.corestore.credential_file
    if path is not None:
        return f"file {path} (development option)"
    return "sealed per node by Cloudly (recipient key in the state directory)"


def _rotate_key(namespace: argparse.Namespace) -> int:
    config = load_config(namespace.config)
    if config.corestore.credential_source != "sealed":
        raise ConfigError(
            "corestore.credential_source",
            'is "file": the agent holds no recipient key to rotate',
        )
    key = rotate_key(config.state.directory)
    print(f"recipient key rotated: public key {key.public_key}")
    print("  the agent enrolls it with Cloudly on its next start")
    return EXIT_OK


def _run(namespace: argparse.Namespace) -> int:
    config = load_config(namespace.config)
    # Read now, once, so a bad secret file stops start-up with exit code 2 before anything
    # connects; the composition root gets them and registers them with the log redactor.
    secrets = load_secrets(config)
    for secret in secrets.all():
        register_secret(secret)  # from here on no log line can carry them
    configure_logging(config.log.format, config.log.level)
    app = importlib.import_module("agent.app")
    run: Callable[..., Coroutine[Any, Any, None]] = app.run
    asyncio.run(run(config, secrets=secrets))
    return EXIT_OK
