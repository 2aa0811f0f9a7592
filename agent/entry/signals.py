"""SIGTERM and SIGINT while the agent runs: both ask it to stop (drain, then close in order); a
second Ctrl-C while it stops already cancels it at once."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterator

import structlog

__all__ = ["stop_on_signals"]

# The composition root's name: a signal's lines read beside its start-up and shutdown lines.
log = structlog.get_logger("agent.entry.app")


@contextlib.contextmanager
def stop_on_signals(stop: asyncio.Event) -> Iterator[None]:
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
