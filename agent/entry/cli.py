"""`restore-agent`: the command line (`run`, `check-config`, `status`, `rotate-key`, `--version`).

    restore-agent run --config PATH               the daemon (what the systemd unit runs)
    restore-agent check-config --config PATH [--connect]
                                                  every check `run` makes before it creates
                                                  or connects anything (agent/startup/preflight.py):
                                                  the file, the secrets and the CA file it
                                                  names, the state directory and key file;
                                                  "config OK" only when they all pass.
                                                  --connect also probes Cloudly once (TLS,
                                                  token, cluster document) and says what is
                                                  wrong. `check-config PATH` works too
    restore-agent status [--config PATH] [--json] the running agent, read from its health
                                                  endpoint: readiness, session, every restore
                                                  and every relay job; exit 0 only when it
                                                  is ready, 3 when it answers not ready, 1
                                                  when nothing answers (below)
    restore-agent rotate-key [--config PATH]      replace the X25519 recipient key in the state
                                                  directory and forget its enrollment, so the
                                                  next start enrolls the new key with Cloudly
                                                  (docs/credentials.md, "Rotation"); refused
                                                  while an agent runs on that directory
    restore-agent state salvage [--config PATH] [--sqlite3 PATH]
                                                  a damaged state database: every row SQLite
                                                  can still read into a new database in its
                                                  place, the damaged file kept aside, counts
                                                  per table printed (agent/store/salvage.py)
    restore-agent state rollback [--config PATH] [--copy NAME]
                                                  the copy start-up took before a migration
                                                  back in place of the migrated database
                                                  (kept aside), for the older agent
                                                  (agent/store/rollback.py); refused while an
                                                  agent runs on that directory
    restore-agent state reset [--config PATH] --start-empty
                                                  keep the state database aside and start
                                                  empty on purpose; both refused while an
                                                  agent runs on that directory, and both make
                                                  the next start reconcile with each node's
                                                  Corestore (agent/startup/reconcile.py)

Every command but `run` reads /etc/restore-agent/config.toml when no --config is given (the
unit's; `run` is what the unit starts, and names it). Run as root, the commands that write in
the state directory (`rotate-key`, `state ...`) hand what they wrote to the directory's owner,
the unit's `DynamicUser=` (`statedir.give_back`).

Exit codes (the unit's `RestartPreventExitStatus=2 65` keeps systemd from restarting only what
a restart cannot fix; docs/operations.md has the table):

    0    success (`status`: the agent answers and is ready)
    1    unexpected crash (logged once, with its traceback, through the redacting logger) or,
         for `status`, no agent answers (stopped, failed, or still starting); systemd restarts
    2    configuration: the file, the secret and CA files it names, file modes, the state
         directory (missing parent, not a directory, read-only); also a state database a
         newer agent migrated (both schema versions named: install that agent again); one
         line on stderr, no traceback. argparse uses 2 for usage errors too. systemd does
         not restart
    3    `check-config --connect` could not connect or authenticate; `status`: the agent
         answers but is not ready (its reasons printed), as `systemctl is-active` says 3 for
         a unit that is not active
    65   (EX_DATAERR) the state database is damaged (or an earlier agent moved a damaged one
         aside and nothing replaced it on purpose): one line naming the file and the way
         out (`state salvage` or `state reset --start-empty`); systemd does not restart, and
         every start refuses the same way until an operator acted
    75   start-up blocked for now (EX_TEMPFAIL): the health address is in use, another agent
         holds the state directory; one line; systemd restarts
    130  interrupted (Ctrl-C)
    141  (128 + SIGPIPE, as a process killed by it reports) the reader of the output went away
         (`... | head`): the rest of the output is dropped quietly, without a traceback

Every fatal line goes to stderr as one line; when stderr is the journal (`$JOURNAL_STREAM`,
agent/log.py) it starts with `<3>`, so `journalctl -p warning` shows why a start failed. A
start refused for its state database (65, or 2 for a newer schema) also leaves the line in
`<state>/agent-down.json`, which `status` prints when no agent answers.
A full or read-only state disk is no exit at all: the agent waits, serving health
(agent/startup/opening.py).
`agent.entry.app` is imported only by `run` and the session only by `--connect`, so the other
commands work without the daemon's dependencies. The demo is not part of the product: it lives
in the repository's `devstack` package.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, Final, NoReturn

import structlog

from agent import __version__
from agent.config import Config, load_config
from agent.credentials.keys import rotate_key
from agent.entry import statecommands
from agent.entry.exits import (
    EXIT_BROKEN_PIPE,
    EXIT_CONFIG,
    EXIT_CRASH,
    EXIT_DAMAGED,
    EXIT_INTERRUPTED,
    EXIT_NOT_READY,
    EXIT_OK,
    EXIT_TEMPORARY,
    EXIT_UNREACHABLE,
    PROG,
    fatal_line,
    one_line,
)
from agent.errors import (
    AgentError,
    ConfigError,
    StartupBlocked,
    StoreCorrupt,
    StoreNewer,
)
from agent.log import configure_logging, register_secret
from agent.startup import preflight
from agent.store import statedir
from agent.watch.statusview import StatusUnavailable, fetch, render, render_down

__all__ = [
    "DEFAULT_CONFIG",
    "EXIT_BROKEN_PIPE",
    "EXIT_CONFIG",
    "EXIT_CRASH",
    "EXIT_DAMAGED",
    "EXIT_NOT_READY",
    "EXIT_OK",
    "EXIT_TEMPORARY",
    "EXIT_UNREACHABLE",
    "main",
]

# Where the production install puts the configuration (see readme.md, "Install on a node").
DEFAULT_CONFIG: Final = Path("/etc/restore-agent/config.toml")


_log = structlog.get_logger(__name__)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command in `argv` (default: `sys.argv[1:]`) and return its exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        namespace = _parser().parse_args(args)
    except SystemExit as exc:  # --help, --version and usage errors
        return exc.code if isinstance(exc.code, int) else EXIT_CONFIG
    command: Callable[[argparse.Namespace], int] = namespace.command
    try:
        code = _guarded(lambda: command(namespace))
        sys.stdout.flush()  # inside the try: a reader that went away shows up here
    except BrokenPipeError:
        # Nobody reads the rest. Point stdout at /dev/null so the interpreter's final flush
        # cannot fail again and print a traceback.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_BROKEN_PIPE
    return code


class _Parser(argparse.ArgumentParser):
    """argparse, with its usage error as a fatal line (the journal priority included)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        fatal_line(f"{self.prog}: error: {message}")
        raise SystemExit(EXIT_CONFIG)


def _config_option(parser: argparse.ArgumentParser, *, required: bool) -> None:
    if required:
        parser.add_argument("--config", type=Path, required=True, metavar="PATH", help="TOML file")
    else:
        parser.add_argument(
            "--config",
            type=Path,
            metavar="PATH",
            help=f"TOML file (default {DEFAULT_CONFIG})",
        )


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="serve.zone relay-side restore agent",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(title="commands", required=True, metavar="COMMAND")

    run = commands.add_parser("run", help="run the agent daemon")
    _config_option(run, required=True)
    run.set_defaults(command=_run)

    check = commands.add_parser(
        "check-config",
        help="every check `run` makes before it starts: the file, the secret and CA files it "
        "names, the state directory",
    )
    _config_option(check, required=False)
    # The older spelling `check-config PATH`.
    check.add_argument("path", nargs="?", type=Path, metavar="PATH", help="same as --config")
    check.add_argument(
        "--connect",
        action="store_true",
        help="also connect to Cloudly once: TLS, the machine token, the cluster document",
    )
    check.set_defaults(command=_check_config)

    rotate = commands.add_parser(
        "rotate-key",
        help="replace the recipient key Cloudly seals credentials to (the agent must be stopped)",
    )
    _config_option(rotate, required=False)
    rotate.set_defaults(command=_rotate_key)
    state = commands.add_parser(
        "state", help="an operator's way out of a damaged state database (the agent stopped)"
    )
    actions = state.add_subparsers(title="actions", required=True, metavar="ACTION")
    salvage = actions.add_parser(
        "salvage",
        help="recover every row SQLite can still read into a new database; keep the damaged one",
    )
    _config_option(salvage, required=False)
    salvage.add_argument(
        "--sqlite3",
        metavar="PATH",
        help="a sqlite3 shell that has .recover (default: `sqlite3` on the PATH if it has it; "
        "else the rows are read through SQL)",
    )
    salvage.set_defaults(command=_state_salvage)
    reset = actions.add_parser(
        "reset", help="keep the state database aside and start empty on purpose"
    )
    _config_option(reset, required=False)
    reset.add_argument(
        "--start-empty",
        action="store_true",
        required=True,
        help="required: every record is forgotten (what Corestore holds is reconciled)",
    )
    reset.set_defaults(command=_state_reset)
    rollback = actions.add_parser(
        "rollback",
        help="put the copy taken before a migration back in place (before installing the "
        "older agent again)",
    )
    _config_option(rollback, required=False)
    rollback.add_argument("--copy", metavar="NAME", help="which copy (default: the newest)")
    rollback.set_defaults(command=_state_rollback)
    status = commands.add_parser(
        "status",
        help="the running agent: readiness, session, restores and relay jobs (health endpoint)",
    )
    _config_option(status, required=False)
    status.add_argument("--json", action="store_true", help="print the status as JSON")
    status.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="ask again every second until the agent is ready, for at most SECONDS (after a "
        "start, a restart or an upgrade)",
    )
    status.set_defaults(command=_status)
    return parser


def _config_path(namespace: argparse.Namespace) -> Path:
    """`--config`, or `check-config`'s positional PATH, or the installed default."""
    option: Path | None = namespace.config
    positional: Path | None = getattr(namespace, "path", None)
    if option is not None and positional is not None and option != positional:
        raise ConfigError("", f"two configuration files named: {positional} and --config {option}")
    return option or positional or DEFAULT_CONFIG


def _guarded(command: Callable[[], int]) -> int:
    """Run `command`, mapping a configuration error to 2, a blocked start-up to 75 and
    anything unexpected to 1."""
    try:
        return command()
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        raise  # main() ends the process quietly
    except Exception as exc:  # noqa: BLE001  # the top of the process: report once, exit 1
        refusal = _refusal_in(exc)
        if refusal is not None:
            fatal_line(f"{PROG}: {refusal}")
            return _exit_code(refusal)
        if not structlog.is_configured():
            configure_logging()
        # critical: a crash must show whatever level the operator chose.
        _log.critical("agent_crashed", exc_info=True)
        return EXIT_CRASH


_Refusal = ConfigError | StartupBlocked | StoreCorrupt | StoreNewer


def _exit_code(refusal: _Refusal) -> int:
    if isinstance(refusal, StartupBlocked):
        return EXIT_TEMPORARY
    if isinstance(refusal, StoreCorrupt):
        return EXIT_DAMAGED
    return EXIT_CONFIG


def _refusal_in(exc: BaseException) -> _Refusal | None:
    """The start-up refusal an exception (or a TaskGroup's exception group) carries, if any."""
    if isinstance(exc, ConfigError | StartupBlocked | StoreCorrupt | StoreNewer):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _refusal_in(inner)
            if found is not None:
                return found
    return None


def _check_config(namespace: argparse.Namespace) -> int:
    path = _config_path(namespace)
    config = load_config(path)
    # The very checks `run` makes (agent/startup/preflight.py), secrets included: outside the unit a
    # credential cannot be read, and `run` would stop there too.
    checked = preflight.check(config)
    print(f"config OK: {path}")
    for line in _summary(config):
        print(f"  {line}")
    for line in checked.tightens:
        print(f"  tightens:   {line}")
    if namespace.connect:
        return _probe(config, checked)
    return EXIT_OK


def _summary(config: Config) -> list[str]:
    """What an operator checks at a glance; paths and settings only, never a secret."""
    scrape = config.health.metrics_endpoint
    metrics = [] if scrape is None else [f"metrics:    {scrape} (/metrics alone, for Prometheus)"]
    return [
        f"cloudly:    {config.websocket_url}",
        f"token:      {config.cloudly.token_file}",
        f"credential: {_credential_summary(config)}",
        f"state:      {config.state.directory}",
        f"health:     {config.health.endpoint}",
        *metrics,
        f"shutdown:   at most {preflight.shutdown_budget(config):g} s, below "
        f"stop_timeout_s {config.shutdown.stop_timeout_s:g} (the unit's TimeoutStopSec=)",
        f"log:        {config.log.format}, {config.log.level}",
    ]


def _credential_summary(config: Config) -> str:
    path = config.corestore.credential_file
    if path is not None:
        return f"file {path} (development option)"
    return "sealed per node by Cloudly (recipient key in the state directory)"


def _rotate_key(namespace: argparse.Namespace) -> int:
    config = load_config(_config_path(namespace))
    if config.corestore.credential_source != "sealed":
        raise ConfigError(
            "corestore.credential_source",
            'is "file": the agent holds no recipient key to rotate',
        )
    statedir.create(config.state.directory)
    with statecommands.stopped(config) as directory:  # no agent, whatever its source, runs on it
        key = rotate_key(directory)
    print(f"recipient key rotated: public key {key.public_key}")
    print("  the agent enrolls it with Cloudly on its next start")
    return EXIT_OK


def _probe(config: Config, checked: preflight.Checked) -> int:
    """Connect to Cloudly once and say what works and what does not."""
    session_module = importlib.import_module("agent.session.client")
    faults = importlib.import_module("agent.session.faults")
    app_settings = importlib.import_module("agent.entry.app").session_settings
    status = importlib.import_module("agent.watch.status").AgentStatus()
    secrets = checked.secrets
    for secret in secrets.all():
        register_secret(secret)
    # The probe prints what it found; the session's own log lines would only repeat it.
    configure_logging(config.log.format, "critical")
    session = session_module.CloudlySession(
        app_settings(config), secrets.machine_token, status, ssl_context=checked.tls
    )
    try:
        view = asyncio.run(session.probe())
    except AgentError as exc:
        fault = faults.classify(exc)
        print(f"cloudly: FAILED ({fault.cause}): {fault.reason}")
        hint = faults.HINTS.get(fault.cause)
        if hint is not None:
            print(f"  hint: {hint}")
        return EXIT_UNREACHABLE
    usable = [node_id for node_id, node in sorted(view.nodes.items()) if node.corestore_endpoint]
    print(f"cloudly: OK: connected to {config.websocket_url}, machine token accepted")
    print(
        f"  cluster {view.cluster_id}: {len(view.nodes)} nodes, "
        f"{len(usable)} with a valid Corestore endpoint"
    )
    for node_id, node in sorted(view.nodes.items()):
        if not node.corestore_endpoint:
            print(f"  node {node_id}: no Corestore endpoint: {', '.join(node.corestore_problems)}")
    return EXIT_OK


def _status(namespace: argparse.Namespace) -> int:
    config = load_config(_config_path(namespace))
    data, unavailable = _ask_until_ready(config, namespace.wait)
    if data is None:
        down = statedir.read_down(config.state.directory)
        if down is None:
            fatal_line(f"{PROG}: {unavailable}")
            if statedir.down_unreadable(config.state.directory):
                print(
                    f"  why it is down may be recorded in {config.state.directory}, which only "
                    "root and the agent's user can read: sudo restore-agent status",
                    file=sys.stderr,
                )
        elif namespace.json:
            print(json.dumps({"ready": False, "down": down}, indent=2, sort_keys=True))
        else:
            sys.stdout.write(render_down(down, now_ms=time.time_ns() // 1_000_000))
        return EXIT_CRASH
    if namespace.json:
        # One write, the newline with it: a reader that stops after the body (`| head`)
        # does not turn a complete answer into a broken pipe.
        sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
    else:
        sys.stdout.write(render(data, now_ms=time.time_ns() // 1_000_000))
    return EXIT_OK if data.get("ready") is True else EXIT_NOT_READY


def _ask_until_ready(
    config: Config, wait: float
) -> tuple[dict[str, Any] | None, StatusUnavailable | None]:
    """The agent's status (or why none could be read), asked again every second while it is
    not ready, for at most `wait` seconds."""
    deadline = time.monotonic() + max(0.0, wait)
    while True:
        try:
            data: dict[str, Any] | None = fetch(config.health.endpoint)
            unavailable = None
        except StatusUnavailable as exc:
            data, unavailable = None, exc
        if (data is not None and data.get("ready") is True) or time.monotonic() >= deadline:
            return data, unavailable
        time.sleep(1.0)  # an operator's command polling a daemon, not a test


def _run(namespace: argparse.Namespace) -> int:
    config = load_config(namespace.config)
    # Checked now, before logging is set up, so a refusal is the one line that says why (exit
    # 2); the secrets read here go on to the composition root (which runs the same checks
    # and registers them with the log redactor too).
    checked = preflight.check(config)
    secrets = checked.secrets
    for secret in secrets.all():
        register_secret(secret)  # from here on no log line can carry them
    configure_logging(config.log.format, config.log.level)
    app = importlib.import_module("agent.entry.app")
    run: Callable[..., Coroutine[Any, Any, None]] = app.run
    try:
        asyncio.run(run(config, secrets=secrets, config_path=namespace.config))
    except asyncio.CancelledError:  # a second Ctrl-C skipped the drain (agent.entry.app)
        return EXIT_INTERRUPTED
    except Exception as exc:
        refusal = _refusal_in(exc)
        if isinstance(refusal, StoreCorrupt | StoreNewer):
            # What `status` says while the agent is down (the journal has the same line).
            statedir.record_down(
                config.state.directory,
                reason="state-damaged" if isinstance(refusal, StoreCorrupt) else "state-newer",
                message=one_line(f"{PROG}: {refusal}"),
                exit_code=_exit_code(refusal),
                at_ms=time.time_ns() // 1_000_000,
                version=__version__,
            )
        raise
    return EXIT_OK


def _state_salvage(namespace: argparse.Namespace) -> int:
    config = load_config(_config_path(namespace))
    return statecommands.salvage(config, sqlite3_cli=namespace.sqlite3)


def _state_reset(namespace: argparse.Namespace) -> int:
    return statecommands.reset(load_config(_config_path(namespace)))


def _state_rollback(namespace: argparse.Namespace) -> int:
    return statecommands.rollback(load_config(_config_path(namespace)), copy=namespace.copy)
