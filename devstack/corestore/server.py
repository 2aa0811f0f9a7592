"""The reference Corestore's HTTP side: exactly the routes of `agent/corestore/routes.py`.

One middleware does for every route what docs/corestore-api.md promises: count the hit, apply
the test's faults, check the bearer (401) and the grant's presence and compact-JWS shape (403 —
the signature, claims and expiry are NOT verified here; a real Corestore does), and turn a
`CorestoreRefused` from the disk layer into `{error: {code, message}}` (and a full disk,
ENOSPC or EDQUOT from any handler, into `507 storage-full`). Handlers only parse,
call `Storage`/`Scratch` in a worker thread and answer. Neither the bearer nor the grant is ever
logged: aiohttp's access log is off and our own lines name the route and status only.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hmac
import json
from collections.abc import Awaitable, Callable
from typing import Any

import structlog
from aiohttp import web
from pydantic import ValidationError

from agent.corestore import routes
from agent.corestore.models import CommitObjectBody, PrepareRestoreBody
from agent.corestore.routes import RouteName
from agent.corestore.shapes import (
    MAX_CHUNK_SIZE,
    archive_path_problem,
    is_compact_jws,
)
from agent.errors import CorestoreRefused
from agent.secret import Secret
from devstack.corestore.faults import Faults
from devstack.corestore.scratch import Scratch
from devstack.corestore.service_routes import (
    TRUNCATE,
    page_query,
    path_id,
    read_chunk,
    service_handlers,
)
from devstack.corestore.services import Services
from devstack.corestore.storage import Storage, refuse

__all__ = ["Bearer", "Jobs", "create_app"]

_log = structlog.get_logger("devstack.corestore")
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error(status: int, code: str, message: str) -> web.Response:
    response = web.json_response({"error": {"code": code, "message": message}}, status=status)
    if status == 401:
        response.headers["WWW-Authenticate"] = 'Bearer realm="corestore"'
    return response


class Bearer:
    """The bearer control credential the server accepts; `set()` rotates it at runtime (the
    next request must carry the new one), as an operator rotating Corestore's token would."""

    __slots__ = ("_current", "rotations")

    def __init__(self, initial: Secret) -> None:
        self._current = initial
        self.rotations = 0

    @property
    def current(self) -> Secret:
        """The accepted credential."""
        return self._current

    def set(self, value: Secret) -> None:
        """Accept `value` from now on, and nothing else."""
        self._current = value
        self.rotations += 1


def _bearer_ok(header: str | None, bearer: Secret) -> bool:
    # Its own frame, so no handler frame ever holds the presented credential.
    expected = ("Bearer " + bearer.reveal()).encode()
    return header is not None and hmac.compare_digest(header.encode(), expected)


def _grant_problem(header: str | None) -> tuple[str, str] | None:
    if header is None:
        return "grant-missing", "the restore grant header is missing"
    if not is_compact_jws(header):
        return "grant-malformed", "the restore grant is not a compact JWS"
    return None


class Jobs:
    """The running resource restores: owned here, cancelled and awaited on stop."""

    def __init__(self, scratch: Scratch, faults: Faults) -> None:
        self._scratch, self._faults = scratch, faults
        self._tasks: dict[tuple[str, str], asyncio.Task[None]] = {}

    def start(self, restore_id: str, mapping_id: str, generation: int) -> None:
        """Run the restore of one mapping (after the faults' restore gate opens)."""
        key = (restore_id, mapping_id)
        task = asyncio.create_task(self._run(restore_id, mapping_id, generation))
        self._tasks[key] = task
        task.add_done_callback(lambda done: self._forget(key, done))

    def cancel(self, restore_id: str, mapping_id: str) -> None:
        """Stop waiting for the restore of one mapping (its run is void once deleted)."""
        task = self._tasks.get((restore_id, mapping_id))
        if task is not None:
            task.cancel()

    async def close(self) -> None:
        """Cancel every job and wait for them."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self, restore_id: str, mapping_id: str, generation: int) -> None:
        await self._faults.restore_gate.wait()
        await asyncio.to_thread(self._scratch.run, restore_id, mapping_id, generation)

    def _forget(self, key: tuple[str, str], done: asyncio.Task[None]) -> None:
        if self._tasks.get(key) is done:
            del self._tasks[key]
        # Retrieve the outcome here: nobody awaits a finished job.
        if not done.cancelled() and done.exception() is not None:
            _log.error("corestore.restore-job-failed", error=type(done.exception()).__name__)


async def _until_either(first: asyncio.Event, second: asyncio.Event) -> None:
    """Wait until one of the two events is set."""
    if first.is_set() or second.is_set():
        return
    waits = {asyncio.create_task(first.wait()), asyncio.create_task(second.wait())}
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
        await asyncio.gather(*waits, return_exceptions=True)


def create_app(
    storage: Storage,
    scratch: Scratch,
    jobs: Jobs,
    faults: Faults,
    bearer: Bearer,
    services: Services | None = None,
) -> web.Application:
    """The reference Corestore as an aiohttp application."""
    stopping = asyncio.Event()

    @web.middleware
    async def control(request: web.Request, handler: _Handler) -> web.StreamResponse:
        route = _route_of(request)
        if route is None:  # unknown path or method: aiohttp's own 404/405
            return await handler(request)
        faults.hits[route] += 1
        spec = routes.ROUTES[route]
        rule = faults.take(route)
        kind = rule.kind if rule is not None else None
        if rule is not None and kind == "delay":
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(rule.seconds):
                    await stopping.wait()
        if rule is not None and kind == "status":
            return _error(rule.status, rule.code, "fault injected by the test")
        if rule is not None and kind == "reset" and not rule.after:
            return _abort(request)
        if spec.authenticated and not _bearer_ok(
            request.headers.get(routes.HEADER_AUTHORIZATION), bearer.current
        ):
            return _error(401, "unauthorized", "a valid bearer control credential is required")
        if spec.grant:
            problem = _grant_problem(request.headers.get(routes.HEADER_RESTORE_GRANT))
            if problem is not None:
                return _error(403, *problem)
        request[TRUNCATE] = rule.drop_bytes if rule is not None and kind == "truncate" else 0
        if rule is not None and rule.hold is not None:
            rule.hold.arrived.set()
            await _until_either(rule.hold.gate, stopping)
        if route is RouteName.PREPARE_RESTORE and not faults.prepare_gate.is_set():
            faults.prepare_held.set()
            await _until_either(faults.prepare_gate, stopping)
        try:
            response = await (_full_disk(request) if kind == "disk-full" else handler(request))
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            # What this Corestore answers when its disk is full (docs/corestore-api.md).
            response = _error(507, routes.STORAGE_FULL_CODE, "no space left on the node's disk")
        except CorestoreRefused as exc:
            response = _error(exc.data["httpStatus"], exc.data["corestoreCode"], exc.message)
        except ValidationError as exc:
            first = exc.errors(include_url=False, include_input=False)[0]
            where = ".".join(str(part) for part in first["loc"]) or "body"
            response = _error(400, "invalid-request", f"{where}: {first['msg']}")
        faults.handled[route] += 1
        if rule is not None and kind == "reset":
            return _abort(request)
        if kind == "wrong-digest" and isinstance(response, web.Response):
            response = _lie_about_digest(response)
        _log.debug("corestore.answer", route=str(route), status=response.status)
        return response

    async def on_shutdown(_: web.Application) -> None:
        stopping.set()
        await jobs.close()

    app = web.Application(middlewares=[control], client_max_size=MAX_CHUNK_SIZE + 64 * 1024)
    services = services if services is not None else Services(storage.root)
    handlers = _Handlers(storage, scratch, jobs).by_route() | service_handlers(services)
    for name, spec in routes.ROUTES.items():
        app.router.add_route(spec.method, spec.template, handlers[name])
    app.on_shutdown.append(on_shutdown)
    return app


_INDEX: dict[tuple[str, str], RouteName] = {
    (spec.method, spec.template): name for name, spec in routes.ROUTES.items()
}


def _route_of(request: web.Request) -> RouteName | None:
    resource = request.match_info.route.resource
    return None if resource is None else _INDEX.get((request.method, resource.canonical))


async def _full_disk(request: web.Request) -> web.Response:
    """The handling of a request on a full disk (the `disk-full` fault)."""
    del request
    raise OSError(errno.ENOSPC, "No space left on device (fault injected)")


def _abort(request: web.Request) -> web.Response:
    assert request.transport is not None
    request.transport.abort()
    return web.Response(status=500)  # never reaches the client


def _lie_about_digest(response: web.Response) -> web.Response:
    assert isinstance(response.body, bytes)
    payload = json.loads(response.body)
    if "sha256" in payload:
        first = "1" if payload["sha256"].startswith("0") else "0"
        payload["sha256"] = first + payload["sha256"][1:]
    return web.json_response(payload, status=response.status)


def _object_path(request: web.Request) -> str:
    path = request.query.get("path")
    problem = "is required" if path is None else archive_path_problem(path)
    if problem or path is None:
        raise refuse(400, "invalid-request", f"path {problem}")
    return path


def _offset(request: web.Request) -> int:
    text = request.query.get("offset", "")
    if not text.isascii() or not text.isdigit() or len(text) > 16:
        raise refuse(400, "invalid-request", "offset must be a non-negative integer")
    return int(text)


class _Handlers:
    """One coroutine per route; the disk work runs in worker threads."""

    def __init__(self, storage: Storage, scratch: Scratch, jobs: Jobs) -> None:
        self._storage, self._scratch, self._jobs = storage, scratch, jobs

    def by_route(self) -> dict[RouteName, _Handler]:
        """The handler of every route."""
        return {
            RouteName.HEALTH: self.health,
            RouteName.PREPARE_RESTORE: self.prepare_restore,
            RouteName.PUT_CHUNK: self.put_chunk,
            RouteName.OBJECT_PROGRESS: self.object_progress,
            RouteName.COMMIT_OBJECT: self.commit_object,
            RouteName.DELETE_OBJECT: self.delete_object,
            RouteName.DELETE_STAGING_ARCHIVE: self.delete_staging_archive,
            RouteName.RESTORE_RESOURCE: self.restore_resource,
            RouteName.RESOURCE_STATUS: self.resource_status,
            RouteName.VERIFY_RESOURCE: self.verify_resource,
            RouteName.DELETE_RESOURCE: self.delete_resource,
            RouteName.DELETE_RESTORE: self.delete_restore,
            RouteName.RESTORE_LIST: self.list_restores,
        }

    async def list_restores(self, request: web.Request) -> web.Response:
        after, limit = page_query(request)
        return web.json_response(await asyncio.to_thread(self._scratch.listing, after, limit))

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def prepare_restore(self, request: web.Request) -> web.Response:
        restore_id = path_id(request, "restoreId")
        body = PrepareRestoreBody.model_validate_json(await request.read())
        answer, created = await asyncio.to_thread(self._storage.prepare, restore_id, body)
        return web.json_response(answer, status=201 if created else 200)

    async def put_chunk(self, request: web.Request) -> web.Response:
        archive, path = path_id(request, "stagingArchiveId"), _object_path(request)
        offset = _offset(request)
        sha256, data = await read_chunk(request)
        answer = await asyncio.to_thread(
            self._storage.put_chunk, archive, path, offset, data, sha256
        )
        return web.json_response(answer)

    async def object_progress(self, request: web.Request) -> web.Response:
        archive, path = path_id(request, "stagingArchiveId"), _object_path(request)
        return web.json_response(await asyncio.to_thread(self._storage.progress, archive, path))

    async def commit_object(self, request: web.Request) -> web.Response:
        archive, path = path_id(request, "stagingArchiveId"), _object_path(request)
        body = CommitObjectBody.model_validate_json(await request.read())
        answer = await asyncio.to_thread(
            self._storage.commit, archive, path, body.size, body.sha256
        )
        return web.json_response(answer)

    async def delete_object(self, request: web.Request) -> web.Response:
        archive, path = path_id(request, "stagingArchiveId"), _object_path(request)
        await asyncio.to_thread(self._storage.delete_object, archive, path)
        return web.json_response({"deleted": True})

    async def delete_staging_archive(self, request: web.Request) -> web.Response:
        archive = path_id(request, "stagingArchiveId")
        await asyncio.to_thread(self._storage.delete_archive, archive)
        return web.json_response({"deleted": True})

    async def restore_resource(self, request: web.Request) -> web.Response:
        restore_id, mapping_id = path_id(request, "restoreId"), path_id(request, "mappingId")
        # Marking the resource `running` and starting its job are one step: a client that
        # disconnects in between must not leave a `running` resource that no job owns.
        answer = await asyncio.shield(self._start_restore(restore_id, mapping_id))
        return web.json_response(answer, status=202 if answer["state"] == "running" else 200)

    async def _start_restore(self, restore_id: str, mapping_id: str) -> dict[str, Any]:
        answer, generation = await asyncio.to_thread(self._scratch.start, restore_id, mapping_id)
        if generation is not None:
            self._jobs.start(restore_id, mapping_id, generation)
        return answer

    async def resource_status(self, request: web.Request) -> web.Response:
        restore_id, mapping_id = path_id(request, "restoreId"), path_id(request, "mappingId")
        answer = await asyncio.to_thread(self._scratch.status, restore_id, mapping_id)
        return web.json_response(answer)

    async def verify_resource(self, request: web.Request) -> web.Response:
        restore_id, mapping_id = path_id(request, "restoreId"), path_id(request, "mappingId")
        answer = await asyncio.to_thread(self._scratch.verify, restore_id, mapping_id)
        return web.json_response(answer)

    async def delete_resource(self, request: web.Request) -> web.Response:
        restore_id, mapping_id = path_id(request, "restoreId"), path_id(request, "mappingId")
        self._jobs.cancel(restore_id, mapping_id)
        await asyncio.to_thread(self._scratch.delete, restore_id, mapping_id)
        return web.json_response({"deleted": True})

    async def delete_restore(self, request: web.Request) -> web.Response:
        restore_id = path_id(request, "restoreId")
        await asyncio.to_thread(self._scratch.forget, restore_id)
        return web.json_response({"deleted": True})
