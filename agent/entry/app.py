"""The composition root: `run(config)` builds everything, runs it, and shuts it down in order.

    the start-up checks check-config shares (agent/startup/preflight.py: secrets read once and
    registered with the log redactor, the CA file, the state directory, the key file)
    -> the health socket bound (and the metrics socket, [health] metrics_listen) -> the
       state directory (created, never its parents) and its lock -> the recipient key
       (sealed) -> RevisionStore — nothing is created before a check that can still refuse
       start-up; a damaged or newer database refuses it (exit 65 / 2,
       agent/entry/cli.py); a disk that refuses the key's or the database's writes is waited out
       (agent/startup/opening.py): the health server starts, READY=1 with a STATUS= that says why,
       and the open is tried again on a backoff until it works
    -> the health server serving (the store attached once open) -> the start-up line
       (version, config, Cloudly URL, state, integrity; then the warnings)
    -> the credential source (sealed: Enrollment -> SealedCredentials; file:
       FixedCredentials) -> CorestoreClients -> the per-node TransferGate ->
       IsolatedRestoreEngine, RelayService (sharing it) -> their routes
    -> CloudlySession (the agent's routes plus its own; sealed: the enrollment as a connect
       step, the credential source watching the cluster view)
    -> READY=1
    one TaskGroup: the engine's and the relay's background work, the session, the loop watch
        (WATCHDOG=1 only from a healthy loop), STATUS= on every change of the session, the
        store's retention (old finished records forgotten, `[state] retention_days`), the
        probe of a state disk that refused a write, the reconciliation of a salvaged or reset
        state with each node's Corestore (agent/startup/reconcile.py); SIGTERM/SIGINT set `stop`
    shutdown, each step bounded: STOPPING=1 -> stop intake -> drain in-flight requests
        (drain_timeout_s) -> close the socket with 1001 -> stop the engine's background work
        -> stop the relay's jobs -> stop the health server -> close the Corestore clients
        -> close the store

Nothing is built anywhere else: every part takes its collaborators as arguments, and every
long-lived task belongs to the one TaskGroup here. Cancellation is never swallowed: a step that
overruns its bound is abandoned (logged) and the next one runs; a crash of the session or of
the engine propagates out of the TaskGroup and out of `run()`.

`READY=1` does not wait for Cloudly: the agent is up once its store is open and its health
endpoint listens; whether it can work is `/readyz`'s question (and `STATUS=`'s).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import AsyncExitStack
from pathlib import Path

import structlog

from agent import __version__
from agent.clock import SYSTEM_CLOCK, Clock
from agent.config import Config, Secrets
from agent.corestore.client import CorestoreClients
from agent.corestore.credentials import CredentialSource, FixedCredentials
from agent.credentials.contest import RecipientWatch
from agent.credentials.enrollment import Enrollment
from agent.credentials.keys import KeyStore
from agent.credentials.provider import SealedCredentials
from agent.errors import AgentError, ConfigError, StateUnwritable
from agent.log import register_secret
from agent.observe import Tee
from agent.protocol.bytearrays import codec_backends
from agent.protocol.handlers import Routes
from agent.relay.routes import relay_routes
from agent.relay.service import RelayService
from agent.restore.engine import IsolatedRestoreEngine
from agent.restore.routes import isolated_restore_routes
from agent.session.client import CloudlySession, SessionSettings
from agent.startup.opening import OPEN_BACKOFF, open_waiting
from agent.startup.preflight import STEP_GRACE_S, Checked, check
from agent.startup.reconcile import Reconciler
from agent.store import RevisionStore, statedir
from agent.store.faults import store_error
from agent.store.retention import Retention
from agent.transfers import TransferGate
from agent.transfers.budget import ByteBudget
from agent.transfers.chunking import DIGESTS_BACKEND
from agent.transfers.memory import Trimmer, trim_function
from agent.watch.health import HealthServer, bind_listener, close_listener
from agent.watch.loopwatch import LoopWatch, watch_interval
from agent.watch.metrics import Metrics
from agent.watch.notify import Notifier, watchdog_seconds
from agent.watch.status import (
    STATE_UNWRITABLE,
    AgentStatus,
    SessionState,
    StatusHooks,
    StatusSnapshot,
)

__all__ = ["run", "session_settings", "status_line"]

log = structlog.get_logger("agent.entry.app")


def session_settings(config: Config) -> SessionSettings:
    """The session's settings from the configuration."""
    return config.session_settings()


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
    # shares, then the health address and the state directory's lock (both may be busy for a
    # while; the directory itself is made first if missing, the lock lives in it), and only
    # then the recipient key and the database.
    checked = check(config, secrets=secrets)
    secrets = checked.secrets
    for secret in secrets.all():
        register_secret(secret)
    status = status if status is not None else AgentStatus(clock=clock)
    stop = stop if stop is not None else asyncio.Event()
    notifier = notifier if notifier is not None else Notifier.from_environment()
    metrics = Metrics()
    hooks = StatusHooks(status)
    observer = Tee(metrics, hooks)
    close_s = config.shutdown.close_timeout_s
    async with AsyncExitStack() as resources:
        resources.callback(notifier.close)
        listener = bind_listener(config.health.endpoint)
        resources.callback(close_listener, listener, config.health.endpoint)
        scrape = config.health.metrics_endpoint
        scrape_listener = (
            None if scrape is None else bind_listener(scrape, key="health.metrics_listen")
        )
        if scrape is not None and scrape_listener is not None:
            resources.callback(close_listener, scrape_listener, scrape)
        directory = config.state.directory
        created = statedir.create(directory)
        resources.callback(statedir.lock(directory).close)
        watchdog_s = watchdog_seconds()
        loop_watch = LoopWatch(
            interval=watch_interval(watchdog_s),
            max_lag=config.health.max_loop_lag_s,
            notifier=notifier,
            watchdog=watchdog_s is not None,
            clock=clock,
            observer=metrics,
        )
        # One byte budget for every byte a transfer holds (docs/operations.md, "Memory"), and
        # memory given back once it has been idle a moment.
        budget = ByteBudget(config.memory.budget_bytes, clock=clock, observer=metrics)
        trimmer = Trimmer(
            clock=clock,
            trim=trim_function(),
            observer=metrics,
            busy=lambda: not budget.idle,
        )
        budget.on_idle(trimmer.idle)
        # One gate for every byte path to a node's Corestore: stages and closures share a
        # node's places, its byte rate and the byte budget.
        transfers = TransferGate(
            config.corestore.node_limits(),
            clock=clock,
            observer=metrics,
            budget=budget,
        )
        # The state opens first (a damaged or newer database refuses start-up with one line);
        # a disk that refuses its writes keeps the agent waiting (agent/startup/opening.py), serving
        # the endpoint meanwhile so that it says why.
        opened: tuple[KeyStore | None, RevisionStore] | None = None
        refusal: StateUnwritable | None = None
        try:
            opened = await _open_state(config, observer, clock)
        except StateUnwritable as exc:
            refusal = exc
        health = HealthServer(
            config.health.endpoint,
            status=status,
            store=None,
            metrics=metrics,
            loop_watch=loop_watch,
            stale_after=config.cloudly.ping_interval_s + config.cloudly.ping_timeout_s,
            clock=clock,
            transfers=transfers,
        )
        address = await health.start(listener)
        if scrape is not None and scrape_listener is not None:
            await health.start_metrics(scrape_listener, scrape)
        # Stopped in the shutdown's order (after the relay's jobs, before the clients and the
        # store close), or here last if the state never opened.
        stop_health = _Once(lambda: _step("stop the health server", health.stop, close_s, clock))
        resources.push_async_callback(stop_health)
        ready = _Ready(notifier, status, address, on_ready, clock)
        with _stop_on_signals(stop) if handle_signals else contextlib.nullcontext():
            async with asyncio.TaskGroup() as group:
                side_tasks = [
                    group.create_task(loop_watch.run(), name="loop-watch"),
                    group.create_task(
                        _tell_systemd(status, notifier, clock=clock), name="systemd-status"
                    ),
                    group.create_task(trimmer.run(), name="memory-trimmer"),
                ]
                if refusal is not None:

                    def refused(error: StateUnwritable, failures: int) -> None:
                        _state_refused(config, error, failures, observer, hooks, ready)

                    refused(refusal, 1)
                    opened = await open_waiting(
                        lambda: _open_state(config, observer, clock),
                        clock=clock,
                        stop=stop,
                        refused=refused,
                        failed=1,
                    )
                if opened is not None:
                    keys, store = opened
                    if keys is not None:
                        resources.callback(keys.close)
                    resources.push_async_callback(
                        _step, "close the store", store.aclose, close_s, clock
                    )
                    if hooks.unwritable_cause is not None:
                        log.info("state_writable_at_start", state_directory=str(directory))
                        observer.state_writable()
                    statedir.clear_down(directory)
                    health.attach(store)
                    await _serve(
                        config,
                        secrets=secrets,
                        checked=checked,
                        status=status,
                        stop=stop,
                        keys=keys,
                        store=store,
                        metrics=metrics,
                        observer=observer,
                        transfers=transfers,
                        extra_routes=extra_routes,
                        config_path=config_path,
                        created=created,
                        watchdog_s=watchdog_s,
                        notifier=notifier,
                        ready=ready,
                        resources=resources,
                        group=group,
                        clock=clock,
                        stop_health=stop_health,
                    )
                for task in side_tasks:
                    task.cancel()
    log.info("agent_stopped")


async def _serve(
    config: Config,
    *,
    secrets: Secrets,
    checked: Checked,
    status: AgentStatus,
    stop: asyncio.Event,
    keys: KeyStore | None,
    store: RevisionStore,
    metrics: Metrics,
    observer: Tee,
    transfers: TransferGate,
    extra_routes: Routes | None,
    config_path: Path | None,
    created: bool,
    watchdog_s: float | None,
    notifier: Notifier,
    ready: _Ready,
    resources: AsyncExitStack,
    group: asyncio.TaskGroup,
    clock: Clock,
    stop_health: _Once,
) -> None:
    """Build the agent's parts on the open state, run them in `group` until `stop` (or the
    session ends), then shut them down in order."""
    drain_s, close_s = config.shutdown.drain_timeout_s, config.shutdown.close_timeout_s
    directory = config.state.directory
    decoders = codec_backends()
    log.info(
        "agent_starting",
        version=__version__,
        config=str(config_path) if config_path is not None else None,
        cloudly_url=config.websocket_url,
        state_directory=str(directory),
        store_integrity=store.integrity,
        health=config.health.listen,
        watchdog_s=watchdog_s,
        systemd_notify=notifier.enabled,
        chunk_decoders=decoders,
        digests=DIGESTS_BACKEND,
    )
    _warn_about(config, created=created, decoders=decoders, tightened=checked.tightens)
    corestore = config.corestore
    sealed = _sealed_credentials(
        config, keys, lambda: session, RecipientWatch(observer, clock=clock), clock
    )
    credentials: CredentialSource = sealed[1] if sealed is not None else _fixed_credentials(secrets)
    clients = CorestoreClients(
        credentials=credentials,
        timeouts=corestore.timeouts(),
        retry=corestore.retry_policy(),
        clock=clock,
        observer=observer,
    )
    resources.push_async_callback(
        _step, "close the Corestore clients", clients.close, close_s, clock
    )
    engine = IsolatedRestoreEngine(
        store=store,
        clients=clients,
        # The session is built next (it serves the engine's routes); the engine reads its
        # cluster view only while handling a request, when the session exists.
        cluster_view=lambda: session.cluster_view,
        settings=corestore.engine_settings(),
        transfers=transfers,
        clock=clock,
    )
    relay = RelayService(
        store=store,
        clients=clients,
        cluster_view=lambda: session.cluster_view,
        # Read by a closure when it starts: its call and its stream on one connection.
        cloudly=lambda: session.connection(),
        settings=config.relay_settings(),
        transfers=transfers,
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
        pool=transfers.budget,
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
        directory=directory,
        cluster_view=lambda: session.cluster_view,
        status=status,
        clock=clock,
        observer=observer,
    )
    ready.send()
    engine_task = group.create_task(engine.owner.run(), name="isolated-restore-engine")
    relay_task = group.create_task(relay.runner.run(), name="relay-jobs")
    session_task = group.create_task(session.run(), name="cloudly-session")
    side_tasks = [
        group.create_task(retention.run(), name="state-retention"),
        group.create_task(_probe_state_writes(store, status, clock), name="state-writes"),
        group.create_task(reconciler.run(), name="state-reconcile"),
    ]
    if provider is not None:
        check = _check_recipient(provider, status, config.cloudly.recipient_check_s, clock)
        side_tasks.append(group.create_task(check, name="recipient-check"))
    stop_task = group.create_task(stop.wait(), name="stop-signal")
    await asyncio.wait({session_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
    stop_task.cancel()
    in_flight = status.snapshot().in_flight
    notifier.stopping(_draining(in_flight))
    log.info("agent_stopping", in_flight=in_flight)
    session.stop_intake()
    await _step("drain in-flight work", lambda: session.drain(drain_s), drain_s, clock)
    if not await _step("close the Cloudly socket", lambda: session.close(0.0), close_s, clock):
        session_task.cancel()  # the TaskGroup awaits it
    if not await _step(
        "stop the engine's work", lambda: engine.owner.close(close_s), close_s, clock
    ):
        engine_task.cancel()
    if not await _step(
        "stop the relay's jobs", lambda: relay.runner.close(close_s), close_s, clock
    ):
        relay_task.cancel()
    for task in side_tasks:
        task.cancel()
    await stop_health()


class _Once:
    """An async step that runs at most once (later calls do nothing)."""

    def __init__(self, step: Callable[[], Awaitable[object]]) -> None:
        self._step: Callable[[], Awaitable[object]] | None = step

    async def __call__(self) -> None:
        step, self._step = self._step, None
        if step is not None:
            await step()


class _Ready:
    """`READY=1` (with the first `STATUS=`) and the `on_ready` callback, sent once: when the
    state is open and the health endpoint listens, or at the first refusal of a state disk
    that does not take writes (the agent then waits, serving health: agent/startup/opening.py)."""

    def __init__(
        self,
        notifier: Notifier,
        status: AgentStatus,
        address: str,
        on_ready: Callable[[str], None] | None,
        clock: Clock,
    ) -> None:
        self._notifier, self._status, self._address = notifier, status, address
        self._on_ready, self._clock = on_ready, clock
        self._sent = False

    def send(self) -> None:
        """Say ready once (later calls do nothing)."""
        if self._sent:
            return
        self._sent = True
        self._notifier.ready(status_line(self._status.snapshot(), self._clock.time()))
        if self._on_ready is not None:
            self._on_ready(self._address)


async def _open_state(
    config: Config, observer: Tee, clock: Clock
) -> tuple[KeyStore | None, RevisionStore]:
    """The recipient key (created on first start; None for the file option), then the
    database. A disk that refuses their writes is `StateUnwritable` (nothing stays open)."""
    directory = config.state.directory
    keys: KeyStore | None = None
    if config.corestore.credential_source == "sealed":
        try:
            keys = await asyncio.to_thread(KeyStore.open, directory)
        except OSError as exc:
            error = store_error(exc, f"cannot write the recipient key in {directory}", directory)
            if isinstance(error, StateUnwritable):
                raise error from exc
            raise
    try:
        store = await RevisionStore.open(directory, clock=clock, observer=observer)
    except BaseException:
        if keys is not None:
            keys.close()
        raise
    return keys, store


def _state_refused(
    config: Config,
    error: StateUnwritable,
    failures: int,
    observer: Tee,
    hooks: StatusHooks,
    ready: _Ready,
) -> None:
    """A try to open the state met a disk that refuses writes: said at error once per cause,
    named as a condition (not ready), and the unit told it runs (it waits, serving health)."""
    if failures == 1 or hooks.unwritable_cause != error.cause:
        log.error(
            "state_unwritable_at_start",
            state_directory=str(config.state.directory),
            cause=error.cause,
            error=str(error),
            hint="make room on (or remount read-write) the state directory's file system; "
            "the agent serves /healthz and /readyz meanwhile and starts by itself once the "
            "state can be written",
        )
    else:
        log.debug("state_unwritable_at_start", cause=error.cause, failures=failures)
    observer.state_write_failed(cause=error.cause)
    ready.send()


async def _probe_state_writes(store: RevisionStore, status: AgentStatus, clock: Clock) -> None:
    """While the state disk refuses writes, try one small write after a backoff delay, so
    readiness comes back once the disk takes writes again even when nothing else writes."""
    while True:
        await status.wait_until(lambda snapshot: STATE_UNWRITABLE in snapshot.conditions)
        failures = 0
        while store.write_fault is not None or STATE_UNWRITABLE in status.snapshot().conditions:
            failures += 1
            await clock.sleep(OPEN_BACKOFF.delay(failures, random.random()))
            if await store.probe_write():
                break


async def _check_recipient(
    provider: SealedCredentials, status: AgentStatus, interval: float, clock: Clock
) -> None:
    """Every `interval` while connected, whether Cloudly still seals to the agent's recipient:
    a second agent with the same token retires it (agent/credentials/contest.py). After a
    retirement the next check comes after a fifth of it: a second agent shows sooner."""
    delay = interval
    while True:
        await status.wait_until(lambda snapshot: snapshot.state is SessionState.CONNECTED)
        await clock.sleep(delay)
        if status.state is SessionState.CONNECTED:
            try:
                enrolled = await provider.check_recipient()
            except AgentError as exc:  # a broken session: the next connect checks again
                log.debug("recipient_check_failed", error=str(exc))
                enrolled = None
            delay = interval / 5 if enrolled is False else interval


def _sealed_credentials(
    config: Config,
    keys: KeyStore | None,
    session: Callable[[], CloudlySession],
    watch: RecipientWatch,
    clock: Clock,
) -> tuple[Enrollment, SealedCredentials] | None:
    """The key's enrollment and the per-node sealed credentials; None for the file option."""
    if keys is None:
        return None
    log.info("recipient_key_loaded", public_key=keys.key.public_key)
    timeout = config.cloudly.call_timeout_s
    enrollment = Enrollment(keys, call_timeout=timeout, clock=clock)
    provider = SealedCredentials(
        key=keys.key,
        enrollment=enrollment,
        caller=session,
        cluster_view=lambda: session().cluster_view,
        call_timeout=timeout,
        watch=watch,
    )
    return enrollment, provider


def _warn_about(
    config: Config,
    *,
    created: bool,
    decoders: Mapping[str, str],
    tightened: tuple[str, ...] = (),
) -> None:
    """The start-up warnings: what runs, but not as production should."""
    if tightened:
        log.warning(
            "state_permissions_tightened",
            tightened=list(tightened),
            hint="group or others had access to the state directory or database; the agent "
            "made them private (check-config says so before a start)",
        )
    if created:
        log.warning(
            "state_directory_created",
            state_directory=str(config.state.directory),
            hint="a new store and, with sealed credentials, a new recipient key; under "
            "systemd StateDirectory= creates the directory, so check state.directory",
        )
    if config.cloudly.cleartext_allowed:
        log.warning(
            "cloudly_cleartext",
            cloudly_url=config.websocket_url,
            hint="the machine token and every request cross the network unencrypted "
            "(cloudly.allow_cleartext = true)",
        )
    if decoders.get("buffer") != "native":
        log.warning(
            "chunk_decoder_pure",
            chunk_decoders=decoders,
            hint="this install lacks the native Buffer-form decoder (built without a C "
            "compiler): chunk decoding runs about 3x slower; rebuild the wheel with gcc and "
            "the Python headers",
        )


def _fixed_credentials(secrets: Secrets) -> FixedCredentials:
    """The development option: the one bearer of `corestore.credential_file` for every node."""
    if secrets.corestore_credential is None:
        raise ConfigError(
            "corestore.credential_file", 'is required with credential_source = "file"'
        )
    log.warning(
        "corestore_credential_from_file",
        hint='a development option: production configs leave credential_source at "sealed"',
    )
    return FixedCredentials(secrets.corestore_credential)


def status_line(snapshot: StatusSnapshot, now: float | None = None) -> str:
    """What `systemctl status` shows: first of all a state disk that refuses writes (the agent
    is not ready while it does), then the session's state and, while Cloudly is unreachable,
    since when, the last connect, the failed attempts and the last error (`now`: wall
    seconds, the status's clock; the snapshot's own time when None)."""
    state, error = snapshot.state, snapshot.last_error
    unwritable = snapshot.conditions.get(STATE_UNWRITABLE)
    if unwritable is not None and state is not SessionState.DRAINING:
        return f"not ready: {unwritable.text}; retrying"
    if state is SessionState.CONNECTED:
        cluster = snapshot.cluster_id
        return "connected to Cloudly" + (f", cluster {cluster}" if cluster else "")
    if state is SessionState.DRAINING:
        return _draining(snapshot.in_flight)
    outage = snapshot.unreachable(snapshot.state_since if now is None else now)
    if outage is not None and state is not SessionState.STOPPED:
        return outage  # the same line while it connects again: one STATUS= per attempt
    if error is not None and state is not SessionState.STOPPED:
        return f"{state.value}; last error: {error}"
    return state.value


def _draining(in_flight: int) -> str:
    # STOPPING=1 and the STATUS= of the draining state say the same, count included.
    return f"stopping: draining {in_flight} requests in flight"


def _line_differs_from(shown: str, clock: Clock) -> Callable[[StatusSnapshot], bool]:
    return lambda snapshot: status_line(snapshot, clock.time()) != shown


# How often STATUS= is recomputed while nothing changes: the outage's duration grows.
_STATUS_REFRESH_S = 30.0


async def _tell_systemd(
    status: AgentStatus,
    notifier: Notifier,
    *,
    clock: Clock,
    refresh_s: float = _STATUS_REFRESH_S,
) -> None:
    """`STATUS=` on every change of the status line: the session's transitions and errors,
    and, every `refresh_s` while Cloudly is unreachable, the outage's growing duration."""
    if not notifier.enabled:
        return
    line = status_line(status.snapshot(), clock.time())
    while True:
        with contextlib.suppress(TimeoutError):
            async with clock.timeout(refresh_s):
                await status.wait_until(_line_differs_from(line, clock))
        now_line = status_line(status.snapshot(), clock.time())
        if now_line != line:
            line = now_line
            notifier.status(line)


async def _step(
    name: str, work: Callable[[], Awaitable[None]], bound_s: float, clock: Clock
) -> bool:
    """Await `work()` for at most `bound_s` (+ grace) seconds on `clock`; log and return False
    if it overran."""
    started = clock.monotonic()
    try:
        # A step may overrun its bound by STEP_GRACE_S (the drain's deadline is the peer's
        # own; this bound only guards against a step that hangs): preflight counts it.
        async with clock.timeout(bound_s + STEP_GRACE_S):
            await work()
    except TimeoutError:
        # Expected outcome of a hung step, not a crash: no traceback, the step name says it.
        log.error("shutdown_step_overran", step=name, bound_s=bound_s)  # noqa: TRY400
        return False
    elapsed = clock.monotonic() - started
    log.info("shutdown_step_done", step=name, seconds=round(elapsed, 3))
    return True


@contextlib.contextmanager
def _stop_on_signals(stop: asyncio.Event) -> Iterator[None]:
    """SIGTERM/SIGINT set `stop`; a SIGINT while stopping already (a second Ctrl-C) cancels the
    task running the agent, so the drain is skipped (the close steps still run, bounded)."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    installed: list[signal.Signals] = []

    def on_signal(signum: signal.Signals) -> None:
        again = stop.is_set()
        log.info("signal_received", signal=signum.name, already_stopping=again)
        stop.set()
        if again and signum is signal.SIGINT and task is not None:
            log.warning("stopping_at_once", hint="a second Ctrl-C: in-flight work is cancelled")
            task.cancel()

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
