"""The five isolated-restore routes Cloudly calls, bound to one engine.

Each route names its exact request model (camelCase only; a body that fails it is refused with
`invalid-request` naming the field, never the value, before the engine sees it) and answers the
response model. A stage is a stream request (`agent.protocol.admission`), the rest control.
Refusals are the engine's `AgentError`s, turned into `error {text, data: {code,
retryable, ...}}` by the session.
"""

from __future__ import annotations

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
    IsolatedRestoreStatusResponse,
    PrepareIsolatedRestoreRequest,
    StageIsolatedRestoreArchiveRequest,
)
from agent.protocol.admission import stream_class
from agent.protocol.handlers import ByteSource, RequestContext, Route, Routes
from agent.restore.engine import IsolatedRestoreEngine

__all__ = ["isolated_restore_routes"]


def isolated_restore_routes(engine: IsolatedRestoreEngine) -> Routes:
    """The routes of prepare, stage, get-status, execute and cleanup, served by `engine`."""

    async def prepare(
        request: PrepareIsolatedRestoreRequest, ctx: RequestContext
    ) -> IsolatedRestoreStateResponse:
        return IsolatedRestoreStateResponse(state=await engine.prepare(request))

    async def stage(
        request: StageIsolatedRestoreArchiveRequest, ctx: RequestContext
    ) -> IsolatedRestoreStateResponse:
        def open_source() -> ByteSource:
            return ctx.receive_stream(request.archive)

        def hold_source() -> None:
            ctx.hold_stream(request.archive)

        state = await engine.stage(request, open_source, hold_source=hold_source)
        return IsolatedRestoreStateResponse(state=state)

    async def status(
        request: GetIsolatedRestoreStatusRequest, ctx: RequestContext
    ) -> IsolatedRestoreStatusResponse:
        return await engine.status(request)

    async def execute(
        request: ExecuteIsolatedRestoreRequest, ctx: RequestContext
    ) -> IsolatedRestoreStateResponse:
        return IsolatedRestoreStateResponse(state=await engine.execute(request))

    async def cleanup(
        request: CleanupIsolatedRestoreRequest, ctx: RequestContext
    ) -> IsolatedRestoreStateResponse:
        return IsolatedRestoreStateResponse(state=await engine.cleanup(request))

    return Routes(
        [
            Route(METHOD_PREPARE, PrepareIsolatedRestoreRequest, prepare),
            # A stage carries its object's stream, or waits its node's turn to: stream class.
            Route(
                METHOD_STAGE,
                StageIsolatedRestoreArchiveRequest,
                stage,
                admission=stream_class("targetNodeName"),
            ),
            Route(
                METHOD_GET_STATUS,
                GetIsolatedRestoreStatusRequest,
                status,
                answer_now=engine.status_now,
            ),
            Route(METHOD_EXECUTE, ExecuteIsolatedRestoreRequest, execute),
            Route(METHOD_CLEANUP, CleanupIsolatedRestoreRequest, cleanup),
        ]
    )
