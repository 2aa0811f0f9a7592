"""Pure transforms of the node state's wire form (`IIsolatedRestoreNodeState`, camelCase dicts).

Every function takes a state dict and returns a NEW dict (nested lists and dicts copied), so a
state read from the store is never changed in place. The store owns `revision`, `status` and
`updatedAt`; these functions leave them to it. Timestamps are epoch milliseconds passed in.

Also here: the engine's private fields (`private_fields`, `private_mappings`,
`private_manifest`): the resource mappings and the archive manifest of the prepare request,
kept next to the state because execute, stage and cleanup need them and Cloudly does not resend
them.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any, Final

from agent.contracts.backup import BackupArchiveManifest
from agent.contracts.isolatedrestore import (
    RESOURCE_MAPPING_ADAPTER,
    IsolatedRestoreNodeState,
    PrepareIsolatedRestoreRequest,
    ResourceMapping,
)
from agent.corestore.models import VerificationAnswer

__all__ = [
    "STAGING_ENTRY",
    "cleanup_complete",
    "cleanup_entry",
    "cleanup_pending",
    "initial_state",
    "private_fields",
    "private_manifest",
    "private_mappings",
    "to_model",
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

STAGING_ENTRY: Final = None
"""The key `cleanup_entry`/`with_cleanup_entry` use for the staging-archive entry."""

State = dict[str, Any]


def _copy(state: Mapping[str, Any]) -> State:
    return copy.deepcopy(dict(state))


def to_model(state: Mapping[str, Any]) -> IsolatedRestoreNodeState:
    """The validated contract model of a wire state (as `StoredState.state` holds it)."""
    return IsolatedRestoreNodeState.model_validate(dict(state), by_name=False)


# --- prepare ------------------------------------------------------------------------------------


def initial_state(request: PrepareIsolatedRestoreRequest, now: int) -> State:
    """The state a prepare request creates (status and revision are the store's)."""
    return {
        "restoreId": request.restore_id,
        "clusterId": request.cluster_id,
        "targetNodeName": request.target_node_name,
        "sourceBackupId": request.source_backup_id,
        "sourceServiceId": request.source_service_id,
        "scratchNamespaceId": request.scratch_namespace_id,
        "stagingArchiveId": request.staging_archive_id,
        "completedResourceMappingIds": [],
        "verification": {"status": "pending", "results": []},
        "updatedAt": now,
    }


def private_fields(request: PrepareIsolatedRestoreRequest) -> dict[str, Any]:
    """What the engine keeps of a prepare request beyond the state (never the grant)."""
    return {
        "resourceMappings": [mapping.to_wire() for mapping in request.resource_mappings],
        "archiveManifest": request.archive_manifest.to_wire(),
    }


def private_mappings(private: Mapping[str, Any]) -> list[ResourceMapping]:
    """The resource mappings kept by `private_fields`, validated again."""
    return [
        RESOURCE_MAPPING_ADAPTER.validate_python(item, by_name=False)
        for item in private.get("resourceMappings", [])
    ]


def private_manifest(private: Mapping[str, Any]) -> BackupArchiveManifest:
    """The archive manifest kept by `private_fields`, validated again."""
    return BackupArchiveManifest.model_validate(
        private.get("archiveManifest", {"objects": []}), by_name=False
    )


def with_prepared(state: Mapping[str, Any], now: int) -> State:
    """Corestore prepared the restore at `now`."""
    new = _copy(state)
    new["preparedAt"] = now
    return new


def with_error(state: Mapping[str, Any], code: str, message: str) -> State:
    """Remember the last failure (`lastErrorCode`, `lastErrorMessage`)."""
    new = _copy(state)
    new["lastErrorCode"] = code
    new["lastErrorMessage"] = message
    return new


# --- execute ------------------------------------------------------------------------------------


def with_completed_mapping(state: Mapping[str, Any], mapping_id: str) -> State:
    """`mapping_id` is restored (appended once)."""
    new = _copy(state)
    done: list[str] = new.setdefault("completedResourceMappingIds", [])
    if mapping_id not in done:
        done.append(mapping_id)
    return new


def with_verification_started(state: Mapping[str, Any], now: int) -> State:
    """Verification runs from `now`; results found by an earlier run are kept."""
    new = _copy(state)
    verification = new.setdefault("verification", {"status": "pending", "results": []})
    verification["status"] = "running"
    verification.setdefault("startedAt", now)
    verification.pop("completedAt", None)
    return new


def verification_result(
    mapping: ResourceMapping, answer: VerificationAnswer, now: int
) -> dict[str, Any]:
    """Corestore's checks of one resource as an `IIsolatedRestoreResourceVerification`."""
    checks = []
    for check in answer.checks:
        item: dict[str, Any] = {"code": check.code, "status": check.status}
        if check.message:
            item["message"] = check.message
        checks.append(item)
    return {
        "resourceMappingId": mapping.id,
        "resourceType": mapping.type,
        "status": answer.status,
        "checks": checks,
        "checkedAt": now,
    }


def with_verification_result(state: Mapping[str, Any], result: Mapping[str, Any]) -> State:
    """Add (or replace) the result of one resource."""
    new = _copy(state)
    verification = new.setdefault("verification", {"status": "running", "results": []})
    results = [
        item
        for item in verification.get("results", [])
        if item["resourceMappingId"] != result["resourceMappingId"]
    ]
    results.append(dict(result))
    verification["results"] = results
    return new


def with_verification_finished(state: Mapping[str, Any], *, passed: bool, now: int) -> State:
    """Verification is over: `passed` or `failed`."""
    new = _copy(state)
    verification = new.setdefault("verification", {"results": []})
    verification["status"] = "passed" if passed else "failed"
    verification["completedAt"] = now
    return new


def with_ready(state: Mapping[str, Any], now: int) -> State:
    """Every resource is restored and verified at `now`."""
    new = with_verification_finished(state, passed=True, now=now)
    new["readyAt"] = now
    return new


# --- cleanup ------------------------------------------------------------------------------------


def with_cleanup_plan(state: Mapping[str, Any], mappings: Iterable[ResourceMapping]) -> State:
    """The cleanup progress a cleanup request starts from.

    One entry per resource mapping and one for the staging archive. Entries of an earlier
    cleanup are kept as they are (a `succeeded` one is not redone, a `failed` one keeps its
    attempts and error until it is tried again); missing entries start `pending`, attempts 0.
    """
    new = _copy(state)
    known = new.get("cleanup") or {}
    by_id = {entry["resourceMappingId"]: entry for entry in known.get("resources", [])}
    resources = [
        by_id.get(
            mapping.id,
            {
                "resourceMappingId": mapping.id,
                "resourceType": mapping.type,
                "status": "pending",
                "attempts": 0,
            },
        )
        for mapping in mappings
    ]
    staging = known.get("stagingArchive") or {
        "stagingArchiveId": new["stagingArchiveId"],
        "status": "pending",
        "attempts": 0,
    }
    new["cleanup"] = {"resources": resources, "stagingArchive": staging}
    return new


def cleanup_entry(state: Mapping[str, Any], mapping_id: str | None) -> dict[str, Any]:
    """The cleanup entry of `mapping_id` (`STAGING_ENTRY` for the staging archive)."""
    cleanup = state["cleanup"]
    if mapping_id is STAGING_ENTRY:
        return dict(cleanup["stagingArchive"])
    for entry in cleanup["resources"]:
        if entry["resourceMappingId"] == mapping_id:
            return dict(entry)
    raise KeyError(mapping_id)


def with_cleanup_entry(
    state: Mapping[str, Any],
    mapping_id: str | None,
    *,
    status: str,
    now: int,
    attempt: bool = False,
    error: tuple[str, str] | None = None,
) -> State:
    """One entry moves to `status` at `now`; `attempt` counts a new try; `error` is (code, text).

    A `succeeded` or `running` entry drops the error of an earlier try.
    """
    new = _copy(state)
    cleanup = new["cleanup"]
    if mapping_id is STAGING_ENTRY:
        entry = cleanup["stagingArchive"]
    else:
        entry = next(e for e in cleanup["resources"] if e["resourceMappingId"] == mapping_id)
    entry["status"] = status
    entry["updatedAt"] = now
    if attempt:
        entry["attempts"] = entry.get("attempts", 0) + 1
    if error is not None:
        entry["errorCode"], entry["errorMessage"] = error
    else:
        entry.pop("errorCode", None)
        entry.pop("errorMessage", None)
    return new


def cleanup_pending(state: Mapping[str, Any]) -> list[str | None]:
    """The entries still to clean (not `succeeded`), resources first, the archive last."""
    cleanup = state.get("cleanup") or {"resources": [], "stagingArchive": None}
    pending: list[str | None] = [
        entry["resourceMappingId"]
        for entry in cleanup["resources"]
        if entry["status"] != "succeeded"
    ]
    archive = cleanup.get("stagingArchive")
    if archive is not None and archive["status"] != "succeeded":
        pending.append(STAGING_ENTRY)
    return pending


def cleanup_complete(state: Mapping[str, Any]) -> bool:
    """Whether every entry succeeded (only then may the restore count as cleaned)."""
    return "cleanup" in state and not cleanup_pending(state)
