"""The steps of the ordered shutdown: each bounded on the agent's clock (`step`: an overrun is
logged and abandoned, the next step runs), one of them run at most once (`Once`: the health
server stops in the shutdown's order, or last when the state never opened)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import structlog

from agent.clock import Clock
from agent.startup.preflight import STEP_GRACE_S

__all__ = ["Once", "step"]

# The composition root's name: each step's line reads beside its shutdown lines.
log = structlog.get_logger("agent.entry.app")


class Once:
    """An async step that runs at most once (later calls do nothing)."""

    def __init__(self, step: Callable[[], Awaitable[object]]) -> None:
        self._step: Callable[[], Awaitable[object]] | None = step

    async def __call__(self) -> None:
        step, self._step = self._step, None
        if step is not None:
            await step()


async def step(
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
