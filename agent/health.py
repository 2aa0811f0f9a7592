"""The local health endpoint: the agent's only listener (aiohttp, loopback TCP or a unix socket).

    GET /healthz      200 while the event loop is healthy (`LoopWatch`: its timer fired
                      recently and on time), else 503; the lag in the body
    GET /readyz       200 when the Cloudly session is connected with a recent pong, the store
                      is open and the cluster document is usable; else 503 with each reason
                      under a stable key (`agent.overview.readiness`) and the session status
    GET /metrics      the Prometheus text of `agent.metrics.Metrics`, gauges refreshed first
    GET /v1/restores  every node state as the operator's rows (`agent.overview.restore_rows`):
                      key, status, revision, age, progress; never a grant (none is stored)
    GET /v1/jobs      every relay job (service backups and restores) as the operator's rows
                      (`agent.overview.job_rows`): key, status, revision, attempts, age, the
                      types a restore restored and whether it was partial; never the service

`start()` returns once the socket is bound (the app sends `READY=1` after it); `stop()` closes
the listener and waits for requests in progress. The address comes from `[health] listen`,
which the configuration already refused unless it is loopback; a unix socket is made 0600
(the agent's user and root). A bind failure (address in use, no such directory) is a
`ConfigError` naming `health.listen`: the operator's to fix, so start-up stops with exit 2.
Every answer is JSON but `/metrics`; no handler writes anything.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Final

import structlog
from aiohttp import web

from agent.clock import SYSTEM_CLOCK, Clock, epoch_ms
from agent.config import HealthListen
from agent.errors import ConfigError, StoreError
from agent.loopwatch import LoopWatch
from agent.metrics import CONTENT_TYPE, Metrics
from agent.overview import StagingTotals, job_rows, readiness, restore_rows
from agent.status import AgentStatus
from agent.store import RevisionStore

__all__ = ["HealthServer"]

_log = structlog.get_logger("agent.health")
_SOCKET_MODE: Final = 0o600
_SHUTDOWN_S: Final = 1.0


class HealthServer:
    """The aiohttp server behind the four endpoints."""

    def __init__(
        self,
        listen: HealthListen,
        *,
        status: AgentStatus,
        store: RevisionStore,
        metrics: Metrics,
        loop_watch: LoopWatch,
        stale_after: float,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        """`stale_after`: seconds without a pong after which a connected session is not
        ready (the ping interval plus its timeout)."""
        self._listen = listen
        self._status = status
        self._store = store
        self._metrics = metrics
        self._loop_watch = loop_watch
        self._stale_after = stale_after
        self._clock = clock
        self._runner: web.AppRunner | None = None
        self.address: str | None = None
        """Where it listens once started (`127.0.0.1:PORT` or `unix:/path`)."""

    async def start(self) -> str:
        """Bind and serve; returns the bound address."""
        app = web.Application()
        app.add_routes(
            [
                web.get("/healthz", self._healthz),
                web.get("/readyz", self._readyz),
                web.get("/metrics", self._metrics_text),
                web.get("/v1/restores", self._restores),
                web.get("/v1/jobs", self._jobs),
            ]
        )
        # A scrape in progress at shutdown gets a second, not aiohttp's default minute: the
        # app bounds this step by close_timeout_s anyway.
        runner = web.AppRunner(
            app, access_log=None, handle_signals=False, shutdown_timeout=_SHUTDOWN_S
        )
        await runner.setup()
        listen = self._listen
        site: web.BaseSite
        try:
            if listen.path is not None:
                site = web.UnixSite(runner, str(listen.path))
                await site.start()
                os.chmod(listen.path, _SOCKET_MODE)
                self.address = str(listen)
            else:
                site = web.TCPSite(runner, listen.host, listen.port, reuse_address=True)
                await site.start()
                self.address = _bound_tcp(runner, listen)
        except OSError as exc:
            await runner.cleanup()
            raise ConfigError(
                "health.listen", f"cannot listen on {listen}: {exc.strerror or exc}"
            ) from exc
        self._runner = runner
        _log.info("health_listening", address=self.address)
        return self.address

    async def stop(self) -> None:
        """Stop listening; requests in progress finish (idempotent)."""
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

    async def _readyz(self, request: web.Request) -> web.Response:
        del request
        snapshot = self._status.snapshot()
        reasons = readiness(
            snapshot,
            store_open=self._store.is_open,
            now=self._clock.time(),
            stale_after=self._stale_after,
        )
        body = {"ready": not reasons, "reasons": reasons, "session": snapshot.to_dict()}
        return web.json_response(body, status=503 if reasons else 200)

    async def _metrics_text(self, request: web.Request) -> web.Response:
        del request
        counts: dict[str, int] | None = None
        if self._store.is_open:
            try:
                counts = await self._store.count_by_status()
            except StoreError as exc:
                _log.warning("metrics_store_unreadable", error=str(exc))
        self._metrics.refresh(self._status.snapshot(), counts)
        return web.Response(body=self._metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    async def _restores(self, request: web.Request) -> web.Response:
        del request
        if not self._store.is_open:
            return web.json_response({"error": "the revision store is not open"}, status=503)
        try:
            states = await self._store.list_states()
            totals = await self._store.staging_totals()
        except StoreError as exc:
            return web.json_response({"error": str(exc)}, status=503)
        staging = {key: StagingTotals(*value) for key, value in totals.items()}
        body: dict[str, Any] = {
            "restores": restore_rows(states, staging, now_ms=epoch_ms(self._clock)),
        }
        return web.json_response(body)

    async def _jobs(self, request: web.Request) -> web.Response:
        del request
        if not self._store.is_open:
            return web.json_response({"error": "the revision store is not open"}, status=503)
        try:
            jobs = await self._store.list_jobs()
        except StoreError as exc:
            return web.json_response({"error": str(exc)}, status=503)
        return web.json_response({"jobs": job_rows(jobs, now_ms=epoch_ms(self._clock))})


def _bound_tcp(runner: web.AppRunner, listen: HealthListen) -> str:
    """`host:port` actually bound (port 0 asks the kernel for one)."""
    for address in runner.addresses:
        if isinstance(address, tuple):
            return str(HealthListen(host=str(address[0]), port=int(address[1])))
    return str(listen)
