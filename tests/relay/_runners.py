"""Helpers of the relay runner tests: a `JobRunner` running on a store for the length of an
`async for` (one pass), a Cloudly session as the runner sees it (requests arriving in order,
answers delivered or lost), and work the test controls.

The conftest fixtures use `running`; tests that stop a runner and start another on the same
store use it directly."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from agent.domain.jobs import JobKey
from agent.domain.outcomes import JobReport, RestoreEffects, RunPlan, Succeeded
from agent.protocol.delivery import Mark
from agent.relay.runner import JobRunner, Started
from agent.store import RevisionStore

__all__ = ["Session", "Works", "running"]


async def running(store: RevisionStore) -> AsyncIterator[JobRunner]:
    """A started runner; closed (5 s bound) and awaited when the loop body ends."""
    runner = JobRunner(store)
    task = asyncio.create_task(runner.run())
    await runner.started()
    try:
        yield runner
    finally:
        await runner.close(5)
        await task


class Session:
    """Cloudly's session as the runner sees it: each request arrives after the one before (one
    message each, on the current connection). An answer is delivered when the test says so
    (`deliver()`: at a pong read right after the last message so far), or at once with
    `auto=True`; a reconnect loses what was not delivered."""

    def __init__(self, *, auto: bool = True) -> None:
        self.auto = auto
        self.connection = 1
        self.messages = 0
        self.pending: list[Callable[[Mark], None]] = []
        self.settles = 0

    def request(self) -> _Request:
        """The next request's context."""
        self.messages += 1
        return _Request(self, Mark(self.connection))

    def deliver(self) -> None:
        """A pong read now delivers every answer sent so far."""
        pending, self.pending = self.pending, []
        for callback in pending:
            callback(Mark(self.connection))

    def reconnect(self) -> None:
        """The connection ends (what no pong confirmed is lost); the next one begins."""
        self.pending.clear()
        self.connection += 1
        self.messages = 0


class _Request:
    def __init__(self, session: Session, arrival: Mark) -> None:
        self._session = session
        self.arrival = arrival

    def on_delivered(self, callback: Callable[[Mark], None]) -> None:
        self._session.pending.append(callback)
        if self._session.auto:
            self._session.deliver()


class Works:
    """Work the test controls: each run records its key and the plan it was given, then waits
    for `release` (set by default: the work ends at once). A restore's plan has an archive
    restore under a key numbered per new run (`restore-1`, `restore-2`, ...)."""

    def __init__(self) -> None:
        self.runs: list[tuple[JobKey, RunPlan | None]] = []
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.release.set()
        self.plans = 0

    @property
    def keys(self) -> list[JobKey]:
        return [key for key, _ in self.runs]

    async def start(self, resumed: RunPlan | None) -> Started:
        plan = resumed
        if plan is None:
            self.plans += 1
            plan = RunPlan(
                RestoreEffects(archive_restore=f"restore-{self.plans}"),
                Succeeded({"restored": []}, JobReport(resource_types=("volume",))),
            )

        async def work(job: JobKey, stored: RunPlan | None) -> Succeeded:
            self.runs.append((job, stored))
            self.started.set()
            await self.release.wait()
            return Succeeded({"restored": [{"run": job.run}]}, JobReport(snapshots=len(self.runs)))

        return Started(work, plan)

    def hold(self) -> None:
        """The next runs wait until `release` is set."""
        self.release.clear()
        self.started.clear()
