"""The reference Corestore's HTTP handlers of the relay's service routes (`routes.py`'s second
family): parse, call `Services` in a worker thread, answer. The server's middleware (auth,
faults, error answers) wraps them as it wraps every route.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from aiohttp import web

from agent.corestore import routes
from agent.corestore.models import CommitObjectBody
from agent.corestore.routes import LIST_PAGE_LIMIT, RouteName
from agent.corestore.service_models import (
    ArchivePruneBody,
    ClosureImportBody,
    ServiceBackupBody,
    ServiceRestoreBody,
)
from agent.corestore.shapes import MAX_CHUNK_SIZE, id_problem, sha256_problem
from devstack.corestore.services import Services
from devstack.corestore.storage import refuse

__all__ = ["TRUNCATE", "page_query", "path_id", "read_chunk", "service_handlers"]

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# How many bytes the "truncate" fault drops: of a chunk's body, or of a closure read's answer.
TRUNCATE = web.RequestKey("truncate", int)


def path_id(request: web.Request, key: str) -> str:
    """The path segment `key`, checked as an identifier (`400 invalid-request` otherwise)."""
    value = request.match_info[key]
    problem = id_problem(value)
    if problem:
        raise refuse(400, "invalid-request", f"{key} {problem}")
    return value


def _count(request: web.Request, key: str, *, minimum: int = 0) -> int:
    text = request.query.get(key, "")
    if not text.isascii() or not text.isdigit() or len(text) > 16 or int(text) < minimum:
        raise refuse(400, "invalid-request", f"{key} must be an integer >= {minimum}")
    return int(text)


async def read_chunk(request: web.Request) -> tuple[str, bytes]:
    """A chunk PUT's declared sha256 and its body, checked as every chunk route checks them
    (the "truncate" fault applied): `400`, `411` or `413` otherwise."""
    sha256 = request.headers.get(routes.HEADER_CHUNK_SHA256, "")
    problem = sha256_problem(sha256)
    if problem:
        raise refuse(400, "invalid-request", f"{routes.HEADER_CHUNK_SHA256} {problem}")
    length = request.content_length
    if length is None:
        raise refuse(411, "length-required", "a chunk needs a Content-Length")
    if not 0 < length <= MAX_CHUNK_SIZE:
        raise refuse(413, "chunk-too-large", f"a chunk holds 1 to {MAX_CHUNK_SIZE} bytes")
    data = await request.read()
    if request[TRUNCATE]:
        data = data[: max(0, len(data) - request[TRUNCATE])]
    return sha256, data


def page_query(request: web.Request) -> tuple[str | None, int]:
    """A listing's `after` (an id, or None) and `limit` (1 .. LIST_PAGE_LIMIT, default it)."""
    after = request.query.get("after")
    if after is not None and id_problem(after):
        raise refuse(400, "invalid-request", f"after {id_problem(after)}")
    limit = _count(request, "limit", minimum=1) if "limit" in request.query else LIST_PAGE_LIMIT
    if limit > LIST_PAGE_LIMIT:
        raise refuse(400, "invalid-request", f"limit must be at most {LIST_PAGE_LIMIT}")
    return after, limit


def service_handlers(services: Services) -> dict[RouteName, _Handler]:
    """The handler of every service route."""

    async def backup(request: web.Request) -> web.Response:
        service_id, backup_id = path_id(request, "serviceId"), path_id(request, "backupId")
        body = ServiceBackupBody.model_validate_json(await request.read())
        # Shielded: a client that disconnects mid-backup must not cut the archive's rename.
        record, created = await asyncio.shield(
            asyncio.to_thread(services.backup, service_id, backup_id, body)
        )
        return web.json_response(record, status=201 if created else 200)

    async def record(request: web.Request) -> web.Response:
        service_id, backup_id = path_id(request, "serviceId"), path_id(request, "backupId")
        return web.json_response(await asyncio.to_thread(services.record, service_id, backup_id))

    async def restore(request: web.Request) -> web.Response:
        service_id, key = path_id(request, "serviceId"), path_id(request, "restoreKey")
        body = ServiceRestoreBody.model_validate_json(await request.read())
        answer, applied = await asyncio.to_thread(services.restore, service_id, key, body)
        return web.json_response(answer, status=201 if applied else 200)

    async def restore_status(request: web.Request) -> web.Response:
        service_id, key = path_id(request, "serviceId"), path_id(request, "restoreKey")
        return web.json_response(await asyncio.to_thread(services.restore_record, service_id, key))

    async def archive_list(request: web.Request) -> web.Response:
        return web.json_response(await asyncio.to_thread(services.listing))

    async def archive_prune(request: web.Request) -> web.Response:
        body = ArchivePruneBody.model_validate_json(await request.read())
        return web.json_response(await asyncio.to_thread(services.prune, body))

    async def descriptor(request: web.Request) -> web.Response:
        service_id, backup_id = path_id(request, "serviceId"), path_id(request, "backupId")
        answer = await asyncio.to_thread(services.descriptor, service_id, backup_id)
        return web.json_response(answer)

    async def read(request: web.Request) -> web.Response:
        service_id, backup_id = path_id(request, "serviceId"), path_id(request, "backupId")
        offset = _count(request, "offset")
        length = _count(request, "length", minimum=1)
        if length > MAX_CHUNK_SIZE:
            raise refuse(400, "invalid-request", f"length must be at most {MAX_CHUNK_SIZE}")
        data = await asyncio.to_thread(services.read_closure, service_id, backup_id, offset, length)
        if request[TRUNCATE]:
            data = data[: max(0, len(data) - request[TRUNCATE])]
        return web.Response(body=data, content_type="application/octet-stream")

    async def open_import(request: web.Request) -> web.Response:
        import_id = path_id(request, "importId")
        body = ClosureImportBody.model_validate_json(await request.read())
        status, created = await asyncio.to_thread(services.open_import, import_id, body)
        return web.json_response(status, status=201 if created else 200)

    async def put_chunk(request: web.Request) -> web.Response:
        import_id = path_id(request, "importId")
        offset = _count(request, "offset")
        sha256, data = await read_chunk(request)
        answer = await asyncio.to_thread(services.put_import_chunk, import_id, offset, data, sha256)
        return web.json_response(answer)

    async def commit(request: web.Request) -> web.Response:
        import_id = path_id(request, "importId")
        body = CommitObjectBody.model_validate_json(await request.read())
        # Shielded: the database is replaced whole or not at all, whatever the client does.
        answer = await asyncio.shield(
            asyncio.to_thread(services.commit_import, import_id, body.size, body.sha256)
        )
        return web.json_response(answer)

    async def import_status(request: web.Request) -> web.Response:
        import_id = path_id(request, "importId")
        return web.json_response(await asyncio.to_thread(services.import_status, import_id))

    async def abort(request: web.Request) -> web.Response:
        await asyncio.to_thread(services.abort_import, path_id(request, "importId"))
        return web.json_response({"deleted": True})

    async def list_imports(request: web.Request) -> web.Response:
        after, limit = page_query(request)
        return web.json_response(await asyncio.to_thread(services.import_listing, after, limit))

    return {
        RouteName.CLOSURE_IMPORT_LIST: list_imports,
        RouteName.SERVICE_BACKUP: backup,
        RouteName.BACKUP_RECORD: record,
        RouteName.SERVICE_RESTORE: restore,
        RouteName.SERVICE_RESTORE_STATUS: restore_status,
        RouteName.ARCHIVE_LIST: archive_list,
        RouteName.ARCHIVE_PRUNE: archive_prune,
        RouteName.CLOSURE_DESCRIPTOR: descriptor,
        RouteName.CLOSURE_READ: read,
        RouteName.CLOSURE_IMPORT: open_import,
        RouteName.CLOSURE_IMPORT_CHUNK: put_chunk,
        RouteName.CLOSURE_IMPORT_COMMIT: commit,
        RouteName.CLOSURE_IMPORT_ABORT: abort,
        RouteName.CLOSURE_IMPORT_STATUS: import_status,
    }
