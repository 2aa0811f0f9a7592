"""The demo `scripts/run` runs: an isolated restore and a service backup and restore, end to end.

`scripts/run [OPTIONS]` (or `python -m devstack.demo [OPTIONS]`) runs the real agent against an
embedded stand-in stack; `scripts/run --config PATH` runs the daemon against a real Cloudly
instead. The demo is repository code, not the product (the wheel holds `agent/` only).

Nothing outside one temporary directory is touched: it holds the reference Corestore's disk, a
config file and the machine token file (mode 0600, a random value), the agent's state directory (its
state database, and its X25519 recipient key) and its log (`agent.log`: the progress output stays
readable). The node's Corestore bearer (random) is known to the reference Corestore and to the
stand-in Cloudly, which seals it to the agent's key: the agent enrolls its key on connect and
fetches the bearer sealed (`--credential-source sealed`, the default, as in production);
`--credential-source file` writes it to a 0600 file instead (the development option). The stand-in
Cloudly and the reference Corestore listen on 127.0.0.1 (free ports); the real agent
(`agent.entry.app.run`) runs in this process and connects to them over its websocket session. Then,
as
Cloudly would, `RestoreDriver` prepares a restore of three resources (a database dump, a bucket of
files, a volume image of `--size` bytes), stages every object on a VirtualStream, executes, waits
for `ready`, checks every staged object's sha256 on Corestore's disk, cleans up, waits for `cleaned`
and checks that Corestore's disk holds no file of the restore any more (not even the
prepared-restore record). Then (`demo_relay`) it backs a service up, its database closure
(`--closure-size` bytes) going to the stand-in Cloudly, and restores it into a fresh database,
byte-identical. The directory is removed at the end unless `--keep`.

Exit 0 on success, 1 with a one-line reason on stderr otherwise. `--json` prints one JSON
object per line instead of text. Ctrl-C (SIGINT, or SIGTERM) stops it within a few seconds:
the work is cancelled, the agent, the stand-ins and the scratch directory go away, exit 130; a
second Ctrl-C quits at once (the scratch directory is still removed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import secrets
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import AsyncExitStack, contextmanager
from pathlib import Path
from typing import Any, Final, TextIO

import structlog

from agent.config import load_config
from agent.entry import app
from agent.errors import AgentError, CallFailed
from agent.log import configure_logging
from agent.watch.status import AgentStatus, SessionState
from devstack.cloudly import StandInCloudly, cluster_document
from devstack.corestore import CorestoreHandle, start
from devstack.corestore.storage import Storage, sha256_file
from devstack.credentials import CredentialAuthority
from devstack.demo_relay import RelayDemoFailed, backup_and_restore
from devstack.driver import (
    Progress,
    RestoreDriver,
    RestorePlan,
    Retrying,
    StageProgress,
    StateSeen,
    demo_plan,
    stand_in_settings,
)

__all__ = ["main"]

_log = structlog.get_logger("devstack.demo")

_PROG: Final = "python -m devstack.demo"
MiB: Final = 1024 * 1024
_UNITS: Final = {"": 1, "k": 1024, "m": MiB, "g": 1024 * MiB}


class DemoFailed(Exception):
    """The demo could not finish; the message is the one-line reason."""


def _size(text: str) -> int:
    match = re.fullmatch(r"\s*(\d+)\s*([kKmMgG]?)(?:i?[bB])?\s*", text)
    if match is None:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 64MiB, 500k, 1048576)")
    value = int(match.group(1)) * _UNITS[match.group(2).lower()]
    if not 1 <= value <= 64 * 1024 * MiB:
        raise argparse.ArgumentTypeError("the size must be 1 byte .. 64 GiB")
    return value


# What a shell reports for a process SIGINT ended.
_EXIT_INTERRUPTED: Final = 130


def _arguments(argv: list[str], prog: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="The demo: an isolated restore and a service backup and restore, end to "
        "end, through the real agent against a stand-in Cloudly and a reference Corestore on "
        "127.0.0.1 (free ports). Scratch files live in one temporary directory, removed at the "
        "end. Ctrl-C stops it within seconds, a second Ctrl-C at once.",
        epilog="scripts/run --config PATH runs the daemon from this checkout against the Cloudly "
        "PATH names instead (restore-agent run --config PATH).",
    )
    parser.add_argument(
        "--size", type=_size, default=64 * MiB, help="size of the large object (default 64MiB)"
    )
    parser.add_argument(
        "--closure-size",
        type=_size,
        default=16 * MiB,
        help="size of the service database backed up and restored (default 16MiB)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    parser.add_argument("--json", action="store_true", help="machine-readable progress")
    parser.add_argument(
        "--credential-source",
        choices=("sealed", "file"),
        default="sealed",
        help="how the agent gets the node's Corestore bearer (default sealed, from Cloudly)",
    )
    parser.add_argument(
        "--chunk-form",
        choices=("buffer", "base64"),
        default="buffer",
        help="how the stand-in Cloudly encodes stream chunks (default buffer, as typedrequest)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, *, prog: str = _PROG) -> int:
    """Run the demo; 0 on success, 130 when interrupted, 1 (with a one-line reason on stderr)
    otherwise. `prog` is the name its usage shows (`scripts/run` passes its own)."""
    try:
        arguments = _arguments(sys.argv[1:] if argv is None else argv, prog)
    except SystemExit as exc:  # --help or a usage error
        return exc.code if isinstance(exc.code, int) else 2
    out = _Output(sys.stdout, as_json=arguments.json)
    try:
        asyncio.run(_demo(arguments, out, prog))
    except (asyncio.CancelledError, KeyboardInterrupt):
        out.event("interrupted", f"{prog}: interrupted", stream=sys.stderr)
        return _EXIT_INTERRUPTED
    except Exception as exc:  # noqa: BLE001  # the top of the demo process: report once
        failure = _known_failure(exc)
        if failure is None:
            # A bug: logged once with its traceback through the agent's redacting logger.
            if not structlog.is_configured():
                configure_logging()
            _log.critical("demo_crashed", exc_info=True)
            return 1
        reason = " ".join((str(failure) or type(failure).__name__).split())
        if isinstance(failure, CallFailed):
            reason = f"{reason} ({failure.error_data.get('code', 'no code')})"
        out.event("failed", f"{prog}: failed: {reason}", reason=reason, stream=sys.stderr)
        return 1
    return 0


def _known_failure(exc: BaseException) -> BaseException | None:
    """The first expected failure in `exc` (TaskGroups wrap them in exception groups)."""
    if isinstance(exc, DemoFailed | RelayDemoFailed | AgentError | OSError | TimeoutError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = _known_failure(inner)
            if found is not None:
                return found
    return None


class _Output:
    """Progress lines: text, or one JSON object per line with `--json`."""

    def __init__(self, stream: TextIO, *, as_json: bool) -> None:
        self._stream, self._json = stream, as_json

    def event(self, kind: str, text: str, stream: TextIO | None = None, **fields: Any) -> None:
        target = stream or self._stream
        if self._json:
            target.write(json.dumps({"event": kind, **fields}, sort_keys=True) + "\n")
        else:
            target.write(text + "\n")
        target.flush()


_SHORT_METHOD: Final = {
    "coreflowPrepareIsolatedRestore": "prepare",
    "stageIsolatedRestoreArchive": "stage",
    "coreflowGetIsolatedRestoreStatus": "status",
    "coreflowExecuteIsolatedRestore": "execute",
    "coreflowCleanupIsolatedRestore": "cleanup",
}


class _Reporter:
    """Turns the driver's progress into lines: one per staged object (plus one per second
    while a large one streams), one per status or revision change."""

    def __init__(self, out: _Output) -> None:
        self._out = out
        self._shown_at: dict[str, float] = {}
        self._finished: StageProgress | None = None

    def __call__(self, event: Progress) -> None:
        if isinstance(event, StageProgress):
            self._staging(event)
        elif isinstance(event, StateSeen):
            self._state(event)
        elif isinstance(event, Retrying):
            self._out.event(
                "retry",
                f"  retry      {event.method} (attempt {event.attempt} failed: {event.reason})",
                method=event.method,
                attempt=event.attempt,
                reason=event.reason,
            )

    def _staging(self, event: StageProgress) -> None:
        if event.answered:
            self._finished = event  # shown with the state the stage answers
            return
        now = time.monotonic()
        shown = self._shown_at.setdefault(event.path, now)
        if now - shown < 1.0:
            return
        self._shown_at[event.path] = now
        self._out.event(
            "staging",
            f"  stage      {event.path:<28} {_amount(event.sent_bytes):>9}"
            f" of {_amount(event.total_bytes):<9} {_rate(event):>11}",
            path=event.path,
            bytes=event.sent_bytes,
            total=event.total_bytes,
            mb_per_s=round(event.sent_bytes / max(event.seconds, 1e-9) / 1e6, 1),
        )

    def _state(self, event: StateSeen) -> None:
        short = _SHORT_METHOD.get(event.method, event.method)
        what = f"  {short:<10} -> {event.status:<10} revision {event.revision:<3}"
        fields: dict[str, Any] = {}
        finished, self._finished = self._finished, None
        if short == "stage" and finished is not None:
            what += f"  {finished.path:<28} {_amount(finished.total_bytes):>9} {_rate(finished)}"
            fields = {"path": finished.path, "bytes": finished.total_bytes}
        what += _details(event.state)
        self._out.event(
            "state",
            what.rstrip(),
            method=event.method,
            status=event.status,
            revision=event.revision,
            **fields,
        )


def _details(state: Mapping[str, Any]) -> str:
    """What a status line adds: resources restored, verification, cleanup, the last error."""
    status = state["status"]
    extra = ""
    if status in ("restoring", "verifying"):
        extra = f"  {len(state['completedResourceMappingIds'])} resource(s) restored"
    verification = state.get("verification", {})
    if status in ("ready", "failed") and verification.get("results"):
        results = verification["results"]
        passed = sum(1 for result in results if result["status"] == "passed")
        extra = f"  verification {verification['status']} ({passed}/{len(results)} resources)"
    cleanup = state.get("cleanup")
    if status in ("cleaning", "cleaned", "cleanup-failed") and cleanup:
        entries = [*cleanup["resources"], cleanup["stagingArchive"]]
        done = sum(1 for entry in entries if entry["status"] == "succeeded")
        extra = f"  {done}/{len(entries)} cleaned (resources + staging archive)"
    if state.get("lastErrorCode"):
        extra += f"  error {state['lastErrorCode']}"
    return extra


def _amount(size: float) -> str:
    return f"{size / 1e6:.1f} MB" if size >= 100_000 else f"{size / 1e3:.1f} kB"


def _rate(event: StageProgress) -> str:
    return f"{event.sent_bytes / max(event.seconds, 1e-9) / 1e6:.1f} MB/s"


def _secret_file(path: Path, value: str) -> Path:
    path.write_text(value + "\n")
    path.chmod(0o600)
    return path


# Quick reconnects and stops; a resource restore of the demo takes milliseconds, so the engine
# polls Corestore every 0.05 s instead of waiting 1 s per resource. Paths are the workdir's.
_CONFIG: Final = """\
[cloudly]
url = "{cloudly_url}"
token_file = "machine-token"
backoff_base_s = 0.2
backoff_cap_s = 2.0
[corestore]
{credential}restore_poll_interval_s = 0.05
[state]
directory = "state"
[shutdown]
drain_timeout_s = 5.0
close_timeout_s = 2.0
[health]
# A free port: the demo runs on machines where an agent already holds the default one.
listen = "127.0.0.1:0"
"""


_FILE_CREDENTIAL: Final = 'credential_source = "file"\ncredential_file = "corestore-credential"\n'


def _write_config(workdir: Path, cloudly_url: str, credential_source: str) -> Path:
    config = workdir / "agent.toml"
    credential = _FILE_CREDENTIAL if credential_source == "file" else ""
    config.write_text(_CONFIG.format(cloudly_url=cloudly_url, credential=credential))
    return config


@contextmanager
def _agent_log(path: Path) -> Iterator[None]:
    """Route every log line (structlog and stdlib) to `path` while the demo runs."""
    with path.open("a", encoding="utf-8") as stream:
        configure_logging(format="json", level="info", stream=stream)
        try:
            yield
        finally:
            root = logging.getLogger()
            for handler in [h for h in root.handlers if h.get_name() == "restore-agent"]:
                root.removeHandler(handler)
                handler.close()


@contextmanager
def _interruptible(workdir: Path, out: _Output, *, keep: bool) -> Iterator[None]:
    """SIGINT/SIGTERM cancel the demo (its cleanup runs); a second one exits at once, after
    removing `workdir` unless `keep`."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    received: list[signal.Signals] = []

    def on_signal(signum: signal.Signals) -> None:
        received.append(signum)
        if len(received) == 1:
            out.event(
                "stopping",
                f"  stopping   ({signum.name}; once more to quit at once)",
                signal=signum.name,
                stream=sys.stderr,
            )
            task.cancel()
            return
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
        os._exit(_EXIT_INTERRUPTED)

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        yield
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)


async def _demo(arguments: argparse.Namespace, out: _Output, prog: str) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="restore-agent-demo-"))
    started = time.monotonic()
    try:
        # 60 s for the default run, more for a large --size (at least ~5 MB/s).
        limit = 60.0 + (arguments.size + 2 * arguments.closure_size) / 5e6
        deadline = asyncio.timeout(limit)
        with _agent_log(workdir / "agent.log"), _interruptible(workdir, out, keep=arguments.keep):
            try:
                async with deadline:
                    summary = await _run_stack(arguments, out, workdir, prog)
            except TimeoutError:
                if deadline.expired():
                    raise DemoFailed(f"the demo did not finish within {limit:.0f} s") from None
                raise
    finally:
        if arguments.keep:
            out.event("kept", f"kept {workdir}", workdir=str(workdir))
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    seconds = time.monotonic() - started
    out.event(
        "summary",
        f"done in {seconds:.1f} s: {summary['objects']} objects ({_amount(summary['bytes'])})"
        f" staged and sha256-verified on disk, {summary['resources']} resources restored and"
        " verified, everything cleaned up; a service backed up with its"
        f" {_amount(summary['closure_bytes'])} database closure and restored byte-identical",
        seconds=round(seconds, 2),
        **summary,
    )


async def _run_stack(
    arguments: argparse.Namespace, out: _Output, workdir: Path, prog: str
) -> dict[str, Any]:
    # Random per run, in 0600 files the config names; never on argv or in the environment.
    token = "demo-token-" + secrets.token_urlsafe(24)
    bearer = "demo-bearer-" + secrets.token_urlsafe(24)
    _secret_file(workdir / "machine-token", token)
    sealed = arguments.credential_source == "sealed"
    if not sealed:
        _secret_file(workdir / "corestore-credential", bearer)
    out.event("start", f"{prog}: working in {workdir}", workdir=str(workdir))
    async with AsyncExitStack() as stack:
        corestore = await start(data_dir=workdir / "corestore", bearer=bearer)
        stack.push_async_callback(corestore.stop)
        plan = demo_plan(big_size=arguments.size)
        document = cluster_document(plan.cluster_id, {plan.node: corestore.url})
        settings = stand_in_settings(arguments.chunk_form)
        authority = CredentialAuthority(plan.cluster_id, {plan.node: bearer}) if sealed else None
        cloudly = StandInCloudly(
            token=token,
            cluster=document,
            peer_settings=settings,
            credentials=authority,
            closures_dir=workdir / "cloudly-closures",
        )
        await stack.enter_async_context(cloudly)
        out.event(
            "corestore", f"  corestore  {corestore.url} (reference server)", url=corestore.url
        )
        out.event("cloudly", f"  cloudly    {cloudly.url} (stand-in)", url=cloudly.url)
        out.event(
            "credential",
            "  credential "
            + (
                "sealed per node by the stand-in Cloudly to the agent's X25519 key"
                if sealed
                else "one bearer from a 0600 file (development option)"
            ),
            source=arguments.credential_source,
        )
        config = load_config(_write_config(workdir, cloudly.url, arguments.credential_source))
        status, stop = AgentStatus(), asyncio.Event()
        async with asyncio.TaskGroup() as group:
            # The demo owns SIGINT/SIGTERM (above): the agent must not take them over.
            agent = group.create_task(
                app.run(config, stop=stop, status=status, handle_signals=False), name="agent"
            )
            try:
                await _until_connected(status, agent)
                out.event(
                    "agent",
                    f"  agent      connected (log: {workdir / 'agent.log'})",
                    log=str(workdir / "agent.log"),
                )
                summary = await _restore(plan, cloudly, corestore, out)
                relay = await backup_and_restore(
                    cloudly, corestore, plan.node, arguments.closure_size, out.event
                )
                return {**summary, **relay}
            finally:
                stop.set()
    raise AssertionError("unreachable")


async def _until_connected(status: AgentStatus, agent: asyncio.Task[None]) -> None:
    """Return once the agent's session is connected; DemoFailed if it stops or takes 15 s."""
    waiting = asyncio.create_task(
        status.wait_until(lambda s: s.state is SessionState.CONNECTED), name="connected"
    )
    try:
        await asyncio.wait({waiting, agent}, timeout=15.0, return_when=asyncio.FIRST_COMPLETED)
        connected = waiting.done()
    finally:
        waiting.cancel()
        await asyncio.wait({waiting})
    if connected:
        return
    if agent.done():
        agent.result()  # raises the agent's start-up failure
        raise DemoFailed("the agent stopped before it connected")
    raise DemoFailed("the agent did not connect to the stand-in Cloudly within 15 s")


async def _restore(
    plan: RestorePlan, cloudly: StandInCloudly, corestore: CorestoreHandle, out: _Output
) -> dict[str, Any]:
    reporter = _Reporter(out)
    driver = RestoreDriver(cloudly, plan, poll_interval=0.1, retries=3, on_progress=reporter)
    await driver.compute_digests()
    total = sum(spec.size for spec in plan.objects)
    out.event(
        "plan",
        f"restore {plan.restore_id}: {len(plan.mappings)} resources"
        f" ({', '.join(m.type for m in plan.mappings)}), {len(plan.objects)} objects,"
        f" {_amount(total)}",
        restore_id=plan.restore_id,
        resources=len(plan.mappings),
        objects=len(plan.objects),
        bytes=total,
    )
    await driver.prepare()
    _expect(driver, "prepared")
    staging_started = time.monotonic()
    await driver.stage_all()
    staging_seconds = time.monotonic() - staging_started
    out.event(
        "staged",
        f"  staged     {len(plan.objects)} objects, {_amount(total)} in {staging_seconds:.1f} s"
        f" ({total / staging_seconds / 1e6:.1f} MB/s)",
        bytes=total,
        seconds=round(staging_seconds, 2),
    )
    await driver.execute()
    await driver.wait_until({"ready", "failed"})
    _expect(driver, "ready")
    verified = await asyncio.to_thread(_verify_on_disk, corestore.data_dir, driver.plan)
    out.event(
        "verified",
        f"  on disk    {verified} objects match their sha256 on Corestore's disk",
        objects=verified,
    )
    await driver.cleanup()
    await driver.wait_until({"cleaned", "cleanup-failed"})
    _expect(driver, "cleaned")
    left = await asyncio.to_thread(Storage(corestore.data_dir).files)
    if left:
        raise DemoFailed(f"cleanup left {len(left)} file(s) on Corestore, e.g. {left[0]}")
    out.event("clean", "  on disk    nothing of the restore left on Corestore", leftovers=0)
    return {"objects": verified, "bytes": total, "resources": len(plan.mappings)}


def _expect(driver: RestoreDriver, status: str) -> None:
    state = driver.state or {}
    if state.get("status") != status:
        error = state.get("lastErrorCode") or "no error code"
        raise DemoFailed(f"expected status {status}, got {state.get('status')} ({error})")


def _verify_on_disk(data_dir: Path, plan: RestorePlan) -> int:
    storage = Storage(data_dir)
    for spec in plan.objects:
        file = storage.object_path(plan.staging_archive_id, spec.path)
        if sha256_file(file) != (spec.size, spec.sha256):
            raise DemoFailed(f"{spec.path} on Corestore's disk does not match its sha256")
    return len(plan.objects)


if __name__ == "__main__":
    sys.exit(main())
