"""Hypothesis strategies for valid wire dicts of the contract shapes, and for breaking them.

Every strategy here yields the exact wire form: camelCase keys, absent optionals omitted, JSON
values only. `mutated()` turns a valid dict into an arbitrary (usually invalid) one.
"""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from hypothesis import strategies as st
from pydantic import BaseModel

from agent.contracts.base import MAX_SAFE_INTEGER
from agent.contracts.isolatedrestore import NODE_STATUSES

__all__ = [
    "archive_manifests",
    "archive_objects",
    "cleanup_requests",
    "execute_requests",
    "from_wire",
    "json_values",
    "mutated",
    "node_states",
    "prepare_requests",
    "resource_mappings",
    "stage_requests",
    "status_requests",
]

_NO_SURROGATES: tuple[Literal["Cs"]] = ("Cs",)
_TEXT = st.characters(exclude_categories=_NO_SURROGATES)
identifiers = st.text(_TEXT, min_size=1, max_size=10)
free_text = st.text(_TEXT, max_size=10)
sha256s = st.text("0123456789abcdef", min_size=64, max_size=64)
safe_naturals = st.integers(0, MAX_SAFE_INTEGER)
timestamps = st.integers(0, 4_102_444_800_000)
resource_types = st.sampled_from(["volume", "database", "objectstorage"])
# Unknown keys of pass-through documents: prefixed so they never spell a known field.
extra_keys = st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=8).map(lambda k: "x_" + k)

json_values: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**60), 2**60)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


# --- backup ---------------------------------------------------------------------------------------

_segments = st.text(
    st.characters(exclude_categories=_NO_SURROGATES, exclude_characters="/\x00"),
    min_size=1,
    max_size=8,
).filter(lambda s: s not in (".", ".."))
archive_paths = st.lists(_segments, min_size=1, max_size=4).map("/".join)

archive_objects = st.fixed_dictionaries(
    {"path": archive_paths, "size": safe_naturals, "sha256": sha256s}
)


@st.composite
def archive_manifests(draw: st.DrawFn) -> dict[str, Any]:
    """`{objects, ...extras}` with unique paths."""
    objects = draw(st.lists(archive_objects, max_size=4, unique_by=lambda o: o["path"]))
    extras = draw(st.dictionaries(extra_keys, json_values, max_size=2))
    return {"objects": objects, **extras}


# --- isolated restore -----------------------------------------------------------------------------

# Ids that become path segments (`PathSegmentId`); also the rule of scoped ids.
path_segment_ids = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._:-]{0,20}\Z")
scoped_ids = path_segment_ids

allocation_references = st.fixed_dictionaries(
    {
        "purpose": st.just("scratch-rehearsal"),
        "rehearsalId": scoped_ids,
        "allocationId": sha256s,
        "generation": st.integers(1, MAX_SAFE_INTEGER),
        "bindingSha256": sha256s,
        "receiptSha256": sha256s,
    }
)

_volume_mappings = st.fixed_dictionaries(
    {
        "id": path_segment_ids,
        "type": st.just("volume"),
        "source": st.fixed_dictionaries(
            {"snapshotId": path_segment_ids, "volumeName": identifiers, "mountPath": identifiers}
        ),
        "target": st.fixed_dictionaries({"volumeName": identifiers, "mountPath": identifiers}),
    }
)
_database_mappings = st.fixed_dictionaries(
    {
        "id": path_segment_ids,
        "type": st.just("database"),
        "source": st.fixed_dictionaries(
            {
                "snapshotId": path_segment_ids,
                "resourceName": identifiers,
                "databaseName": identifiers,
            }
        ),
        "target": st.fixed_dictionaries(
            {"resourceName": identifiers, "databaseName": identifiers},
            optional={"databaseAllocation": allocation_references},
        ),
    }
)
_object_storage_mappings = st.fixed_dictionaries(
    {
        "id": path_segment_ids,
        "type": st.just("objectstorage"),
        "source": st.fixed_dictionaries(
            {"snapshotId": path_segment_ids, "resourceName": identifiers, "bucketName": identifiers}
        ),
        "target": st.fixed_dictionaries({"resourceName": identifiers, "bucketName": identifiers}),
    }
)
resource_mappings = st.one_of(_volume_mappings, _database_mappings, _object_storage_mappings)

_verification_statuses = st.sampled_from(["pending", "running", "passed", "failed"])
_cleanup_statuses = st.sampled_from(["pending", "running", "succeeded", "failed"])

_checks = st.fixed_dictionaries(
    {"code": identifiers, "status": st.sampled_from(["passed", "failed"])},
    optional={"message": free_text},
)
_resource_verifications = st.fixed_dictionaries(
    {
        "resourceMappingId": identifiers,
        "resourceType": resource_types,
        "status": _verification_statuses,
        "checks": st.lists(_checks, max_size=2),
    },
    optional={"checkedAt": timestamps},
)
_verifications = st.fixed_dictionaries(
    {"status": _verification_statuses, "results": st.lists(_resource_verifications, max_size=2)},
    optional={"startedAt": timestamps, "completedAt": timestamps},
)
_progress_optionals: dict[str, st.SearchStrategy[Any]] = {
    "updatedAt": timestamps,
    "errorCode": free_text,
    "errorMessage": free_text,
}
_staging_progress: dict[str, st.SearchStrategy[Any]] = {
    "stagingArchiveId": identifiers,
    "status": _cleanup_statuses,
    "attempts": safe_naturals,
}
_staging_cleanups = st.fixed_dictionaries(_staging_progress, optional=_progress_optionals)
_cleanups = st.fixed_dictionaries(
    {
        "resources": st.lists(
            st.fixed_dictionaries(
                {
                    "resourceMappingId": identifiers,
                    "resourceType": resource_types,
                    "status": _cleanup_statuses,
                    "attempts": safe_naturals,
                },
                optional=_progress_optionals,
            ),
            max_size=2,
        ),
        "stagingArchive": _staging_cleanups,
    }
)

# The status list itself is pinned against the seed in test_isolatedrestore.py.
_node_statuses = st.sampled_from(NODE_STATUSES)

node_states = st.fixed_dictionaries(
    {
        "restoreId": identifiers,
        "clusterId": identifiers,
        "targetNodeName": identifiers,
        "sourceBackupId": identifiers,
        "sourceServiceId": identifiers,
        "scratchNamespaceId": identifiers,
        "stagingArchiveId": identifiers,
        "revision": safe_naturals,
        "status": _node_statuses,
        "completedResourceMappingIds": st.lists(identifiers, max_size=3),
        "verification": _verifications,
        "updatedAt": timestamps,
    },
    optional={
        "cleanup": _cleanups,
        "preparedAt": timestamps,
        "readyAt": timestamps,
        "lastErrorCode": free_text,
        "lastErrorMessage": free_text,
    },
)

_grants = st.text(st.characters(exclude_categories=_NO_SURROGATES), min_size=1, max_size=40)


def _routed(**more: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {
            "restoreGrant": _grants,
            "clusterId": identifiers,
            "targetNodeName": identifiers,
            "restoreId": path_segment_ids,
            **more,
        }
    )


prepare_requests = _routed(
    expectedRevision=safe_naturals,
    sourceBackupId=identifiers,
    sourceServiceId=identifiers,
    scratchNamespaceId=path_segment_ids,
    stagingArchiveId=path_segment_ids,
    resourceMappings=st.lists(resource_mappings, max_size=3, unique_by=lambda m: m["id"]),
    archiveManifest=archive_manifests(),
)
stream_markers = st.fixed_dictionaries(
    {"_isVirtualStream": st.just(True), "streamId": st.text(_TEXT, min_size=1, max_size=20)}
)
stage_requests = _routed(
    expectedRevision=safe_naturals, object=archive_objects, archive=stream_markers
)
status_requests = _routed()
execute_requests = _routed(expectedRevision=safe_naturals)
cleanup_requests = _routed(expectedRevision=safe_naturals)


# --- breaking valid data --------------------------------------------------------------------------


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every container path in `value` (the empty path is the value itself)."""
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found.extend(_paths(item, (*prefix, key)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found.extend(_paths(item, (*prefix, index)))
    return found


def _replace(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        return {**value, head: _replace(value[head], rest, new)}
    copy = list(value)
    copy[head] = _replace(value[head], rest, new)
    return copy


_breakers: st.SearchStrategy[Any] = json_values | st.text(
    st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=3
)


@st.composite
def mutated(draw: st.DrawFn, valid: st.SearchStrategy[Any]) -> Any:
    """`valid` with one random place replaced, one key dropped, or one key added."""
    value = draw(valid)
    path = draw(st.sampled_from(_paths(value)))
    kind = draw(st.sampled_from(["replace", "drop", "add"]))
    target: Any = value
    for step in path:
        target = target[step]
    if kind == "drop" and isinstance(target, dict) and target:
        key = draw(st.sampled_from(sorted(target)))
        return _replace(value, path, {k: v for k, v in target.items() if k != key})
    if kind == "add" and isinstance(target, dict):
        key = draw(st.text(max_size=12))
        return _replace(value, path, {**target, key: draw(_breakers)})
    return _replace(value, path, draw(_breakers))


_M = TypeVar("_M", bound=BaseModel)


def from_wire(model: type[_M], data: Any) -> _M:
    """Parses `data` as the wire carries it: camelCase keys only, snake_case spellings refused."""
    return model.model_validate(data, by_name=False)
