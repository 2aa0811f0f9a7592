"""The five isolated-restore handlers Cloudly calls, and `install()`, the engine's wiring.

Each handler validates the request body with its contract model (exact, camelCase only; a
pydantic `ValidationError` becomes `invalid-request` in the session, naming the field, never the
value), calls the engine, and returns the response model's wire form. Refusals are the engine's
`AgentError`s, turned into `error {text, data: {code, retryable, ...}}` by the session.

`install()` is what the composition root's hook (`agent.app.build_handlers`) calls: it opens the
revision store and the Corestore clients, runs the engine (`background.running`: `engine.run()`
in a TaskGroup held on the app's exit stack), registers the handlers, and pushes everything onto
that exit stack so shutdown closes them after the socket, engine first.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any, Protocol

from agent.contracts.base import StreamMarker
from agent.contracts.cluster import ClusterView
from agent.contracts.isolatedrestore import (
    METHOD_CLEANUP,
    METHOD_EXECUTE,
    METHOD_GET_STATUS,
    METHOD_PREPARE,
    METHOD_STAGE,
    CleanupIsolatedRestoreRequest,
    ExecuteIsolatedRestoreRequest,
    GetIsolatedRestoreStatusRequest,
    IsolatedRestoreStateResponse,
    PrepareIsolatedRestoreRequest,
    StageIsolatedRestoreArchiveRequest,
)
from agent.corestore.client import CorestoreClients, CorestoreTimeouts
from agent.restore.background import running
from agent.restore.engine import IsolatedRestoreEngine
from agent.restore.settings import EngineSettings
from agent.restore.staging import ByteSource
from agent.retry import RetryPolicy
from agent.session.peer import Handler, Router
from agent.store import RevisionStore

if TYPE_CHECKING:
    from agent.config import Config, Secrets

__all__ = ["StreamContext", "build_handlers", "install", "register_handlers"]


class StreamContext(Protocol):
    """What a handler needs of the session's `RequestContext`: the streams of its request."""

    def receive_stream(self, marker: StreamMarker) -> Any: ...


Body = Mapping[str, Any]


def build_handlers(engine: IsolatedRestoreEngine) -> dict[str, Handler]:
    """The handlers by method name, bound to `engine`."""

    async def prepare(request: Body, ctx: StreamContext) -> Body:
        model = PrepareIsolatedRestoreRequest.model_validate(dict(request), by_name=False)
        return IsolatedRestoreStateResponse(state=await engine.prepare(model)).to_wire()

    async def stage(request: Body, ctx: StreamContext) -> Body:
        model = StageIsolatedRestoreArchiveRequest.model_validate(dict(request), by_name=False)

        def open_source() -> ByteSource:
            source: ByteSource = ctx.receive_stream(model.archive)
            return source

        return IsolatedRestoreStateResponse(state=await engine.stage(model, open_source)).to_wire()

    async def status(request: Body, ctx: StreamContext) -> Body:
        model = GetIsolatedRestoreStatusRequest.model_validate(dict(request), by_name=False)
        return (await engine.status(model)).to_wire()

    async def execute(request: Body, ctx: StreamContext) -> Body:
        model = ExecuteIsolatedRestoreRequest.model_validate(dict(request), by_name=False)
        return IsolatedRestoreStateResponse(state=await engine.execute(model)).to_wire()

    async def cleanup(request: Body, ctx: StreamContext) -> Body:
        model = CleanupIsolatedRestoreRequest.model_validate(dict(request), by_name=False)
        return IsolatedRestoreStateResponse(state=await engine.cleanup(model)).to_wire()

    return {
        METHOD_PREPARE: prepare,
        METHOD_STAGE: stage,
        METHOD_GET_STATUS: status,
        METHOD_EXECUTE: execute,
        METHOD_CLEANUP: cleanup,
    }


def register_handlers(router: Router, engine: IsolatedRestoreEngine) -> None:
    """Register the five handlers on the session's router."""
    for method, handler in build_handlers(engine).items():
        router.register(method, handler)


class Session(Protocol):
    """What `install()` needs of the Cloudly session."""

    @property
    def router(self) -> Router: ...

    @property
    def cluster_view(self) -> ClusterView | None: ...


async def install(
    *,
    config: Config,
    secrets: Secrets,
    session: Session,
    resources: AsyncExitStack,
) -> IsolatedRestoreEngine:
    """Open the store and the Corestore clients, start the engine, register its handlers."""
    store = await RevisionStore.open(config.state.directory)
    resources.push_async_callback(store.aclose)
    corestore = config.corestore
    settings = EngineSettings.from_config(corestore)
    clients = CorestoreClients(
        timeouts=CorestoreTimeouts(
            connect=corestore.connect_timeout_s,
            control=corestore.request_timeout_s,
            transfer=settings.transfer_timeout,
        ),
        retry=RetryPolicy(attempts=corestore.retries + 1),
    )
    resources.push_async_callback(clients.close)
    engine = IsolatedRestoreEngine(
        store=store,
        clients=clients,
        credential=secrets.corestore_credential,
        cluster_view=lambda: session.cluster_view,
        settings=settings,
    )
    await resources.enter_async_context(running(engine))
    register_handlers(session.router, engine)
    return engine
