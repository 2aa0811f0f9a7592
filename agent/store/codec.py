"""Between models and rows: the node state and plan codec, the secret guard, argument checks.

The one place a node state is serialised for the store. `encode_state` writes the model's wire
JSON without the six fields the store owns (`restoreId`, `clusterId`, `targetNodeName`,
`revision`, `status`, `updatedAt`); `to_stored` reads a row back into the model with those
fields filled in from the row's columns, so the row has one source of truth for each.
`encode_plan` writes the engine's `PreparedPlan` once, at prepare, for the `restore_plan` row
(its mappings' and its manifest's wire JSON, apart, with their counts) and the
`manifest_object` rows (one per manifest object); `read_plan` reads it back, `read_mappings`
only its mappings (what execute and cleanup need: a large manifest is never parsed for them). A
row that no longer reads as the models is a `StoreError` naming the field, never its value.

The guard: nothing that is or holds a `Secret`, or carries a `restoreGrant` field or key at any
depth (a pass-through document's extra fields included), is ever written.
"""

from __future__ import annotations

import functools
import json
import re
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from pydantic import BaseModel, ValidationError

from agent.contracts.base import WireModel, first_problem
from agent.contracts.isolatedrestore import (
    NODE_STATUSES,
    IsolatedRestoreNodeState,
    NodeStatus,
    ResourceMapping,
)
from agent.domain.restores import PreparedPlan, RestoreKey, StoredState
from agent.errors import InvalidState, StoreError
from agent.secret import Secret

__all__ = [
    "EncodedPlan",
    "check_count",
    "check_path",
    "check_sha256",
    "encode_plan",
    "encode_state",
    "is_sha256",
    "read_mappings",
    "read_plan",
    "to_stored",
]

_SHA256: Final = re.compile(r"[0-9a-f]{64}")
_STATUS: Final[dict[str, NodeStatus]] = {status: status for status in NODE_STATUSES}
_KEY_FIELDS: Final = (
    ("restoreId", "restore_id"),
    ("clusterId", "cluster_id"),
    ("targetNodeName", "node_name"),
)
_OWNED_FIELDS: Final = frozenset(
    {"restoreId", "clusterId", "targetNodeName", "revision", "status", "updatedAt"}
)
_GRANT_FIELD: Final = "restoreGrant"
_W = TypeVar("_W", bound=WireModel)


def is_sha256(value: str) -> bool:
    """64 lower-case hex characters."""
    return _SHA256.fullmatch(value) is not None


def _refuse_secrets(value: Any, where: str) -> None:
    """InvalidState if `value` is or holds a `Secret`, or a `restoreGrant` field or key.

    Walks models (their field values and their extra fields), mappings and sequences: a
    `Secret` dumps as its mask, so the check must run on the values, before any JSON exists.
    Iterative, scalars first: it runs on every mutation.
    """
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, _SCALARS):
            continue
        if isinstance(item, Secret):
            raise InvalidState(f"refusing to persist a secret in {where}")
        if isinstance(item, BaseModel):
            if _names_a_grant(type(item)):
                raise InvalidState(f"refusing to persist a restore grant in {where}")
            pending.extend(item.__dict__.values())
            if item.model_extra:
                pending.append(item.model_extra)
        elif isinstance(item, Mapping):
            if _GRANT_FIELD in item:
                raise InvalidState(f"refusing to persist a restore grant in {where}")
            pending.extend(item.values())
        elif isinstance(item, list | tuple):
            pending.extend(item)


_SCALARS: Final = (str, int, float, type(None))


@functools.cache
def _names_a_grant(model: type[BaseModel]) -> bool:
    return any((info.alias or name) == _GRANT_FIELD for name, info in model.model_fields.items())


def _json(where: str, value: Mapping[str, Any]) -> str:
    try:
        return json.dumps(
            dict(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except (TypeError, ValueError) as exc:
        raise InvalidState(f"{where} is not JSON: {exc}") from exc


def encode_state(key: RestoreKey, state: IsolatedRestoreNodeState) -> str:
    """The state's wire JSON without the store-owned fields (its key fields must match `key`)."""
    if not isinstance(state, IsolatedRestoreNodeState):
        raise InvalidState("state must be an IsolatedRestoreNodeState")
    _refuse_secrets(state, "state")
    wire = state.to_wire()
    for field, attribute in _KEY_FIELDS:
        if wire[field] != getattr(key, attribute):
            raise InvalidState(f"state.{field} does not match the store key")
    return _json("state", {k: v for k, v in wire.items() if k not in _OWNED_FIELDS})


@dataclass(frozen=True, slots=True)
class EncodedPlan:
    """A plan as the store writes it: the `restore_plan` row's values and the manifest's rows."""

    mappings_json: str
    manifest_json: str
    mapping_count: int
    object_count: int
    manifest_bytes: int
    objects: list[tuple[str, int, str]]
    """(path, size, sha256) of every manifest object, in manifest order."""


def encode_plan(plan: PreparedPlan) -> EncodedPlan:
    """The plan's parts as wire JSON (camelCase), counted, and its manifest as rows."""
    if not isinstance(plan, PreparedPlan):
        raise InvalidState("plan must be a PreparedPlan")
    _refuse_secrets(plan, "plan")
    wire = plan.to_wire()
    objects = plan.archive_manifest.objects
    return EncodedPlan(
        mappings_json=_json_list("plan", wire["resourceMappings"]),
        manifest_json=_json("plan", wire["archiveManifest"]),
        mapping_count=len(plan.resource_mappings),
        object_count=len(objects),
        manifest_bytes=sum(entry.size for entry in objects),
        objects=[(entry.path, entry.size, entry.sha256) for entry in objects],
    )


def _json_list(where: str, value: list[Any]) -> str:
    try:
        return json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except (TypeError, ValueError) as exc:
        raise InvalidState(f"{where} is not JSON: {exc}") from exc


_NO_MANIFEST: Final = '{"objects":[]}'


def read_plan(mappings_json: str, manifest_json: str) -> PreparedPlan:
    """The `PreparedPlan` of a `restore_plan` row."""
    return _read(
        PreparedPlan,
        {
            "resourceMappings": json.loads(mappings_json),
            "archiveManifest": json.loads(manifest_json),
        },
        "plan",
    )


def read_mappings(mappings_json: str) -> list[ResourceMapping]:
    """The resource mappings of a `restore_plan` row (its manifest left unread)."""
    return read_plan(mappings_json, _NO_MANIFEST).resource_mappings


def _read(model: type[_W], data: Any, what: str) -> _W:
    try:
        return model.from_wire(data)
    except ValidationError as exc:
        field, reason = first_problem(exc, root=what)
        # Not chained: pydantic's own text may quote the stored value.
        raise StoreError(
            f"the state database holds an unreadable {what}: {field}: {reason}"
        ) from None


def to_stored(row: sqlite3.Row | tuple[Any, ...]) -> StoredState:
    """A `restore_state` row (`_COLUMNS` order) as a `StoredState` with the owned fields set."""
    cluster_id, node_name, restore_id, revision, status, state_json, digest, at = row
    key = RestoreKey(cluster_id, node_name, restore_id)
    typed_status = _STATUS.get(status)
    if typed_status is None:
        raise StoreError(f"the state database holds an unknown status {status!r}")
    data = json.loads(state_json)
    data.update(
        restoreId=restore_id,
        clusterId=cluster_id,
        targetNodeName=node_name,
        revision=revision,
        status=typed_status,
        updatedAt=at,
    )
    state = _read(IsolatedRestoreNodeState, data, "state")
    return StoredState(
        key=key,
        revision=revision,
        status=typed_status,
        state=state,
        mutation_digest=digest,
        updated_at=at,
    )


def check_path(object_path: str) -> None:
    """`InvalidState` for an empty object path."""
    if not object_path:
        raise InvalidState("object_path must be a non-empty string")


def check_count(name: str, value: int, *, minimum: int) -> None:
    """`InvalidState` unless `value` is an int (not a bool) >= `minimum`."""
    if isinstance(value, bool) or value < minimum:
        raise InvalidState(f"{name} must be an int >= {minimum}")


def check_sha256(sha256: str) -> None:
    """`InvalidState` unless `sha256` is 64 lower-case hex characters."""
    if not is_sha256(sha256):
        raise InvalidState("sha256 must be 64 lower-case hex characters")
