"""The engine's background work: preparing, executing and cleaning up a restore, step by step.

`run_prepare()`, `run_execute()` and `run_cleanup()` run in tasks the engine owns
(`IsolatedRestoreEngine.owner`, `background.WorkOwner`).
Each step is one Corestore call (which the Corestore client alone resends while Corestore is
unavailable, `agent.retry`) followed by one mutation of the node state, so a restart finds
exactly the steps that finished:

    prepare: preparing  -- Corestore prepared the restore (idempotent) --> prepared (preparedAt)
             preparing  -- Corestore refused it, or stayed unavailable --> failed
    execute: restoring  -- restore mapping m (start, poll until done) --> progress (+ m completed)
             restoring  -- every mapping completed -------------------> verifying (running)
             verifying  -- verify mapping m ---------------------------> progress (+ m's result)
             verifying  -- every result passed ------------------------> ready, else failed
    cleanup: cleaning   -- per entry (each resource, then the staging archive), one try each:
                           running (attempts + 1) -> succeeded | failed (errorCode, errorMessage)
             cleaning   -- every entry succeeded, then Corestore forgot the prepared restore
                           (DELETE /v1/isolated-restores/{id}) -> cleaned
             cleaning   -- an entry failed, or forgetting the restore failed -> cleanup-failed

Forgetting the prepared restore is not a progress entry (the contract's entries are the mappings
and the staging archive): it is the one step between "every entry succeeded" and `cleaned`.
When it fails, the state says
`cleanup-failed` with every entry `succeeded` and the failure in `lastErrorCode` /
`lastErrorMessage`; the next cleanup request finds no entry pending and only forgets again.

Steps already recorded are skipped when the work resumes (after a restart, on an exact replay of
the request that started it). A Corestore or integrity failure (`CorestoreUnavailable` included:
the client already rode out the node's outage up to its tolerance) ends the work in `failed` /
`cleanup-failed` with `lastErrorCode` (its wire code) and `lastErrorMessage`. Cloudly's exact
replay of the prepare or the execute resumes a `failed` one when that code is in `RESUMABLE`
(a failure that may pass: the engine writes `resume-prepare` / `resume-execute` and starts this
work again); its next cleanup request takes a `cleanup-failed` one up again. Any other `failed`
(Corestore refused, Corestore's own `restore-failed`, `verification-failed`) stays as it is
until a cleanup. Any other error (the store failed, the agent is shutting down, the state moved
under the work) leaves the state in flight as it is: it resumes on the next replay.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import structlog

from agent.clock import Clock, epoch_ms
from agent.contracts.backup import BackupArchiveManifest
from agent.contracts.isolatedrestore import (
    IsolatedRestoreNodeState,
    ResourceCleanupProgress,
    ResourceMapping,
)
from agent.corestore.client import CorestoreClient
from agent.corestore.models import ResourceStatus
from agent.domain.restore_machine import IN_FLIGHT, Op
from agent.domain.restores import RestoreKey, StoredState
from agent.errors import AgentError, CorestoreError, InvalidState, TransferError
from agent.restore import state as s
from agent.restore.settings import EngineSettings
from agent.secret import Secret
from agent.store import RevisionStore

__all__ = ["RESUMABLE", "RestoreWork", "run_cleanup", "run_execute", "run_prepare"]

_log = structlog.get_logger("agent.restore.work")
_VERIFICATION_FAILED = "verification-failed"
_RESTORE_FAILED = "restore-failed"


@dataclass(slots=True)
class RestoreWork:
    """One piece of background work on one restore. `grant` lives only as long as the work."""

    store: RevisionStore
    client: CorestoreClient
    key: RestoreKey
    grant: Secret = field(repr=False)
    settings: EngineSettings
    clock: Clock
    notify: Callable[[StoredState], None]
    stored: StoredState  # the latest state this work wrote or started from
    mappings: tuple[ResourceMapping, ...]  # the plan's, fixed at prepare
    manifest: BackupArchiveManifest | None = None  # the plan's, for the prepare work only
    # Told once the work wrote a status only a request leaves: the key is free for new work
    # from then, not only once the task has returned (a repeat may come in between).
    ended: Callable[[], None] = lambda: None

    def now(self) -> int:
        """The clock's wall time in epoch milliseconds (the state's timestamps)."""
        return epoch_ms(self.clock)

    @property
    def state(self) -> IsolatedRestoreNodeState:
        """The latest node state (frozen; every transform makes a new one)."""
        return self.stored.state

    async def mutate(self, op: Op, state: IsolatedRestoreNodeState) -> StoredState:
        """Persist `state` with `op` at the revision this work knows; the request digest stays."""
        self.stored = await self.store.mutate(
            self.key, expected_revision=self.stored.revision, op=op, state=state
        )
        if self.stored.status not in IN_FLIGHT:
            self.ended()
        self.notify(self.stored)
        return self.stored

    def log_fields(self) -> dict[str, str]:
        """The identifying fields of every log line of this work (no secret among them)."""
        return {"restore_id": self.key.restore_id, "node": self.key.node_name}


def _settles_as_failure(exc: AgentError) -> bool:
    """Failures of the work itself; anything else leaves the state in flight to resume."""
    return isinstance(exc, CorestoreError | TransferError)


def _retryable_codes(*roots: type[AgentError]) -> frozenset[str]:
    """The wire codes of the retryable errors under `roots` (their own `internal` aside)."""
    codes: set[str] = set()
    pending = list(roots)
    while pending:
        kind = pending.pop()
        pending.extend(kind.__subclasses__())
        if kind.retryable and kind.code != "internal":
            codes.add(kind.code)
    return frozenset(codes)


RESUMABLE: Final = _retryable_codes(CorestoreError, TransferError)
"""The `lastErrorCode`s of work that failed for a reason that may pass (Corestore unavailable
past the tolerance, a credential not to be had now, bytes that broke on the way): Cloudly's
exact replay of the request resumes such a `failed` restore (`IsolatedRestoreEngine`)."""


# --- prepare ------------------------------------------------------------------------------------


async def run_prepare(work: RestoreWork) -> None:
    """Have Corestore prepare the restore; ends `prepared` or `failed`.

    Corestore's prepare is idempotent (the same body answers the same), so the replay that
    resumes a `preparing` state left by a restart simply asks again.
    """
    _log.info("prepare_work_started", **work.log_fields())
    if work.manifest is None:
        raise InvalidState("the prepare work needs the plan's manifest")
    try:
        await work.client.prepare_restore(
            work.key.restore_id,
            scratch_namespace_id=work.state.scratch_namespace_id,
            staging_archive_id=work.state.staging_archive_id,
            resource_mappings=list(work.mappings),
            archive_manifest=work.manifest,
            grant=work.grant,
        )
        await work.mutate(Op.PREPARE_SUCCEEDED, s.with_prepared(work.state, work.now()))
    except AgentError as exc:
        if not _settles_as_failure(exc):
            _log.warning("prepare_work_interrupted", **work.log_fields(), code=exc.code)
            return
        await work.mutate(Op.PREPARE_FAILED, s.with_error(work.state, exc.code, str(exc)))
        _log.warning("prepare_failed", **work.log_fields(), code=exc.code)
        return
    _log.info("prepare_work_finished", **work.log_fields(), status=work.stored.status)


# --- execute ------------------------------------------------------------------------------------


async def run_execute(work: RestoreWork) -> None:
    """Restore every mapping not yet completed, then verify; ends `ready` or `failed`."""
    _log.info("restore_work_started", **work.log_fields(), status=work.stored.status)
    try:
        if work.stored.status == "restoring":
            await _restore_all(work)
        if work.stored.status == "verifying":
            await _verify_all(work)
    except AgentError as exc:
        if not _settles_as_failure(exc):
            _log.warning("restore_work_interrupted", **work.log_fields(), code=exc.code)
            return
        op = Op.RESTORE_FAILED if work.stored.status == "restoring" else Op.VERIFY_FAILED
        state = work.state
        if op is Op.VERIFY_FAILED:
            state = s.with_verification_finished(state, passed=False, now=work.now())
        await work.mutate(op, s.with_error(state, exc.code, str(exc)))
        _log.warning("restore_failed", **work.log_fields(), code=exc.code)
        return
    _log.info("restore_work_finished", **work.log_fields(), status=work.stored.status)


async def _restore_all(work: RestoreWork) -> None:
    for mapping in work.mappings:
        if mapping.id in work.state.completed_resource_mapping_ids:
            continue
        status = await _restore_one(work, mapping.id)
        if status.state != "succeeded":
            code = status.error.code if status.error is not None else status.state
            message = f"Corestore could not restore resource mapping {mapping.id}: {code}"
            await work.mutate(Op.RESTORE_FAILED, s.with_error(work.state, _RESTORE_FAILED, message))
            _log.warning("restore_failed", **work.log_fields(), code=_RESTORE_FAILED)
            return
        await work.mutate(Op.PROGRESS, s.with_completed_mapping(work.state, mapping.id))
    await work.mutate(Op.RESTORE_SUCCEEDED, s.with_verification_started(work.state, work.now()))


async def _restore_one(work: RestoreWork, mapping_id: str) -> ResourceStatus:
    """Start (or confirm) the restore of one mapping and poll until it is no longer running
    (`CorestoreUnavailable` past `restore_timeout`)."""
    return await work.client.wait_resource_restored(
        work.key.restore_id,
        mapping_id,
        work.grant,
        poll_interval=work.settings.poll_interval,
        max_wait=work.settings.restore_timeout,
    )


async def _verify_all(work: RestoreWork) -> None:
    done = {result.resource_mapping_id for result in work.state.verification.results}
    for mapping in work.mappings:
        if mapping.id in done:
            continue
        answer = await work.client.verify_resource(work.key.restore_id, mapping.id, work.grant)
        result = s.verification_result(mapping, answer, work.now())
        await work.mutate(Op.PROGRESS, s.with_verification_result(work.state, result))
    failed = [result for result in work.state.verification.results if result.status != "passed"]
    now = work.now()
    if not failed:
        await work.mutate(Op.VERIFY_PASSED, s.with_ready(work.state, now))
        return
    checks = sorted({c.code for r in failed for c in r.checks if c.status != "passed"})
    ids = ", ".join(result.resource_mapping_id for result in failed)
    message = f"verification failed for resource mapping(s) {ids}: " + (
        ", ".join(checks) or "no passing result"
    )
    state = s.with_verification_finished(work.state, passed=False, now=now)
    await work.mutate(Op.VERIFY_FAILED, s.with_error(state, _VERIFICATION_FAILED, message))
    _log.warning("restore_failed", **work.log_fields(), code=_VERIFICATION_FAILED)


# --- cleanup ------------------------------------------------------------------------------------


async def run_cleanup(work: RestoreWork) -> None:
    """Delete every entry not yet cleaned; ends `cleaned` or `cleanup-failed`."""
    _log.info("cleanup_work_started", **work.log_fields())
    try:
        for entry_id in s.cleanup_pending(work.state):
            await _clean_one(work, entry_id)
        if s.cleanup_complete(work.state):
            await _forget_restore(work)
            return
        first = s.cleanup_entry(work.state, s.cleanup_pending(work.state)[0])
        what = (
            first.resource_mapping_id
            if isinstance(first, ResourceCleanupProgress)
            else first.staging_archive_id
        )
        state = s.with_error(
            work.state,
            first.error_code or "internal",
            f"cleanup of {what} failed: {first.error_message or 'no answer'}",
        )
        await work.mutate(Op.CLEANUP_FAILED, state)
        _log.warning("cleanup_failed", **work.log_fields(), code=first.error_code)
    except AgentError as exc:
        _log.warning("cleanup_work_interrupted", **work.log_fields(), code=exc.code)


async def _forget_restore(work: RestoreWork) -> None:
    """Every entry is clean: Corestore forgets the prepared restore, then `cleaned`."""
    try:
        await work.client.delete_restore(work.key.restore_id, work.grant)
    except CorestoreError as exc:
        message = f"forgetting the prepared restore failed: {exc}"
        await work.mutate(Op.CLEANUP_FAILED, s.with_error(work.state, exc.code, message))
        _log.warning("cleanup_failed", **work.log_fields(), code=exc.code)
        return
    await work.mutate(Op.CLEANUP_SUCCEEDED, work.state)
    _log.info("cleanup_work_finished", **work.log_fields(), status=work.stored.status)


async def _clean_one(work: RestoreWork, entry_id: str | None) -> None:
    """Delete one resource (or the staging archive): one try, recorded before and after."""
    running = s.with_cleanup_entry(
        work.state, entry_id, status="running", now=work.now(), attempt=True
    )
    await work.mutate(Op.PROGRESS, running)
    try:
        if entry_id is s.STAGING_ENTRY:
            outcome = await work.client.delete_staging_archive(
                work.state.staging_archive_id, work.grant
            )
        else:
            outcome = await work.client.delete_resource(work.key.restore_id, entry_id, work.grant)
    except CorestoreError as exc:
        error = (exc.code, str(exc))
        failed = s.with_cleanup_entry(
            work.state, entry_id, status="failed", now=work.now(), error=error
        )
        await work.mutate(Op.PROGRESS, failed)
        return
    done = s.with_cleanup_entry(work.state, entry_id, status="succeeded", now=work.now())
    await work.mutate(Op.PROGRESS, done)
    _log.info("cleanup_entry_done", **work.log_fields(), outcome=outcome.value)
