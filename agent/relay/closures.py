"""Database closures, both directions, in bounded chunks with sha256 verified before anything
counts.

Relay -> Cloudly (`send_closure`, `backupServiceDatabaseClosure`; the agent initiates and sends):

1. Corestore's export descriptor (`size`, `sha256`, `receipt`) is read and validated
   (`DatabaseClosureDescriptor`) before any byte moves;
2. the call goes out with the marker of a stream the agent sends, and exactly `size` bytes
   follow, read from Corestore in ranged reads of `chunk_size`, hashed as they pass;
3. a read that answers fewer or more bytes than asked (a short export), bytes past `size` (a
   long export, found by one probe read at `size`) or a digest other than the descriptor's (an
   altered export) fails with `IntegrityError`, and the stream is aborted **without** its closing
   bit, so Cloudly never holds a complete closure;
4. confirmation: `accepted: true` only permits sending (seed 001). Cloudly holds the bytes once
   the stream's own completion says so: `ByteSink.close()` returns only after the responder
   acknowledged the closing bit, after every chunk before it. The closure counts as backed up
   when both hold — the closing bit acknowledged and `accepted: true` — in whichever order
   they come (our stand-in answers after draining, a TypedRequest handler may answer first).
   `accepted: false` is `ClosureNotAccepted`; an error answer is Cloudly's `CallFailed`.

Cloudly -> relay (`receive_closure`, `restoreServiceDatabaseClosure`; the agent initiates and
reads): Cloudly answers the descriptor and the marker of a stream it serves. The agent opens the
Corestore import from the descriptor first (Corestore checks the receipt), then drains the
stream into it in `chunk_size` chunks (each PUT carries its sha256), refusing the stream (at the
latest a chunk's worth of bytes later) once it brings more than `size` bytes: no byte past
`size` is sent; at the end it checks the length and the whole sha256 and only then
asks Corestore to commit (Corestore re-hashes and replaces the database in one step). The
import id is the run's idempotency key: Corestore commits it once, and a commit whose outcome
is unknown is confirmed by the import's state, never sent twice. Any other failure aborts the
import: the database stays as it was. A responder that cannot serve a stream
in its response (typedrequest 3.3.0 echoes our `read`) fails fast as `StreamNotServed`.

Both directions hash with `agent.transfers.chunking.Digests` (large pieces in a worker thread, off
the
event loop) and the import cuts its chunks with `agent.transfers.chunking.rechunk`, as staging does.

Both draw from the agent's byte budget through the transfer's share of it (`draws`): the import
assembles its chunks in buffers drawn from it (`ChunkBuffers`, as staging does); the export
draws each read's length before it reads from Corestore and gives it back once the piece is
queued on the stream (the stream's window, `[streams] window`, bounds what waits there). A draw
that waits is backpressure: nothing is read meanwhile.

Neither direction can pin its job, and no deadline grows with the closure's size: every wait on
the stream is bounded by the session's stall deadline (`agent.session.streams`, `[streams]
stall_timeout_s`: no byte moved for that long), so a Cloudly that keeps the stream alive but
stops reading (never drains a backup) or stops sending makes the sink or the source raise
`StreamBroken`, which aborts the stream (and the import) here like any broken stream: the job
fails `transfer-interrupted`. The backup call carries no deadline of its own while its stream
moves (Cloudly may answer only once it drained it: a deadline on the call would bound the
closure's size); once the closing bit is acknowledged Cloudly has `answer_timeout` seconds to
answer, on `clock`, else `transfer-interrupted` too (nothing confirmed the backup). The restore
call is a single request (its answer is the descriptor and a marker): `answer_timeout` bounds
it. Each Corestore call is bounded by the client's own timeouts.

A closure's call and its stream travel on one connection: `cloudly` is the connection the
closure was given when it started (`CloudlySession.connection()`), never the session's
connection of the moment. A reconnect in between (the closure call answered, the session
dropped while Corestore opened the import) therefore breaks the transfer, `StreamBroken`
(retryable), rather than asking the new connection for a stream it never saw. The end of the
session anywhere in a transfer is `StreamBroken` likewise.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol, TypeVar

import structlog
from pydantic import ValidationError

from agent.clock import Clock
from agent.contracts.base import StreamMarker, first_problem
from agent.contracts.relay import (
    METHOD_BACKUP_SERVICE_DATABASE_CLOSURE,
    METHOD_RESTORE_SERVICE_DATABASE_CLOSURE,
    BackupServiceDatabaseClosureRequest,
    BackupServiceDatabaseClosureResponse,
    DatabaseClosureDescriptor,
    RestoreServiceDatabaseClosureRequest,
    RestoreServiceDatabaseClosureResponse,
)
from agent.corestore.client import CorestoreClient
from agent.domain.outcomes import ClosureFacts
from agent.errors import (
    ClosureNotAccepted,
    CorestoreUnavailable,
    IntegrityError,
    RemoteProtocolError,
    SessionClosed,
    StreamBroken,
    StreamNotServed,
)
from agent.protocol.connection import MAX_CHUNK
from agent.protocol.handlers import ByteSink, ByteSource, Caller
from agent.transfers.chunking import ChunkBuffers, Digests, Draws, rechunk

__all__ = ["CloudlyCalls", "Progress", "committed_import", "receive_closure", "send_closure"]

_log = structlog.get_logger("agent.relay.closures")

Progress = Callable[[int, int], None]
"""Called with (bytes done, bytes in all) after every chunk."""


class CloudlyCalls(Caller, Protocol):
    """What the closures need of the session with Cloudly (`CloudlySession` has it): its calls
    and its streams."""

    def open_send_stream(self) -> tuple[StreamMarker, ByteSink]: ...

    def receive_stream(self, marker: StreamMarker) -> ByteSource: ...


async def send_closure(
    *,
    client: CorestoreClient,
    cloudly: CloudlyCalls,
    service_id: str,
    backup_id: str,
    node_id: str,
    chunk_size: int,
    answer_timeout: float,
    clock: Clock,
    progress: Progress,
    draws: Draws | None = None,
) -> DatabaseClosureDescriptor:
    """Export the backup's closure from Corestore and stream it to Cloudly; the descriptor
    once Cloudly holds exactly those bytes (module docstring, step 4). The call has no deadline
    while the stream moves; Cloudly answers within `answer_timeout` s of `clock` after it."""
    with _interrupted_by_the_session(f"the database closure of service {service_id}"):
        return await _send_closure(
            client,
            cloudly,
            service_id,
            backup_id,
            node_id,
            chunk_size,
            (answer_timeout, clock),
            progress,
            draws,
        )


async def _send_closure(
    client: CorestoreClient,
    cloudly: CloudlyCalls,
    service_id: str,
    backup_id: str,
    node_id: str,
    chunk_size: int,
    answer_bound: tuple[float, Clock],
    progress: Progress,
    draws: Draws | None,
) -> DatabaseClosureDescriptor:
    answer_timeout, clock = answer_bound
    descriptor = await client.closure_descriptor(service_id, backup_id)
    marker, sink = cloudly.open_send_stream()
    request = BackupServiceDatabaseClosureRequest(
        backup_id=backup_id,
        service_id=service_id,
        node_id=node_id,
        descriptor=descriptor,
        closure=marker,
    )
    call = asyncio.ensure_future(
        cloudly.call(METHOD_BACKUP_SERVICE_DATABASE_CLOSURE, request.to_wire(), timeout=None)
    )
    closed = False
    try:
        await _pump_export(
            client, sink, call, service_id, backup_id, descriptor, chunk_size, progress, draws
        )
        await sink.close()  # returns once Cloudly acknowledged the closing bit
        closed = True
        answer = _parse(
            BackupServiceDatabaseClosureResponse,
            await _answer_after_stream(call, clock, answer_timeout, service_id, backup_id),
        )
    except BaseException as exc:
        if not closed:
            with contextlib.suppress(Exception):
                await asyncio.shield(sink.abort())
        refusal = call.exception() if call.done() and not call.cancelled() else None
        if refusal is not None and isinstance(exc, StreamBroken):
            # The stream broke because Cloudly refused: its answer says why. Our own findings
            # (a short, long or altered export; Corestore's errors) stay what we raise.
            raise refusal from exc
        call.cancel()
        # Wait for the call to end without taking on its outcome: `asyncio.wait` raises only
        # this task's own cancellation (the job stopped meanwhile), which must win.
        await asyncio.wait({call})
        if not call.cancelled():
            call.exception()  # retrieved: its outcome no longer matters
        raise
    if not answer.accepted:
        raise ClosureNotAccepted(
            f"Cloudly did not accept the database closure of service {service_id} for backup "
            f"{backup_id}"
        )
    return descriptor


async def _answer_after_stream(
    call: asyncio.Future[dict[str, Any]],
    clock: Clock,
    answer_timeout: float,
    service_id: str,
    backup_id: str,
) -> dict[str, Any]:
    """Cloudly's answer to the backup call, due within `answer_timeout` s now that its stream
    is over; `StreamBroken` (transfer-interrupted) if it does not come: nothing confirmed it."""
    try:
        async with clock.timeout(answer_timeout):
            return await call
    except TimeoutError:  # this deadline's own; the call's timeout would be `CallTimeout`
        raise StreamBroken(
            f"Cloudly did not answer the database closure of service {service_id} for backup "
            f"{backup_id} within {answer_timeout:g} s after its stream ended"
        ) from None


async def _pump_export(
    client: CorestoreClient,
    sink: ByteSink,
    call: asyncio.Future[dict[str, Any]],
    service_id: str,
    backup_id: str,
    descriptor: DatabaseClosureDescriptor,
    chunk_size: int,
    progress: Progress,
    draws: Draws | None,
) -> None:
    size, digests, offset = descriptor.size, Digests(), 0
    what = f"the database closure of service {service_id} for backup {backup_id}"
    # One read is one stream chunk: the bytes pass through without being cut or joined, and
    # memory stays the stream window plus one chunk.
    read_size = min(chunk_size, MAX_CHUNK)
    while offset < size:
        want = min(read_size, size - offset)
        if draws is not None:
            await draws.take(want)
        try:
            await _export_piece(
                client, sink, call, what, (service_id, backup_id), offset, want, size, digests
            )
        finally:
            if draws is not None:
                draws.give(want)
        offset += want
        progress(offset, size)
    if await client.read_closure(service_id, backup_id, size, 1):
        raise IntegrityError(
            f"Corestore's export of {what} is longer than its descriptor's {size} bytes"
        )
    if digests.hexdigest() != descriptor.sha256:
        raise IntegrityError(f"Corestore's export of {what} does not match its descriptor's sha256")


async def _export_piece(
    client: CorestoreClient,
    sink: ByteSink,
    call: asyncio.Future[dict[str, Any]],
    what: str,
    ids: tuple[str, str],
    offset: int,
    want: int,
    size: int,
    digests: Digests,
) -> None:
    """Read `want` bytes of the export at `offset`, hash them and queue them on the stream."""
    data = await client.read_closure(*ids, offset, want)
    if len(data) != want:
        shorter = len(data) < want
        raise IntegrityError(
            f"Corestore's export of {what} answered {len(data)} bytes at offset {offset} "
            f"where {want} were asked ({'shorter' if shorter else 'longer'} than its "
            f"descriptor's {size} bytes)"
        )
    await digests.add(data)
    if call.done():
        # Cloudly answered before the end: an error or `accepted: false` stops the transfer
        # now; `accepted: true` early is permission, so go on.
        answer = _parse(BackupServiceDatabaseClosureResponse, call.result())
        if not answer.accepted:
            raise ClosureNotAccepted(f"Cloudly did not accept {what}")
    await sink.write(data)


async def receive_closure(
    *,
    client: CorestoreClient,
    cloudly: CloudlyCalls,
    service_id: str,
    backup_id: str,
    node_id: str,
    import_id: str,
    chunk_size: int,
    answer_timeout: float,
    progress: Progress,
    draws: Draws | None = None,
) -> DatabaseClosureDescriptor:
    """Fetch the backup's closure from Cloudly into a Corestore import and commit it; the
    descriptor once Corestore replaced the service's database with exactly those bytes."""
    with _interrupted_by_the_session(f"the database closure of service {service_id}"):
        return await _receive_closure(
            client,
            cloudly,
            service_id,
            backup_id,
            node_id,
            import_id,
            chunk_size,
            answer_timeout,
            progress,
            draws,
        )


async def _receive_closure(
    client: CorestoreClient,
    cloudly: CloudlyCalls,
    service_id: str,
    backup_id: str,
    node_id: str,
    import_id: str,
    chunk_size: int,
    answer_timeout: float,
    progress: Progress,
    draws: Draws | None,
) -> DatabaseClosureDescriptor:
    request = RestoreServiceDatabaseClosureRequest(
        backup_id=backup_id, service_id=service_id, node_id=node_id
    )
    answer = _parse(
        RestoreServiceDatabaseClosureResponse,
        await cloudly.call(
            METHOD_RESTORE_SERVICE_DATABASE_CLOSURE, request.to_wire(), timeout=answer_timeout
        ),
    )
    descriptor = answer.descriptor
    # An earlier attempt of this run may have left its import open: the stream restarts whole.
    await client.abort_closure_import(import_id)
    await client.open_closure_import(
        import_id, service_id=service_id, backup_id=backup_id, descriptor=descriptor
    )
    # One chunk filled while the one before it is PUT, both in buffers drawn from the budget;
    # the first before the stream is read (as staging does).
    buffers = ChunkBuffers(chunk_size, most=2, draws=draws)
    await buffers.prime()
    source = cloudly.receive_stream(answer.closure)
    try:
        await _pump_import(client, source, import_id, descriptor, chunk_size, progress, buffers)
        await _commit(client, import_id, descriptor)
    except BaseException as exc:
        with contextlib.suppress(Exception):
            await asyncio.shield(source.aclose())
        with contextlib.suppress(Exception):
            await asyncio.shield(client.abort_closure_import(import_id))
        if isinstance(exc, StreamNotServed):
            raise StreamNotServed(
                f"Cloudly did not serve the database closure stream of service {service_id} "
                f"for backup {backup_id}: its TypedRequest cannot stream in a response "
                "(typedrequest 3.3.0 answers no read); nothing was imported"
            ) from exc
        raise
    return descriptor


async def _commit(
    client: CorestoreClient, import_id: str, descriptor: DatabaseClosureDescriptor
) -> None:
    """Commit the import (under its key: Corestore commits it once). The commit is not resent:
    when its outcome is unknown (Corestore unavailable), the import's state says it."""
    try:
        await client.commit_closure_import(import_id, descriptor.size, descriptor.sha256)
    except CorestoreUnavailable:
        committed = await committed_import(client, import_id)
        if committed is None or committed.sha256 != descriptor.sha256:
            raise
        _log.info("closure_commit_confirmed", import_id=import_id, size=descriptor.size)


async def committed_import(client: CorestoreClient, import_id: str) -> ClosureFacts | None:
    """The closure Corestore committed under `import_id`, or None when it committed none."""
    status = await client.closure_import_status(import_id)
    if status is None or status.state != "committed" or status.sha256 is None:
        return None
    return ClosureFacts(status.size, status.sha256)


async def _pump_import(
    client: CorestoreClient,
    source: ByteSource,
    import_id: str,
    descriptor: DatabaseClosureDescriptor,
    chunk_size: int,
    progress: Progress,
    buffers: ChunkBuffers,
) -> None:
    size, digests, offset = descriptor.size, Digests(), 0
    # The agent's one re-chunker: one copy per chunk, only the chunk being filled held here,
    # so memory stays a few chunks whatever the size; no chunk past `size` bytes comes out.
    chunks = rechunk(
        source,
        chunk_size,
        limit=size,
        too_long=lambda: IntegrityError(
            f"Cloudly's closure stream is longer than its descriptor's {size} bytes"
        ),
        buffers=buffers,
    )
    try:
        async for data in chunks:
            sha256 = await digests.chunk(data)
            await client.put_closure_chunk(import_id, offset, data, sha256)
            offset += len(data)
            buffers.put_back(data)
            progress(offset, size)
    finally:
        await chunks.aclose()
    if offset != size:
        raise IntegrityError(
            f"Cloudly's closure stream ended after {offset} of its descriptor's {size} bytes"
        )
    if digests.hexdigest() != descriptor.sha256:
        raise IntegrityError("Cloudly's closure stream does not match its descriptor's sha256")


@contextlib.contextmanager
def _interrupted_by_the_session(what: str) -> Iterator[None]:
    """The session's end during a transfer is the transfer's interruption (retryable): its
    call and its stream were on that connection, and neither moves to the next one."""
    try:
        yield
    except SessionClosed as exc:
        raise StreamBroken(
            f"the session with Cloudly closed during the transfer of {what}: {exc}"
        ) from exc


_Answer = TypeVar(
    "_Answer", BackupServiceDatabaseClosureResponse, RestoreServiceDatabaseClosureResponse
)


def _parse(model: type[_Answer], body: Mapping[str, Any]) -> _Answer:
    try:
        return model.from_wire(body)
    except ValidationError as exc:
        field, reason = first_problem(exc, root="response")
        raise RemoteProtocolError(
            f"Cloudly answered with a body of another shape: {field}: {reason}"
        ) from None
