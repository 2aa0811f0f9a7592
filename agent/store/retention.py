"""`Retention`: old finished records are forgotten, in small steps, off the request path.

What is forgotten (`forgetting.py` has the SQL): node states in `restore_machine.FORGETTABLE`
(`cleaned`) and relay jobs in `job_machine.FINISHED` (`succeeded`, `failed`; the latest restore
run of each service is kept, so run numbers never repeat), once last changed more than
`max_age_s` ago (`[state] retention_days`), with every row that belongs to them. What a request
meets once its record is gone is the domain's rule for an absent record (docs/isolated-restore.md
and docs/relay.md, "Retention").

How: `run()` (a task of the caller's TaskGroup, on the injected Clock) sleeps `first_delay_s`,
then makes a pass every `interval_s`. A pass (`sweep()`) takes the cutoff once, then calls
`RevisionStore.forget_expired` until nothing expired is left: each call is one transaction of
at most about `batch_rows` deleted rows, holding the store (and SQLite's write lock) for
milliseconds, and between two calls every other caller waiting on the store goes first (its
lock hands over in order). Then it gives the freed pages back to the file system,
`vacuum_pages` at a time, and checkpoints the WAL, so the file shrinks to what it holds. All SQL
runs in aiosqlite's thread: the event loop only schedules it.

A pass that fails (the store failed or closed) is logged and the next one comes at its time. A
pass reports what it deleted (`StoreObserver.retention_deleted`) and the bytes it gave back
(`retention_freed`), and logs one `retention_pass` line when it did anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, NoReturn

import structlog

from agent.clock import SYSTEM_CLOCK, Clock, epoch_ms
from agent.errors import AgentError
from agent.observe import NULL_OBSERVER, StoreObserver
from agent.store.store import RevisionStore

__all__ = ["DAY_S", "Retention", "RetentionSettings", "SweepOutcome"]

_log = structlog.get_logger("agent.store.retention")

DAY_S: Final = 86_400.0


@dataclass(frozen=True, slots=True)
class RetentionSettings:
    """How old a finished record may grow, and the pace of forgetting."""

    max_age_s: float
    first_delay_s: float = 60.0  # after start-up: leave the first minute to Cloudly's requests
    interval_s: float = 3_600.0  # between passes: a record outlives its age by an hour at most
    batch_rows: int = 1_000  # rows one transaction deletes: a few milliseconds of SQLite
    vacuum_pages: int = 256  # pages one incremental vacuum frees (1 MiB of 4 KiB pages)

    def __post_init__(self) -> None:
        if self.max_age_s <= 0 or self.first_delay_s < 0 or self.interval_s <= 0:
            raise ValueError("retention needs max_age_s > 0, first_delay_s >= 0, interval_s > 0")
        if self.batch_rows < 1 or self.vacuum_pages < 1:
            raise ValueError("retention needs batch_rows >= 1 and vacuum_pages >= 1")

    @classmethod
    def from_days(cls, days: int) -> RetentionSettings:
        """`[state] retention_days` as settings (the pace at its defaults)."""
        return cls(max_age_s=days * DAY_S)


@dataclass(frozen=True, slots=True)
class SweepOutcome:
    """What one pass did."""

    restores: int = 0
    jobs: int = 0
    rows: int = 0
    steps: int = 0
    freed_bytes: int = 0


class Retention:
    """Forgets the store's old finished records; run it in the caller's TaskGroup."""

    def __init__(
        self,
        store: RevisionStore,
        settings: RetentionSettings,
        *,
        clock: Clock = SYSTEM_CLOCK,
        observer: StoreObserver = NULL_OBSERVER,
    ) -> None:
        self._store = store
        self._settings = settings
        self._clock = clock
        self._observer = observer

    @property
    def settings(self) -> RetentionSettings:
        """The age and the pace."""
        return self._settings

    async def run(self) -> NoReturn:
        """A pass after `first_delay_s`, then one every `interval_s`, until cancelled."""
        await self._clock.sleep(self._settings.first_delay_s)
        while True:
            try:
                await self.sweep()
            except AgentError as exc:  # the store failed or closed: the next pass tries again
                _log.warning("retention_pass_failed", code=exc.code, error=str(exc))
                self._observer.retention_failed()
            await self._clock.sleep(self._settings.interval_s)

    async def sweep(self) -> SweepOutcome:
        """One pass: forget what expired by now, in steps; give the freed pages back."""
        settings, store = self._settings, self._store
        started = self._clock.monotonic()
        cutoff = epoch_ms(self._clock) - round(settings.max_age_s * 1000)
        before = store.file_bytes()
        restores = jobs = rows = steps = 0
        while True:
            step = await store.forget_expired(cutoff, rows=settings.batch_rows)
            steps += 1
            restores, jobs, rows = restores + step.restores, jobs + step.jobs, rows + step.rows
            if step.restores:
                self._observer.retention_deleted(what="restore", count=step.restores)
            if step.jobs:
                self._observer.retention_deleted(what="job", count=step.jobs)
            if step.done:
                break
        freed = 0
        while freed_now := await store.vacuum(pages=settings.vacuum_pages):
            freed += freed_now
            self._observer.retention_freed(count=freed_now)
        if rows or freed:
            await store.checkpoint()
            _log.info(
                "retention_pass",
                restores=restores,
                jobs=jobs,
                rows=rows,
                steps=steps,
                freed_bytes=freed,
                database_bytes_before=before,
                database_bytes_after=store.file_bytes(),
                seconds=round(self._clock.monotonic() - started, 3),
            )
        return SweepOutcome(restores, jobs, rows, steps, freed)
