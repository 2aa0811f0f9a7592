"""The isolated-restore routes' requests: typed arguments in, a `RouteRequest` out (pure).

`build_*` here cover health and the isolated restore (prepare, staging objects, resources,
the restore itself); `service_builders.py` builds the relay's service routes and the
reconciliation listings with the helpers below. Paths come from `routes.ROUTES`, the one table
of routes, so a builder and the reference server cannot disagree on one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote

from pydantic import BaseModel, ValidationError

from agent.contracts.base import first_problem
from agent.corestore.models import (
    ArchiveManifest,
    CommitObjectBody,
    MappingBody,
    PrepareRestoreBody,
)
from agent.corestore.routes import ROUTES, RouteName, RouteRequest, SupportsToWire
from agent.corestore.shapes import (
    check_archive_path,
    check_chunk,
    check_id,
    is_compact_jws,
)
from agent.errors import GrantInvalid, LocalProtocolError
from agent.secret import Secret

__all__ = [
    "body_of",
    "build_commit_object",
    "build_delete_object",
    "build_delete_resource",
    "build_delete_restore",
    "build_delete_staging_archive",
    "build_health",
    "build_object_progress",
    "build_prepare_restore",
    "build_put_chunk",
    "build_resource_status",
    "build_restore_resource",
    "build_verify_resource",
    "path_for",
    "request_for",
]


def path_for(template: str, **ids: str) -> str:
    """`template` with each `{key}` replaced by its id, checked and percent-encoded."""
    for key, value in ids.items():
        check_id(value, key)
        template = template.replace("{" + key + "}", quote(value, safe=""))
    return template


def _checked_grant(grant: Secret) -> Secret:
    if not is_compact_jws(grant.reveal()):
        raise GrantInvalid("the restore grant is not a compact JWS (three base64url parts)")
    return grant


def body_of(name: RouteName, build: Callable[[], BaseModel]) -> bytes:
    """The JSON body `build()` makes for route `name` (wire names, absent fields left out); a
    field it refuses is our own mistake, `LocalProtocolError` naming the field (never its
    value)."""
    try:
        model = build()
    except ValidationError as exc:
        field, reason = first_problem(exc, root="body")
        raise LocalProtocolError(f"{name} body is invalid: {field}: {reason}") from exc
    return model.model_dump_json(by_alias=True, exclude_none=True).encode()


def request_for(name: RouteName, grant: Secret | None, path: str, **kw: Any) -> RouteRequest:
    """The call of route `name` at `path`, its grant (if any) checked for a compact JWS."""
    spec = ROUTES[name]
    return RouteRequest(spec, path, grant=None if grant is None else _checked_grant(grant), **kw)


def _wire(value: Mapping[str, Any] | SupportsToWire) -> Any:
    return value.to_wire() if hasattr(value, "to_wire") else dict(value)


def build_health() -> RouteRequest:
    """`GET /health`: unauthenticated liveness."""
    return RouteRequest(ROUTES[RouteName.HEALTH], "/health")


def build_prepare_restore(
    restore_id: str,
    *,
    scratch_namespace_id: str,
    staging_archive_id: str,
    resource_mappings: list[Mapping[str, Any] | SupportsToWire],
    archive_manifest: Mapping[str, Any] | SupportsToWire,
    grant: Secret,
) -> RouteRequest:
    """`PUT /v1/isolated-restores/{restoreId}`: create the scratch namespace and staging archive."""
    body = body_of(
        RouteName.PREPARE_RESTORE,
        lambda: PrepareRestoreBody(
            scratch_namespace_id=scratch_namespace_id,
            staging_archive_id=staging_archive_id,
            resource_mappings=[MappingBody.model_validate(_wire(m)) for m in resource_mappings],
            archive_manifest=ArchiveManifest.model_validate(_wire(archive_manifest)),
        ),
    )
    return request_for(
        RouteName.PREPARE_RESTORE,
        grant,
        path_for(ROUTES[RouteName.PREPARE_RESTORE].template, restoreId=restore_id),
        body=body,
        content_type="application/json",
    )


def _object_request(
    name: RouteName, archive_id: str, path: str, grant: Secret, **kw: Any
) -> RouteRequest:
    check_archive_path(path)
    template = ROUTES[name].template
    query = {"path": path, **kw.pop("query", {})}
    return request_for(
        name, grant, path_for(template, stagingArchiveId=archive_id), query=query, **kw
    )


def build_put_chunk(
    staging_archive_id: str,
    path: str,
    offset: int,
    data: bytes | bytearray | memoryview,
    sha256: str,
    grant: Secret,
) -> RouteRequest:
    """`PUT .../objects?path=P&offset=N`: one chunk, its sha256 in `X-Serve-Zone-Chunk-Sha256`."""
    check_chunk(data, offset, sha256)
    return _object_request(
        RouteName.PUT_CHUNK,
        staging_archive_id,
        path,
        grant,
        query={"offset": str(offset)},
        body=data,
        content_type="application/octet-stream",
        chunk_sha256=sha256,
    )


def build_object_progress(staging_archive_id: str, path: str, grant: Secret) -> RouteRequest:
    """`GET .../objects?path=P`: which bytes of the object Corestore has verified."""
    return _object_request(RouteName.OBJECT_PROGRESS, staging_archive_id, path, grant)


def build_commit_object(
    staging_archive_id: str, path: str, size: int, sha256: str, grant: Secret
) -> RouteRequest:
    """`POST .../objects/commit?path=P` with `{size, sha256}` of the whole object."""
    body = body_of(RouteName.COMMIT_OBJECT, lambda: CommitObjectBody(size=size, sha256=sha256))
    return _object_request(
        RouteName.COMMIT_OBJECT,
        staging_archive_id,
        path,
        grant,
        body=body,
        content_type="application/json",
    )


def build_delete_object(staging_archive_id: str, path: str, grant: Secret) -> RouteRequest:
    """`DELETE .../objects?path=P`: remove a partial (or committed) object."""
    return _object_request(RouteName.DELETE_OBJECT, staging_archive_id, path, grant)


def build_delete_staging_archive(staging_archive_id: str, grant: Secret) -> RouteRequest:
    """`DELETE /v1/staging-archives/{stagingArchiveId}`: the whole staging archive."""
    path = path_for(
        ROUTES[RouteName.DELETE_STAGING_ARCHIVE].template, stagingArchiveId=staging_archive_id
    )
    return request_for(RouteName.DELETE_STAGING_ARCHIVE, grant, path)


def _resource_request(
    name: RouteName, restore_id: str, mapping_id: str, grant: Secret
) -> RouteRequest:
    path = path_for(ROUTES[name].template, restoreId=restore_id, mappingId=mapping_id)
    return request_for(name, grant, path)


def build_restore_resource(restore_id: str, mapping_id: str, grant: Secret) -> RouteRequest:
    """`POST .../resources/{mappingId}/restore`: start (or confirm) restoring one mapping."""
    return _resource_request(RouteName.RESTORE_RESOURCE, restore_id, mapping_id, grant)


def build_resource_status(restore_id: str, mapping_id: str, grant: Secret) -> RouteRequest:
    """`GET .../resources/{mappingId}`: where the restore of one mapping stands."""
    return _resource_request(RouteName.RESOURCE_STATUS, restore_id, mapping_id, grant)


def build_verify_resource(restore_id: str, mapping_id: str, grant: Secret) -> RouteRequest:
    """`POST .../resources/{mappingId}/verify`: run the checks on one restored resource."""
    return _resource_request(RouteName.VERIFY_RESOURCE, restore_id, mapping_id, grant)


def build_delete_resource(restore_id: str, mapping_id: str, grant: Secret) -> RouteRequest:
    """`DELETE .../resources/{mappingId}`: remove one restored scratch resource."""
    return _resource_request(RouteName.DELETE_RESOURCE, restore_id, mapping_id, grant)


def build_delete_restore(restore_id: str, grant: Secret) -> RouteRequest:
    """`DELETE /v1/isolated-restores/{restoreId}`: forget the prepared restore (the last step)."""
    path = path_for(ROUTES[RouteName.DELETE_RESTORE].template, restoreId=restore_id)
    return request_for(RouteName.DELETE_RESTORE, grant, path)
