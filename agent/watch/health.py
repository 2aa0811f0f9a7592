"""The local health endpoint (aiohttp, loopback TCP or a unix socket), and `/metrics` alone on
the node's address when `[health] metrics_listen` asks for it.

    GET /healthz      200 while the event loop is healthy (`LoopWatch`: its timer fired
                      recently and on time), else 503; the lag in the body
    GET /readyz       200 when the Cloudly session is connected with a recent pong, the store
                      is open and takes writes and the cluster document is usable; else 503
                      with each reason under a stable key (`agent.watch.overview.readiness`); the
                      session status, the agent's version and uptime (`agent`) and the node's
                      named conditions (`conditions`) either way
    GET /metrics      the Prometheus text of `agent.watch.metrics.Metrics`, gauges refreshed first
    GET /v1/restores  every node state as the operator's rows (`agent.watch.overview.restore_rows`):
                      key, status, revision, age, progress; never a grant (none is stored)
    GET /v1/jobs      every relay job (service backups and restores) as the operator's rows
                      (`agent.watch.overview.job_rows`): key, status, revision, attempts, age, the
                      types a restore restored and whether it was partial; never the service
    GET /v1/transfers the per-node transfer limits, each node's moving and queued transfers
                      and every one of them (`agent.watch.overview.transfers_body`); the restore and
                      job rows carry their own as `transfer`

`bind_listener()` binds the socket first of all start-up steps (before the store or the key
exist), `start()` serves on it (before the state is open: `attach(store)` once it is; until
then the store's endpoints answer 503 and readiness says why), `stop()` closes the
listener and waits for requests in progress. The address comes from `[health] listen`, which
the configuration already refused unless it is loopback; a unix socket is made 0600 (the
agent's user and root), and one left behind by a dead agent (nothing accepts on it) is
replaced. An address in use (another agent, or one still stopping) is `StartupBlocked` (exit
75: systemd restarts the unit, and the port is usually free by then); any other bind failure
(no such directory, permission) is a `ConfigError` naming `health.listen` (exit 2).
Every answer is JSON but `/metrics`; no handler writes anything.

`[health] metrics_listen` (optional) is a second listener, on an address Prometheus reaches
(the node's), serving `GET /metrics` alone (`start_metrics`): the same text, nothing else of the
node's state (docs/operations.md, "Scraping the agents"). Its bind errors name
`health.metrics_listen`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import stat
from typing import Any, Final

import structlog
from aiohttp import web

from agent.clock import SYSTEM_CLOCK, Clock, epoch_ms
from agent.errors import ConfigError, StartupBlocked, StoreError
from agent.store import RevisionStore, StatusSummary
from agent.transfers import NodeLimits, TransferGate
from agent.watch.listen import HealthListen
from agent.watch.loopwatch import LoopWatch
from agent.watch.metrics import CONTENT_TYPE, Metrics
from agent.watch.overview import (
    BYTES_STATUSES,
    RestoreFacts,
    job_rows,
    readiness,
    ready_body,
    restore_rows,
    transfers_body,
    with_transfers,
)
from agent.watch.status import AgentStatus, StatusSnapshot

__all__ = ["HealthServer", "bind_listener", "close_listener"]

_log = structlog.get_logger("agent.watch.health")
_SOCKET_MODE: Final = 0o600
_SHUTDOWN_S: Final = 1.0
_BACKLOG: Final = 64
_KEY: Final = "health.listen"


def bind_listener(listen: HealthListen, *, key: str = _KEY) -> socket.socket:
    """The endpoint's listening socket, bound and listening (non-blocking); `key` is the
    configuration key a bind error names."""
    sock = _unix_listener(listen) if listen.path is not None else _tcp_listener(listen, key)
    sock.setblocking(False)
    return sock


def close_listener(sock: socket.socket, listen: HealthListen) -> None:
    """Close a socket from `bind_listener` and remove its unix socket file (idempotent)."""
    sock.close()
    if listen.path is not None:
        with contextlib.suppress(FileNotFoundError):
            listen.path.unlink()


def _tcp_listener(listen: HealthListen, key: str = _KEY) -> socket.socket:
    host = str(listen.host)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        # Lets a restarted agent bind while the old one's connections sit in TIME_WAIT; on
        # Linux a second listener on the same port is still refused.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, int(listen.port or 0)))
        sock.listen(_BACKLOG)
    except OSError as exc:
        sock.close()
        raise _bind_error(listen, exc, key) from exc
    return sock


def _unix_listener(listen: HealthListen) -> socket.socket:
    path = listen.path
    assert path is not None
    _remove_stale_socket(listen)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        os.chmod(path, _SOCKET_MODE)
        sock.listen(_BACKLOG)
    except OSError as exc:
        sock.close()
        raise _bind_error(listen, exc) from exc
    return sock


def _remove_stale_socket(listen: HealthListen) -> None:
    """Unlink a socket file nothing accepts on; `StartupBlocked` if something does."""
    path = listen.path
    assert path is not None
    try:
        if not stat.S_ISSOCK(path.lstat().st_mode):
            return  # bind() refuses it with EADDRINUSE: not ours to remove
    except OSError:
        return
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            return
    raise _bind_error(listen, OSError(errno.EADDRINUSE, os.strerror(errno.EADDRINUSE)))


def _bind_error(
    listen: HealthListen, exc: OSError, key: str = _KEY
) -> ConfigError | StartupBlocked:
    reason = f"cannot listen on {listen}: {exc.strerror or exc}"
    if exc.errno == errno.EADDRINUSE:
        return StartupBlocked(key, f"{reason} (another agent, or one still stopping)")
    return ConfigError(key, reason)


class HealthServer:
    """The aiohttp server behind the endpoints above."""

    def __init__(
        self,
        listen: HealthListen,
        *,
        status: AgentStatus,
        store: RevisionStore | None,
        metrics: Metrics,
        loop_watch: LoopWatch,
        stale_after: float,
        clock: Clock = SYSTEM_CLOCK,
        transfers: TransferGate | None = None,
    ) -> None:
        """`stale_after`: seconds without a pong after which a connected session is not
        ready (the ping interval plus its timeout). `transfers`: the gate whose transfers the
        rows and `/v1/transfers` show (None: an idle one with the default limits)."""
        self._listen = listen
        self._status = status
        self._store: RevisionStore | None = store
        self._metrics = metrics
        self._loop_watch = loop_watch
        self._stale_after = stale_after
        self._clock = clock
        self._transfers = transfers or TransferGate(NodeLimits())
        self._runner: web.AppRunner | None = None
        self._metrics_runner: web.AppRunner | None = None
        self.address: str | None = None
        """Where it listens once started (`127.0.0.1:PORT` or `unix:/path`)."""

    def attach(self, store: RevisionStore) -> None:
        """Serve `store` from now on (the state was opened after the endpoint began)."""
        self._store = store

    def _open_store(self) -> RevisionStore | None:
        store = self._store
        return store if store is not None and store.is_open else None

    async def start(self, sock: socket.socket | None = None) -> str:
        """Serve on `sock` (from `bind_listener`; bound now when None); returns the bound
        address."""
        if sock is None:
            sock = bind_listener(self._listen)
        app = web.Application()
        app.add_routes(
            [
                web.get("/healthz", self._healthz),
                web.get("/readyz", self._readyz),
                web.get("/metrics", self._metrics_text),
                web.get("/v1/restores", self._restores),
                web.get("/v1/jobs", self._jobs),
                web.get("/v1/transfers", self._transfers_view),
            ]
        )
        self._runner = await _serve_on(app, sock)
        self.address = _address(sock, self._listen)
        _log.info("health_listening", address=self.address)
        return self.address

    async def start_metrics(self, sock: socket.socket, listen: HealthListen) -> str:
        """Serve `GET /metrics` alone on `sock` (bound by `bind_listener` from `[health]
        metrics_listen`); returns the bound address."""
        app = web.Application()
        app.add_routes([web.get("/metrics", self._metrics_text)])
        self._metrics_runner = await _serve_on(app, sock)
        address = _address(sock, listen)
        _log.info("metrics_listening", address=address)
        return address

    async def stop(self) -> None:
        """Stop listening; requests in progress finish (idempotent)."""
        metrics_runner, self._metrics_runner = self._metrics_runner, None
        if metrics_runner is not None:
            await metrics_runner.cleanup()
        runner, self._runner = self._runner, None
        if runner is None:
            return
        await runner.cleanup()
        if self._listen.path is not None:
            with contextlib.suppress(FileNotFoundError):
                self._listen.path.unlink()

    # --- handlers ---------------------------------------------------------------------------

    async def _healthz(self, request: web.Request) -> web.Response:
        del request
        alive, facts = self._loop_watch.health()
        return web.json_response(facts, status=200 if alive else 503)

    def _readiness(self, snapshot: StatusSnapshot) -> dict[str, str]:
        return readiness(
            snapshot,
            store_open=self._open_store() is not None,
            now=self._clock.time(),
            stale_after=self._stale_after,
        )

    async def _readyz(self, request: web.Request) -> web.Response:
        del request
        snapshot = self._status.snapshot()
        reasons = self._readiness(snapshot)
        body = ready_body(snapshot, reasons, now=self._clock.time())
        return web.json_response(body, status=503 if reasons else 200)

    async def _metrics_text(self, request: web.Request) -> web.Response:
        del request
        summary: StatusSummary | None = None
        store = self._open_store()
        if store is not None:
            try:
                summary = await store.status_summary()
            except StoreError as exc:
                _log.warning("metrics_store_unreadable", error=str(exc))
        snapshot = self._status.snapshot()
        ready = not self._readiness(snapshot)
        self._metrics.refresh(snapshot, summary, ready=ready, now_ms=epoch_ms(self._clock))
        return web.Response(body=self._metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    async def _restores(self, request: web.Request) -> web.Response:
        del request
        store = self._open_store()
        if store is None:
            return web.json_response({"error": "the revision store is not open"}, status=503)
        try:
            states = await store.list_states()
            found = await store.restore_facts(counted=BYTES_STATUSES)
        except StoreError as exc:
            return web.json_response({"error": str(exc)}, status=503)
        facts = {key: RestoreFacts(*value) for key, value in found.items()}
        rows = restore_rows(states, facts, now_ms=epoch_ms(self._clock))
        body: dict[str, Any] = {"restores": with_transfers(rows, self._transfers.view())}
        return web.json_response(body)

    async def _jobs(self, request: web.Request) -> web.Response:
        del request
        store = self._open_store()
        if store is None:
            return web.json_response({"error": "the revision store is not open"}, status=503)
        try:
            jobs = await store.list_jobs()
        except StoreError as exc:
            return web.json_response({"error": str(exc)}, status=503)
        rows = job_rows(jobs, now_ms=epoch_ms(self._clock))
        return web.json_response({"jobs": with_transfers(rows, self._transfers.view())})

    async def _transfers_view(self, request: web.Request) -> web.Response:
        del request
        return web.json_response(transfers_body(self._transfers.view()))


def _address(sock: socket.socket, listen: HealthListen) -> str:
    """`host:port` actually bound (port 0 asks the kernel for one), or `unix:/path`."""
    if listen.path is not None:
        return str(listen)
    host, port = sock.getsockname()[:2]
    return str(HealthListen(host=str(host), port=int(port)))


async def _serve_on(app: web.Application, sock: socket.socket) -> web.AppRunner:
    """`app` served on the bound `sock`; its runner. On failure nothing is left open."""
    # A scrape in progress at shutdown gets a second, not aiohttp's default minute: the app
    # bounds this step by close_timeout_s anyway.
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=_SHUTDOWN_S)
    await runner.setup()
    try:
        await web.SockSite(runner, sock).start()
    except BaseException:
        await runner.cleanup()
        sock.close()
        raise
    return runner
