"""The composition root: `run(config)` builds everything, runs it, and shuts it down in order.

    secrets (read once, registered with the log redactor) -> AgentStatus
    -> RevisionStore -> CorestoreClients -> IsolatedRestoreEngine, RelayService -> their routes
    -> CloudlySession (the agent's routes plus its own)
    one TaskGroup: the engine's and the relay's background work and the session;
    SIGTERM/SIGINT set `stop`
    shutdown, each step bounded: stop intake -> drain in-flight requests (drain_timeout_s)
        -> close the socket with 1001 -> stop the engine's background work
        -> stop the relay's jobs -> close the Corestore clients -> close the store

Nothing is built anywhere else: every part takes its collaborators as arguments, and every
long-lived task belongs to the one TaskGroup here. Cancellation is never swallowed: a step that
overruns its bound is abandoned (logged) and the next one runs; a crash of the session or of
the engine propagates out of the TaskGroup and out of `run()`.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable, Iterator
from contextlib import AsyncExitStack

import structlog

from agent.config import Config, Secrets, load_secrets
from agent.corestore.client import CorestoreClients, CorestoreTimeouts
from agent.log import register_secret
from agent.protocol.connection import ConnectionSettings
from agent.protocol.routes import Routes
from agent.relay.routes import relay_routes
from agent.relay.service import RelayService
from agent.restore.engine import IsolatedRestoreEngine
from agent.restore.routes import isolated_restore_routes
from agent.restore.settings import EngineSettings
from agent.retry import Backoff, RetryPolicy
from agent.session.client import CloudlySession, SessionSettings
from agent.status import AgentStatus
from agent.store import RevisionStore

__all__ = ["run", "session_settings"]

log = structlog.get_logger("agent.app")

# A step may overrun its own deadline by this much before it is abandoned (the drain deadline
# is enforced by the peer itself; this bound only guards against a step that hangs).
_GRACE_S = 1.0


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
        backoff=Backoff(base=cloudly.backoff_base_s, cap=cloudly.backoff_cap_s),
        stable_after=cloudly.stable_after_s,
        connection=ConnectionSettings(
            stream_window=streams.window,
            keepalive_timeout=streams.keepalive_timeout_s,
            chunk_form=streams.chunk_form,
            max_concurrent_requests=cloudly.max_concurrent_requests,
        ),
    )


async def run(
    config: Config,
    *,
    secrets: Secrets | None = None,
    stop: asyncio.Event | None = None,
    status: AgentStatus | None = None,
    extra_routes: Routes | None = None,
) -> None:
    """Run the agent until SIGTERM/SIGINT (or `stop` is set), then shut down in order.

    `secrets` are read from the files `config` names unless the caller read them already (the
    CLI does, to fail with exit code 2 before anything starts). `extra_routes` are served next
    to the agent's own (tests and benchmarks extend the daemon with them).
    """
    secrets = secrets if secrets is not None else load_secrets(config)
    for secret in secrets.all():
        register_secret(secret)
    status = status if status is not None else AgentStatus()
    stop = stop if stop is not None else asyncio.Event()
    drain_s, close_s = config.shutdown.drain_timeout_s, config.shutdown.close_timeout_s
    async with AsyncExitStack() as resources:
        store = await RevisionStore.open(config.state.directory)
        resources.push_async_callback(_step, "close the store", store.aclose, close_s)
        settings = EngineSettings.from_config(config.corestore)
        corestore = config.corestore
        clients = CorestoreClients(
            timeouts=CorestoreTimeouts(
                connect=corestore.connect_timeout_s,
                control=corestore.request_timeout_s,
                transfer=settings.transfer_timeout,
            ),
            retry=RetryPolicy(attempts=corestore.retries + 1),
        )
        resources.push_async_callback(_step, "close the Corestore clients", clients.close, close_s)
        engine = IsolatedRestoreEngine(
            store=store,
            clients=clients,
            credential=secrets.corestore_credential,
            # The session is built next (it serves the engine's routes); the engine reads its
            # cluster view only while handling a request, when the session exists.
            cluster_view=lambda: session.cluster_view,
            settings=settings,
        )
        relay = RelayService(
            store=store,
            clients=clients,
            credential=secrets.corestore_credential,
            cluster_view=lambda: session.cluster_view,
            cloudly=lambda: session,  # read by a job, when the session exists
            settings=settings,
        )
        routes = isolated_restore_routes(engine) + relay_routes(relay) + (extra_routes or Routes())
        session = CloudlySession(
            session_settings(config), secrets.machine_token, status, routes=routes
        )
        with _stop_on_signals(stop):
            async with asyncio.TaskGroup() as group:
                engine_task = group.create_task(engine.run(), name="isolated-restore-engine")
                relay_task = group.create_task(relay.run(), name="relay-jobs")
                session_task = group.create_task(session.run(), name="cloudly-session")
                stop_task = group.create_task(stop.wait(), name="stop-signal")
                await asyncio.wait({session_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
                stop_task.cancel()
                log.info("agent_stopping", in_flight=status.snapshot().in_flight)
                session.stop_intake()
                await _step("drain in-flight work", lambda: session.drain(drain_s), drain_s)
                if not await _step("close the Cloudly socket", lambda: session.close(0.0), close_s):
                    session_task.cancel()  # the TaskGroup awaits it
                if not await _step(
                    "stop the engine's work", lambda: engine.close(close_s), close_s
                ):
                    engine_task.cancel()
                if not await _step("stop the relay's jobs", lambda: relay.close(close_s), close_s):
                    relay_task.cancel()
    log.info("agent_stopped")


async def _step(name: str, work: Callable[[], Awaitable[None]], bound_s: float) -> bool:
    """Await `work()` for at most `bound_s` (+ grace) seconds; log and return False if it
    overran."""
    started = asyncio.get_running_loop().time()
    try:
        async with asyncio.timeout(bound_s + _GRACE_S):
            await work()
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
