"""The node state as the engine changes it: pure transforms of the frozen contract model.

Inside the engine a node state is `IsolatedRestoreNodeState` (seed 000), never a wire dict. Every
transform here takes a state and returns a new one made with `model_copy(update=...)`, nested
models and lists likewise, so a state read from the store is never changed. `model_copy` does not
validate: each transform builds its values from typed arguments, and the store re-reads every
state it writes through the model. The store owns `revision`, `status` and `updatedAt` (and the
routing key): the transforms leave them alone and the store replaces them from its row.
Timestamps are epoch milliseconds passed in.

What the prepare request fixed for the rest of the restore (`PreparedPlan`) is the domain's:
`agent.domain.restores`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Final

from agent.contracts.isolatedrestore import (
    CleanupProgress,
    CleanupProgressStatus,
    IsolatedRestoreNodeState,
    IsolatedRestoreVerification,
    PrepareIsolatedRestoreRequest,
    ResourceCleanupProgress,
    ResourceMapping,
    ResourceVerification,
    StagingCleanupProgress,
    VerificationCheck,
)

if TYPE_CHECKING:
    # Only a type here: importing `agent.corestore` loads its HTTP client, which pure
    # transforms have no use for.
    from agent.corestore.models import VerificationAnswer

__all__ = [
    "ADOPTED_CODE",
    "STAGING_ENTRY",
    "CleanupEntry",
    "adopted_state",
    "cleanup_complete",
    "cleanup_entry",
    "cleanup_pending",
    "initial_state",
    "verification_result",
    "with_cleanup_entry",
    "with_cleanup_plan",
    "with_completed_mapping",
    "with_error",
    "with_prepared",
    "with_ready",
    "with_verification_finished",
    "with_verification_result",
    "with_verification_started",
]

ADOPTED_CODE: Final = "state-lost"
"""The `lastErrorCode` of a state reconciliation adopted (`adopted_state`)."""
UNKNOWN: Final = "unknown"

STAGING_ENTRY: Final = None
"""The entry id `cleanup_entry`/`with_cleanup_entry` use for the staging archive."""

CleanupEntry = ResourceCleanupProgress | StagingCleanupProgress
State = IsolatedRestoreNodeState


# --- prepare ------------------------------------------------------------------------------------


def initial_state(request: PrepareIsolatedRestoreRequest, now: int) -> State:
    """The state a prepare request creates. Its revision and status are placeholders: the
    store writes the row's (revision 1, `preparing`)."""
    return IsolatedRestoreNodeState(
        restore_id=request.restore_id,
        cluster_id=request.cluster_id,
        target_node_name=request.target_node_name,
        source_backup_id=request.source_backup_id,
        source_service_id=request.source_service_id,
        scratch_namespace_id=request.scratch_namespace_id,
        staging_archive_id=request.staging_archive_id,
        revision=request.expected_revision,
        status="preparing",
        completed_resource_mapping_ids=[],
        verification=IsolatedRestoreVerification(status="pending", results=[]),
        updated_at=now,
    )


def adopted_state(
    *,
    restore_id: str,
    cluster_id: str,
    node_id: str,
    scratch_namespace_id: str,
    staging_archive_id: str,
    mappings: Iterable[ResourceMapping],
    how: str,
    now: int,
) -> State:
    """The state reconciliation makes for a restore Corestore holds that a salvaged or reset
    state forgot: `cleanup-failed` (the store writes it), its cleanup planned over every
    mapping and the staging archive, so Cloudly's next cleanup removes it all. The source
    backup and service are not known any more (`unknown`)."""
    state = IsolatedRestoreNodeState(
        restore_id=restore_id,
        cluster_id=cluster_id,
        target_node_name=node_id,
        source_backup_id=UNKNOWN,
        source_service_id=UNKNOWN,
        scratch_namespace_id=scratch_namespace_id,
        staging_archive_id=staging_archive_id,
        revision=0,
        status="cleanup-failed",
        completed_resource_mapping_ids=[],
        verification=IsolatedRestoreVerification(status="pending", results=[]),
        updated_at=now,
    )
    planned = with_cleanup_plan(state, mappings)
    return with_error(
        planned,
        ADOPTED_CODE,
        f"Corestore holds this restore, which the node's state forgot when it was {how}: its "
        "scratch resources and staging archive wait for a cleanup",
    )


def with_prepared(state: State, now: int) -> State:
    """Corestore prepared the restore at `now`."""
    return state.model_copy(update={"prepared_at": now})


def with_error(state: State, code: str, message: str) -> State:
    """Remember the last failure (`lastErrorCode`, `lastErrorMessage`)."""
    return state.model_copy(update={"last_error_code": code, "last_error_message": message})


def without_error(state: State) -> State:
    """Forget the last failure: the work it ended runs again."""
    return state.model_copy(update={"last_error_code": None, "last_error_message": None})


# --- execute ------------------------------------------------------------------------------------


def with_completed_mapping(state: State, mapping_id: str) -> State:
    """`mapping_id` is restored (listed once)."""
    done = state.completed_resource_mapping_ids
    if mapping_id in done:
        return state
    return state.model_copy(update={"completed_resource_mapping_ids": [*done, mapping_id]})


def _with_verification(state: State, **changes: object) -> State:
    return state.model_copy(update={"verification": state.verification.model_copy(update=changes)})


def with_verification_started(state: State, now: int) -> State:
    """Verification runs from `now` (or from when an earlier run started); results kept."""
    started = state.verification.started_at
    return _with_verification(
        state, status="running", started_at=now if started is None else started, completed_at=None
    )


def verification_result(
    mapping: ResourceMapping, answer: VerificationAnswer, now: int
) -> ResourceVerification:
    """Corestore's checks of one resource as the state's `IIsolatedRestoreResourceVerification`."""
    return ResourceVerification(
        resource_mapping_id=mapping.id,
        resource_type=mapping.type,
        status=answer.status,
        checks=[
            VerificationCheck(code=check.code, status=check.status, message=check.message or None)
            for check in answer.checks
        ],
        checked_at=now,
    )


def with_verification_result(state: State, result: ResourceVerification) -> State:
    """Add (or replace) the result of one resource."""
    others = [
        item
        for item in state.verification.results
        if item.resource_mapping_id != result.resource_mapping_id
    ]
    return _with_verification(state, results=[*others, result])


def with_verification_finished(state: State, *, passed: bool, now: int) -> State:
    """Verification is over: `passed` or `failed`."""
    return _with_verification(state, status="passed" if passed else "failed", completed_at=now)


def with_ready(state: State, now: int) -> State:
    """Every resource is restored and verified at `now`."""
    finished = with_verification_finished(state, passed=True, now=now)
    return finished.model_copy(update={"ready_at": now})


# --- cleanup ------------------------------------------------------------------------------------


def with_cleanup_plan(state: State, mappings: Iterable[ResourceMapping]) -> State:
    """The cleanup progress a cleanup request starts from.

    One entry per resource mapping and one for the staging archive. Entries of an earlier
    cleanup are kept as they are (a `succeeded` one is not redone, a `failed` one keeps its
    attempts and error until it is tried again); missing entries start `pending`, attempts 0.
    """
    known = state.cleanup
    by_id = {entry.resource_mapping_id: entry for entry in known.resources} if known else {}
    resources = [
        by_id.get(mapping.id)
        or ResourceCleanupProgress(
            resource_mapping_id=mapping.id,
            resource_type=mapping.type,
            status="pending",
            attempts=0,
        )
        for mapping in mappings
    ]
    staging = (
        known.staging_archive
        if known
        else StagingCleanupProgress(
            staging_archive_id=state.staging_archive_id, status="pending", attempts=0
        )
    )
    cleanup = CleanupProgress(resources=resources, staging_archive=staging)
    return state.model_copy(update={"cleanup": cleanup})


def _cleanup_of(state: State) -> CleanupProgress:
    if state.cleanup is None:
        raise KeyError("the state has no cleanup progress")
    return state.cleanup


def cleanup_entry(state: State, mapping_id: str | None) -> CleanupEntry:
    """The cleanup entry of `mapping_id` (`STAGING_ENTRY` for the staging archive)."""
    cleanup = _cleanup_of(state)
    if mapping_id is STAGING_ENTRY:
        return cleanup.staging_archive
    for entry in cleanup.resources:
        if entry.resource_mapping_id == mapping_id:
            return entry
    raise KeyError(mapping_id)


def with_cleanup_entry(
    state: State,
    mapping_id: str | None,
    *,
    status: CleanupProgressStatus,
    now: int,
    attempt: bool = False,
    error: tuple[str, str] | None = None,
) -> State:
    """One entry moves to `status` at `now`; `attempt` counts a new try; `error` is (code, text).

    An entry without `error` drops the error of an earlier try.
    """
    entry = cleanup_entry(state, mapping_id)
    code, message = error if error is not None else (None, None)
    changed = entry.model_copy(
        update={
            "status": status,
            "updated_at": now,
            "attempts": entry.attempts + 1 if attempt else entry.attempts,
            "error_code": code,
            "error_message": message,
        }
    )
    cleanup = _cleanup_of(state)
    if isinstance(changed, StagingCleanupProgress):
        cleanup = cleanup.model_copy(update={"staging_archive": changed})
    else:
        resources = [
            changed if item.resource_mapping_id == mapping_id else item
            for item in cleanup.resources
        ]
        cleanup = cleanup.model_copy(update={"resources": resources})
    return state.model_copy(update={"cleanup": cleanup})


def cleanup_pending(state: State) -> list[str | None]:
    """The entries still to clean (not `succeeded`), resources first, the archive last."""
    if state.cleanup is None:
        return []
    pending: list[str | None] = [
        entry.resource_mapping_id
        for entry in state.cleanup.resources
        if entry.status != "succeeded"
    ]
    if state.cleanup.staging_archive.status != "succeeded":
        pending.append(STAGING_ENTRY)
    return pending


def cleanup_complete(state: State) -> bool:
    """Whether every entry succeeded (only then may the restore count as cleaned)."""
    return state.cleanup is not None and not cleanup_pending(state)
