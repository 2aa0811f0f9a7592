"""The composition root: `run(config)` builds everything, runs it, and shuts it down in order.

    the start-up checks check-config shares (agent/startup/preflight.py: secrets read once and
    registered with the log redactor, the CA file, the state directory, the key file)
    -> `Parts` (agent/entry/parts.py): the health socket bound (and the metrics socket,
       [health] metrics_listen) -> the state directory (created, never its parents) and its
       lock -> what watches the agent, the byte budget and the per-node TransferGate
    -> the recipient key (sealed) -> RevisionStore — nothing is created before a check that
       can still refuse start-up; a damaged or newer database refuses it (exit 65 / 2,
       agent/entry/cli.py); a disk that refuses the key's or the database's writes is waited out
       (agent/startup/opening.py): the health server starts, READY=1 with a STATUS= that says why,
       and the open is tried again on a backoff until it works
    -> the health server serving (the store attached once open) -> the start-up line
       (agent/entry/startline.py: version, config, Cloudly URL, state, integrity; the warnings)
    -> `Agent` (`assemble`): the credential source (sealed: Enrollment -> SealedCredentials;
       file: FixedCredentials; agent/entry/credentials.py) -> CorestoreClients ->
       IsolatedRestoreEngine, RelayService (sharing the gate) -> their routes
       -> CloudlySession (the agent's routes plus its own; sealed: the enrollment as a connect
       step, the credential source watching the cluster view) -> retention, the reconciler
    -> READY=1
    one TaskGroup: the engine's and the relay's background work, the session, the loop watch
        (WATCHDOG=1 only from a healthy loop), STATUS= on every change of the session, the
        store's retention (old finished records forgotten, `[state] retention_days`), the
        probe of a state disk that refused a write, the reconciliation of a salvaged or reset
        state with each node's Corestore (agent/startup/reconcile.py); SIGTERM/SIGINT set `stop`
    shutdown, each step bounded (agent/entry/shutdown.py): STOPPING=1 -> stop intake -> drain
        in-flight requests (drain_timeout_s) -> close the socket with 1001 -> stop the
        engine's background work -> stop the relay's jobs -> stop the health server -> close
        the Corestore clients -> close the store

Nothing is built anywhere else (but the parts before the state, in agent/entry/parts.py):
every part takes its collaborators as arguments, and every long-lived task belongs to the one
TaskGroup here. Cancellation is never swallowed: a step that overruns its bound is abandoned
(logged) and the next one runs; a crash of the session or of the engine propagates out of the
TaskGroup and out of `run()`.

`READY=1` does not wait for Cloudly: the agent is up once its store is open and its health
endpoint listens; whether it can work is `/readyz`'s question (and `STATUS=`'s).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import structlog

from agent.clock import SYSTEM_CLOCK, Clock
from agent.config import Config, Secrets
from agent.corestore.client import CorestoreClients
from agent.corestore.credentials import CredentialSource
from agent.credentials.contest import RecipientWatch
from agent.credentials.keys import KeyStore
from agent.credentials.provider import SealedCredentials
from agent.entry.credentials import check_recipient, fixed_credentials, sealed_credentials
from agent.entry.parts import Parts, build_parts
from agent.entry.shutdown import Once, step
from agent.entry.signals import stop_on_signals
from agent.entry.startline import announce
from agent.entry.systemd import Ready, draining_line, tell_systemd
from agent.errors import StateUnwritable
from agent.log import register_secret
from agent.protocol.handlers import Routes
from agent.relay.routes import relay_routes
from agent.relay.service import RelayService
from agent.restore.engine import IsolatedRestoreEngine
from agent.restore.routes import isolated_restore_routes
from agent.session.client import CloudlySession, SessionSettings
from agent.startup.opening import open_state, open_waiting, probe_state_writes, state_refused
from agent.startup.preflight import Checked, check
from agent.startup.reconcile import Reconciler
from agent.store import RevisionStore, statedir
from agent.store.retention import Retention
from agent.watch.notify import Notifier
from agent.watch.status import AgentStatus

__all__ = ["run", "session_settings"]

log = structlog.get_logger("agent.entry.app")


def session_settings(config: Config) -> SessionSettings:
    """The session's settings from the configuration."""
    return config.session_settings()


@dataclass(frozen=True)
class Agent:
    """The agent on its open state: what serves Cloudly and what works for it, each part given
    the ones it needs."""

    parts: Parts
    store: RevisionStore
    clients: CorestoreClients
    engine: IsolatedRestoreEngine
    relay: RelayService
    session: CloudlySession
    retention: Retention
    reconciler: Reconciler
    sealed: SealedCredentials | None  # whose recipient is checked; None for the file option


def assemble(
    config: Config,
    parts: Parts,
    state: tuple[KeyStore | None, RevisionStore],
    checked: Checked,
    extra_routes: Routes | None,
) -> Agent:
    """The agent on its open `state` (the recipient key, None for the file option, and the
    store), each part built on `parts` and the ones before it, in the order the module's
    docstring gives; `checked`: the secrets and the TLS context start-up checked."""
    keys, store = state
    secrets = checked.secrets
    clock, observer, metrics, status = parts.clock, parts.observer, parts.metrics, parts.status
    corestore = config.corestore
    sealed = sealed_credentials(
        config, keys, lambda: session, RecipientWatch(observer, clock=clock), clock
    )
    credentials: CredentialSource = sealed[1] if sealed is not None else fixed_credentials(secrets)
    clients = CorestoreClients(
        credentials=credentials,
        timeouts=corestore.timeouts(),
        retry=corestore.retry_policy(),
        clock=clock,
        observer=observer,
    )
    engine = IsolatedRestoreEngine(
        store=store,
        clients=clients,
        # The session is built next (it serves the engine's routes); the engine reads its
        # cluster view only while handling a request, when the session exists.
        cluster_view=lambda: session.cluster_view,
        settings=corestore.engine_settings(),
        transfers=parts.transfers,
        clock=clock,
    )
    relay = RelayService(
        store=store,
        clients=clients,
        cluster_view=lambda: session.cluster_view,
        # Read by a closure when it starts: its call and its stream on one connection.
        cloudly=lambda: session.connection(),
        settings=config.relay_settings(),
        transfers=parts.transfers,
        clock=clock,
        observer=metrics,
    )
    routes = isolated_restore_routes(engine) + relay_routes(relay) + (extra_routes or Routes())
    enrollment, provider = sealed if sealed is not None else (None, None)
    session = CloudlySession(
        session_settings(config),
        secrets.machine_token,
        status,
        routes=routes,
        connect_step=(
            None
            if enrollment is None
            else lambda caller, view: enrollment.ensure(caller, view.cluster_id)
        ),
        view_watcher=None if provider is None else provider.retain,
        clock=clock,
        ssl_context=checked.tls,
        observer=metrics,
        pool=parts.transfers.budget,
    )
    retention = Retention(
        store,
        config.state.retention_settings(),
        clock=clock,
        observer=metrics,
    )
    reconciler = Reconciler(
        store=store,
        clients=clients,
        directory=config.state.directory,
        cluster_view=lambda: session.cluster_view,
        status=status,
        clock=clock,
        observer=observer,
    )
    return Agent(
        parts=parts,
        store=store,
        clients=clients,
        engine=engine,
        relay=relay,
        session=session,
        retention=retention,
        reconciler=reconciler,
        sealed=provider,
    )


async def run(
    config: Config,
    *,
    secrets: Secrets | None = None,
    stop: asyncio.Event | None = None,
    status: AgentStatus | None = None,
    extra_routes: Routes | None = None,
    config_path: Path | None = None,
    notifier: Notifier | None = None,
    on_ready: Callable[[str], None] | None = None,
    handle_signals: bool = True,
    clock: Clock = SYSTEM_CLOCK,
) -> None:
    """Run the agent until SIGTERM/SIGINT (or `stop` is set), then shut down in order.

    `secrets` are read from the files `config` names unless the caller read them already (the
    CLI does, to fail with exit code 2 before anything starts). `extra_routes` are served next
    to the agent's own (tests and benchmarks extend the daemon with them). `config_path` is
    named in the start-up line. `notifier` defaults to `$NOTIFY_SOCKET`'s. `on_ready` is called
    with the health endpoint's address once it listens (right after `READY=1`).
    `handle_signals=False` leaves SIGTERM/SIGINT to a caller that owns them (the demo).
    `clock` is every part's time: each part built here that waits or measures is given it
    (the session's backoff, keepalive and stream bounds, the engine, the relay, the store and
    its retention, the transfer gate and byte budget, the loop watch, STATUS=, the trimmer,
    the enrollment and recipient checks, the health server, the shutdown's bounds), and so is
    the status made here when none is given. A test passes a clock it moves by hand and the
    whole agent runs in that time. Only the network libraries' own bounds stay on the loop's
    time (the websocket's opening and closing handshakes, one Corestore HTTP exchange): they
    bound I/O, not the agent's pace.
    """
    # What can refuse start-up comes before anything is created: the checks check-config
    # shares, then the health address and the state directory's lock (build_parts), and only
    # then the recipient key and the database.
    checked = check(config, secrets=secrets)
    secrets = checked.secrets
    for secret in secrets.all():
        register_secret(secret)
    status = status if status is not None else AgentStatus(clock=clock)
    stop = stop if stop is not None else asyncio.Event()
    notifier = notifier if notifier is not None else Notifier.from_environment()
    close_s = config.shutdown.close_timeout_s
    async with AsyncExitStack() as resources:
        resources.callback(notifier.close)
        parts = build_parts(config, resources, status=status, notifier=notifier, clock=clock)
        # The state opens first (a damaged or newer database refuses start-up with one line);
        # a disk that refuses its writes keeps the agent waiting (agent/startup/opening.py),
        # serving the endpoint meanwhile so that it says why.
        opened: tuple[KeyStore | None, RevisionStore] | None = None
        refusal: StateUnwritable | None = None
        try:
            opened = await open_state(config, parts.observer, clock)
        except StateUnwritable as exc:
            refusal = exc
        health = parts.health
        address = await health.start(parts.listener)
        if parts.scrape is not None:
            await health.start_metrics(*parts.scrape)
        # Stopped in the shutdown's order (after the relay's jobs, before the clients and the
        # store close), or here last if the state never opened.
        stop_health = Once(lambda: step("stop the health server", health.stop, close_s, clock))
        resources.push_async_callback(stop_health)
        ready = Ready(notifier, status, address, on_ready, clock)
        with stop_on_signals(stop) if handle_signals else contextlib.nullcontext():
            async with asyncio.TaskGroup() as group:
                side_tasks = [
                    group.create_task(parts.loop_watch.run(), name="loop-watch"),
                    group.create_task(
                        tell_systemd(status, notifier, clock=clock), name="systemd-status"
                    ),
                    group.create_task(parts.trimmer.run(), name="memory-trimmer"),
                ]
                if refusal is not None:
                    opened = await _wait_for_state(config, parts, refusal, stop=stop, ready=ready)
                if opened is not None:
                    keys, store = opened
                    if keys is not None:
                        resources.callback(keys.close)
                    resources.push_async_callback(
                        step, "close the store", store.aclose, close_s, clock
                    )
                    if parts.hooks.unwritable_cause is not None:
                        log.info(
                            "state_writable_at_start", state_directory=str(config.state.directory)
                        )
                        parts.observer.state_writable()
                    statedir.clear_down(config.state.directory)
                    health.attach(store)
                    announce(config, parts, store, config_path, tightened=checked.tightens)
                    agent = assemble(config, parts, opened, checked, extra_routes)
                    resources.push_async_callback(
                        step, "close the Corestore clients", agent.clients.close, close_s, clock
                    )
                    await _serve(
                        config, agent, stop=stop, ready=ready, group=group, stop_health=stop_health
                    )
                for task in side_tasks:
                    task.cancel()
    log.info("agent_stopped")


async def _wait_for_state(
    config: Config, parts: Parts, refusal: StateUnwritable, *, stop: asyncio.Event, ready: Ready
) -> tuple[KeyStore | None, RevisionStore] | None:
    """The state, opened once its disk takes writes (None: `stop` came first); each refusal
    said (agent/startup/opening.py), the first one, `refusal`, at once."""

    def refused(error: StateUnwritable, failures: int) -> None:
        state_refused(config, error, failures, parts.observer, parts.hooks, ready.send)

    refused(refusal, 1)
    return await open_waiting(
        lambda: open_state(config, parts.observer, parts.clock),
        clock=parts.clock,
        stop=stop,
        refused=refused,
        failed=1,
    )


async def _serve(
    config: Config,
    agent: Agent,
    *,
    stop: asyncio.Event,
    ready: Ready,
    group: asyncio.TaskGroup,
    stop_health: Once,
) -> None:
    """Run `agent`'s parts in `group` until `stop` (or the session ends), then shut them down
    in order."""
    drain_s, close_s = config.shutdown.drain_timeout_s, config.shutdown.close_timeout_s
    clock, status, session = agent.parts.clock, agent.parts.status, agent.session
    engine, relay = agent.engine, agent.relay
    ready.send()
    engine_task = group.create_task(engine.owner.run(), name="isolated-restore-engine")
    relay_task = group.create_task(relay.runner.run(), name="relay-jobs")
    session_task = group.create_task(session.run(), name="cloudly-session")
    side_tasks = [
        group.create_task(agent.retention.run(), name="state-retention"),
        group.create_task(probe_state_writes(agent.store, status, clock), name="state-writes"),
        group.create_task(agent.reconciler.run(), name="state-reconcile"),
    ]
    if agent.sealed is not None:
        interval = config.cloudly.recipient_check_s
        recipient = check_recipient(agent.sealed, status, interval, clock)
        side_tasks.append(group.create_task(recipient, name="recipient-check"))
    stop_task = group.create_task(stop.wait(), name="stop-signal")
    await asyncio.wait({session_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
    stop_task.cancel()
    in_flight = status.snapshot().in_flight
    agent.parts.notifier.stopping(draining_line(in_flight))
    log.info("agent_stopping", in_flight=in_flight)
    session.stop_intake()
    await step("drain in-flight work", lambda: session.drain(drain_s), drain_s, clock)
    if not await step("close the Cloudly socket", lambda: session.close(0.0), close_s, clock):
        session_task.cancel()  # the TaskGroup awaits it
    if not await step(
        "stop the engine's work", lambda: engine.owner.close(close_s), close_s, clock
    ):
        engine_task.cancel()
    if not await step("stop the relay's jobs", lambda: relay.runner.close(close_s), close_s, clock):
        relay_task.cancel()
    for task in side_tasks:
        task.cancel()
    await stop_health()
