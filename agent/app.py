"""The composition root: `run(config)` builds everything, runs it, and shuts it down in order.

    secrets (files) -> AgentStatus -> CloudlySession -> build_handlers() (the engine's hook)
    one TaskGroup: the session; SIGTERM/SIGINT set the stop event
    shutdown, each step bounded: stop intake -> drain in-flight work (shutdown.drain_timeout_s)
                                 -> close the socket with 1001 -> close everything else

Nothing is built anywhere else: the parts take their collaborators as arguments. Cancellation
is never swallowed: a step that overruns its bound is abandoned (logged) and the next one runs;
a crash of the session propagates out of the TaskGroup and out of `run()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AsyncExitStack
from typing import Protocol

import structlog

from agent.config import Config, Secrets, load_secrets
from agent.session.backoff import BackoffPolicy
from agent.session.client import CloudlySession, SessionSettings
from agent.session.peer import PeerSettings
from agent.status import AgentStatus

__all__ = ["HandlerHook", "build_handlers", "run", "session_settings"]

log = structlog.get_logger("agent.app")

# A step may overrun its own deadline by this much before it is abandoned (the drain deadline
# is enforced by the peer itself; this bound only guards against a step that hangs).
_GRACE_S = 1.0


class HandlerHook(Protocol):
    """The signature of `build_handlers` (injectable for tests)."""

    async def __call__(
        self,
        *,
        config: Config,
        secrets: Secrets,
        session: CloudlySession,
        status: AgentStatus,
        resources: AsyncExitStack,
    ) -> None: ...


async def build_handlers(
    *,
    config: Config,
    secrets: Secrets,
    session: CloudlySession,
    status: AgentStatus,
    resources: AsyncExitStack,
) -> None:
    """HOOK (restore engine): open what the handlers need and register them on the router.

    Fill in here: open the revision store and the Corestore client with `config` (and
    `secrets.corestore_credential`), push each onto `resources` (`enter_async_context` /
    `push_async_callback`) so shutdown closes them after the socket, and register the
    handlers with `session.router.register(method, handler)`. Handlers read the current
    cluster with `session.cluster_view`, call Cloudly with `session.call(...)`, and open
    outgoing streams with `session.open_send_stream()`. Runs once, before the session
    connects.
    """
    # The isolated-restore engine: store, Corestore clients, engine.run()/close(), handlers.
    from agent.restore.handlers import install

    del status  # the engine reports through its own log events
    await install(config=config, secrets=secrets, session=session, resources=resources)


def session_settings(config: Config) -> SessionSettings:
    """The session's settings from the configuration."""
    cloudly, streams = config.cloudly, config.streams
    return SessionSettings(
        url=cloudly.websocket_url,
        tag_name=cloudly.tag_name,
        tag_payload=dict(cloudly.tag_payload),
        max_frame_bytes=cloudly.max_frame_bytes,
        ca_file=cloudly.ca_file,
        compression=cloudly.compression,
        ping_interval=cloudly.ping_interval_s,
        ping_timeout=cloudly.ping_timeout_s,
        close_timeout=config.shutdown.close_timeout_s,
        call_timeout=cloudly.call_timeout_s,
        identity_renew_margin_s=cloudly.identity_renew_margin_s,
        backoff=BackoffPolicy(
            base=cloudly.backoff_base_s,
            cap=cloudly.backoff_cap_s,
            stable_after=cloudly.stable_after_s,
        ),
        peer=PeerSettings(
            stream_window=streams.window,
            keepalive_timeout=streams.keepalive_timeout_s,
            default_call_timeout=cloudly.call_timeout_s,
            chunk_form=streams.chunk_form,
        ),
    )


async def run(
    config: Config,
    *,
    stop: asyncio.Event | None = None,
    status: AgentStatus | None = None,
    install: HandlerHook = build_handlers,
) -> None:
    """Run the agent until SIGTERM/SIGINT (or `stop` is set), then shut down in order."""
    secrets = load_secrets(config)
    status = status if status is not None else AgentStatus()
    session = CloudlySession(session_settings(config), secrets.machine_token, status)
    stop = stop if stop is not None else asyncio.Event()
    resources = AsyncExitStack()
    try:
        await install(
            config=config, secrets=secrets, session=session, status=status, resources=resources
        )
        with _stop_on_signals(stop):
            async with asyncio.TaskGroup() as group:
                session_task = group.create_task(session.run(), name="cloudly-session")
                stop_task = group.create_task(stop.wait(), name="stop-signal")
                await asyncio.wait({session_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
                stop_task.cancel()
                log.info("agent_stopping", in_flight=status.snapshot().in_flight)
                await _shutdown_session(session, session_task, config)
    finally:
        await _step("close resources", resources.aclose(), config.shutdown.close_timeout_s)
    log.info("agent_stopped")


async def _shutdown_session(
    session: CloudlySession, session_task: asyncio.Task[None], config: Config
) -> None:
    drain_s, close_s = config.shutdown.drain_timeout_s, config.shutdown.close_timeout_s
    session.stop_intake()
    await _step("drain in-flight work", session.drain(drain_s), drain_s + _GRACE_S)
    if not await _step("close the Cloudly socket", session.close(0.0), close_s + _GRACE_S):
        session_task.cancel()  # the TaskGroup awaits it


async def _step(name: str, work: Awaitable[None], bound_s: float) -> bool:
    """Await `work` for at most `bound_s` seconds; log and return False if it overran."""
    started = asyncio.get_running_loop().time()
    try:
        async with asyncio.timeout(bound_s):
            await work
    except TimeoutError:
        # Expected outcome of a hung step, not a crash: no traceback, the step name says it.
        log.error("shutdown_step_overran", step=name, bound_s=bound_s)  # noqa: TRY400
        return False
    elapsed = asyncio.get_running_loop().time() - started
    log.info("shutdown_step_done", step=name, seconds=round(elapsed, 3))
    return True


@contextlib.contextmanager
def _stop_on_signals(stop: asyncio.Event) -> Iterator[None]:
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []

    def on_signal(signum: signal.Signals) -> None:
        log.info("signal_received", signal=signum.name, already_stopping=stop.is_set())
        stop.set()

    handler: Callable[[signal.Signals], None] = on_signal
    for signum in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(signum, handler, signum)
        except (NotImplementedError, RuntimeError, ValueError):
            # Not the main thread (or no Unix signals): the caller's `stop` event still works.
            log.warning("signal_handler_unavailable", signal=signum.name)
        else:
            installed.append(signum)
    try:
        yield
    finally:
        for signum in installed:
            loop.remove_signal_handler(signum)
