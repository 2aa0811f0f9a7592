"""What the agent stands on before its state opens (`Parts`, built by `build_parts` from the
config and the clock): the health sockets and the state directory's lock, how the agent is
watched (its status, metrics, the loop watch, the health server, systemd's notifier) and the
byte paths every transfer shares (the transfer gate, its byte budget, the trimmer). The health
server serves from these alone while a disk refuses the state's writes; the parts built on
the open state take them from here (agent/entry/app.py)."""

from __future__ import annotations

import socket
from contextlib import AsyncExitStack
from dataclasses import dataclass

from agent.clock import Clock
from agent.config import Config, HealthListen
from agent.store import statedir
from agent.transfers import TransferGate
from agent.transfers.budget import ByteBudget
from agent.transfers.memory import Trimmer, trim_function
from agent.watch.health import HealthServer, bind_listener, close_listener
from agent.watch.loopwatch import LoopWatch, watch_interval
from agent.watch.metrics import Metrics
from agent.watch.notify import Notifier, watchdog_seconds
from agent.watch.status import AgentStatus
from agent.watch.statushooks import StatusHooks
from agent.watch.tee import Tee

__all__ = ["Parts", "build_parts"]


@dataclass(frozen=True)
class Parts:
    """What the agent stands on before its state opens: the health sockets and the state
    directory's lock (held until the end), how it is watched (its status, metrics, the loop
    watch, the health server, systemd's notifier) and the byte paths every transfer shares
    (the transfer gate and its byte budget, the trimmer). The health server serves from these
    alone while a disk refuses the state's writes."""

    clock: Clock
    status: AgentStatus
    notifier: Notifier
    listener: socket.socket
    scrape: tuple[socket.socket, HealthListen] | None
    created: bool
    metrics: Metrics
    hooks: StatusHooks
    observer: Tee
    watchdog_s: float | None
    loop_watch: LoopWatch
    trimmer: Trimmer
    transfers: TransferGate
    health: HealthServer


def build_parts(
    config: Config,
    resources: AsyncExitStack,
    *,
    status: AgentStatus,
    notifier: Notifier,
    clock: Clock,
) -> Parts:
    """The parts before the state, in the order start-up may refuse: the health address, then
    the state directory's lock (both may be busy for a while; the directory itself is made
    first if missing, the lock lives in it). What is bound or held is released by
    `resources`."""
    listener = bind_listener(config.health.endpoint)
    resources.callback(close_listener, listener, config.health.endpoint)
    scrape = config.health.metrics_endpoint
    scrape_listener = None if scrape is None else bind_listener(scrape, key="health.metrics_listen")
    if scrape is not None and scrape_listener is not None:
        resources.callback(close_listener, scrape_listener, scrape)
    directory = config.state.directory
    created = statedir.create(directory)
    resources.callback(statedir.lock(directory).close)
    metrics = Metrics()
    hooks = StatusHooks(status)
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
    health = HealthServer(
        config.health.endpoint,
        status=status,
        store=None,  # attached once the state is open
        metrics=metrics,
        loop_watch=loop_watch,
        stale_after=config.cloudly.ping_interval_s + config.cloudly.ping_timeout_s,
        clock=clock,
        transfers=transfers,
    )
    return Parts(
        clock=clock,
        status=status,
        notifier=notifier,
        listener=listener,
        scrape=None if scrape is None or scrape_listener is None else (scrape_listener, scrape),
        created=created,
        metrics=metrics,
        hooks=hooks,
        observer=Tee(metrics, hooks),
        watchdog_s=watchdog_s,
        loop_watch=loop_watch,
        trimmer=trimmer,
        transfers=transfers,
        health=health,
    )
