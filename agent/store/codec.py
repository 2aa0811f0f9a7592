"""Between Python values and rows: JSON encoding, the secret guard, argument checks.

The store owns six fields of the wire state (`restoreId`, `clusterId`, `targetNodeName`,
`revision`, `status`, `updatedAt`): they are dropped before the JSON is written and filled in
from the row's columns on every read, so the row has one source of truth for each.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections.abc import Mapping
from typing import Any, Final

from agent.errors import InvalidState, StoreError
from agent.restore.machine import NODE_STATUSES, NodeStatus
from agent.secret import Secret
from agent.store.records import RestoreKey, StoredState

__all__ = [
    "check_count",
    "check_path",
    "check_sha256",
    "encode",
    "encode_state",
    "is_sha256",
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


def is_sha256(value: str) -> bool:
    """64 lower-case hex characters."""
    return _SHA256.fullmatch(value) is not None


def _refuse_secrets(value: Any, where: str) -> None:
    """InvalidState if `value` holds a `Secret` or a `restoreGrant` key at any depth."""
    if isinstance(value, Secret):
        raise InvalidState(f"refusing to persist a secret in {where}")
    if isinstance(value, Mapping):
        if _GRANT_FIELD in value:
            raise InvalidState(f"refusing to persist a restore grant in {where}")
        for item in value.values():
            _refuse_secrets(item, where)
    elif isinstance(value, list | tuple):
        for item in value:
            _refuse_secrets(item, where)


def encode(where: str, value: Mapping[str, Any]) -> str:
    """`value` as compact JSON; `InvalidState` for a secret, a grant or a non-JSON value."""
    if not isinstance(value, Mapping):
        raise InvalidState(f"{where} must be a mapping")
    _refuse_secrets(value, where)
    try:
        return json.dumps(
            dict(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except (TypeError, ValueError) as exc:
        raise InvalidState(f"{where} is not JSON: {exc}") from exc


def encode_state(key: RestoreKey, state: Mapping[str, Any]) -> str:
    """The wire state's JSON without the store-owned fields (key fields must match `key`)."""
    if not isinstance(state, Mapping):
        raise InvalidState("state must be a mapping")
    for field, attribute in _KEY_FIELDS:
        if field in state and state[field] != getattr(key, attribute):
            raise InvalidState(f"state.{field} does not match the store key")
    return encode("state", {k: v for k, v in state.items() if k not in _OWNED_FIELDS})


def to_stored(row: sqlite3.Row | tuple[Any, ...]) -> StoredState:
    """A `restore_state` row (`_COLUMNS` order) as a `StoredState` with the owned fields set."""
    cluster_id, node_name, restore_id, revision, status, state_json, private_json, digest, at = row
    key = RestoreKey(cluster_id, node_name, restore_id)
    typed_status = _STATUS.get(status)
    if typed_status is None:
        raise StoreError(f"the state database holds an unknown status {status!r}")
    state = json.loads(state_json)
    state.update(
        restoreId=restore_id,
        clusterId=cluster_id,
        targetNodeName=node_name,
        revision=revision,
        status=typed_status,
        updatedAt=at,
    )
    return StoredState(
        key=key,
        revision=revision,
        status=typed_status,
        state=state,
        private=json.loads(private_json),
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
