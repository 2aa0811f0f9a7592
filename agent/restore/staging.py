"""Staging one archive object: an incoming byte stream -> bounded chunks -> Corestore, resumable.

`stage_object()` is the whole of it. Corestore is the authority on what it holds: it is asked
for the object's progress first, and

- a committed object (same size and sha256) moves no bytes: it is marked written and done;
- a partial object resumes: the incoming bytes of its verified prefix are re-chunked on the
  chunk boundaries Corestore recorded, hashed and compared with Corestore's chunk digests, and
  NOT sent again; the rest goes out from the verified offset on;
- otherwise every chunk is sent.

Chunks: the stream's pieces are re-cut into `chunk_size` chunks (the last one shorter) by the
agent's one re-chunker (`agent.transfers.chunking.rechunk`, one copy per chunk, refusing bytes past
the manifest size at once). Each is hashed together with the running whole-object digest
(`agent.transfers.chunking.Digests`: in a worker thread when large, so the event loop keeps serving
the websocket), then queued for the uploader. PUTs of one object
go one at a time in offset order, because Corestore counts only a contiguous verified prefix (a
chunk past it is refused as `offset-gap`); `max_in_flight` bounds the queue between the stream
and the uploader, so memory stays below `(max_in_flight + 2) * chunk_size` plus the stream
window. A chunk Corestore finds corrupted in transit (`IntegrityError`) is sent again, at most
`chunk_attempts` times; one it cannot take (unavailable after the client's retries) stops the
stage with `CorestoreUnavailable`, and every chunk accepted so far stays (resume).

Each accepted chunk is also recorded in the store (`record_chunk`), the agent's own record of the
progress; resuming trusts Corestore's answer, and records it does not confirm are forgotten.

The object counts as written only after the stream ended with exactly the manifest's size and
sha256 AND Corestore's commit (which re-hashes it) succeeded; then `mark_object_written`. On any
mismatch nothing counts: the partial object is deleted at Corestore, its records are forgotten
and `IntegrityError` is raised. When the reader finds the mismatch, the chunk PUT in flight is
finished first and nothing more is sent: a PUT cut mid-way could still be completed by Corestore
after the delete, leaving part of the refused bytes behind. A stream that breaks mid-way raises
`StreamBroken` after the chunks already queued were sent: they stay recorded, and the next stage
resumes after them.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import structlog

from agent.clock import Clock
from agent.contracts.backup import BackupArchiveObject
from agent.corestore.client import CorestoreClient
from agent.corestore.models import VerifiedChunk
from agent.domain.restores import RestoreKey
from agent.errors import (
    AgentError,
    CorestoreUnavailable,
    IntegrityError,
    StreamBroken,
    first_leaf,
)
from agent.protocol.handlers import ByteSource
from agent.restore.settings import EngineSettings
from agent.secret import Secret
from agent.store import RevisionStore
from agent.transfers.chunking import ChunkBuffers, Digests, Draws, rechunk
from agent.transfers.progress import ProgressPace

__all__ = ["StageOutcome", "StagingWork", "buffer_count", "stage_object"]

_log = structlog.get_logger("agent.restore.staging")


@dataclass(frozen=True, slots=True)
class StagingWork:
    """Everything one stage needs. `grant` is held only for this work."""

    client: CorestoreClient
    store: RevisionStore
    key: RestoreKey
    archive_id: str
    entry: BackupArchiveObject
    grant: Secret
    settings: EngineSettings
    clock: Clock  # its monotonic time paces the progress log, and resends wait on it
    draws: Draws | None = None  # the transfer's share of the byte budget (its buffers)
    rng: Callable[[], float] = field(default=random.random)  # U(0, 1) draws for the waits


@dataclass(frozen=True, slots=True)
class StageOutcome:
    """What one stage did."""

    sent_bytes: int  # bytes PUT to Corestore by this stage
    skipped_bytes: int  # incoming bytes Corestore already held (verified, not re-sent)
    chunks_sent: int
    stream_opened: bool  # False when Corestore already held the committed object


def buffer_count(
    size: int, chunk_size: int, verified: Sequence[VerifiedChunk], max_in_flight: int
) -> int:
    """The buffers a stage of an object of `size` bytes uses at most: `max_in_flight` chunks
    queued for Corestore and one being filled, but never more than the object has chunks (its
    `verified` ones, then `chunk_size` pieces of the rest), and at least one. An 8 MiB object in
    4 MiB chunks holds two, not five: four stages of such objects move at once in the default
    budget, where five buffers each let only two (over a far link, where each stage moves one
    chunk per round trip, two stages move half the bytes of four: docs/benchmarks.md, "Four
    stages opened at once")."""
    end = max((chunk.offset + chunk.length for chunk in verified), default=0)
    chunks = len(verified) + -(-max(0, size - end) // chunk_size)
    return max(1, min(max_in_flight + 1, chunks))


class _Transfer:
    """One pass over the incoming stream (state shared by the reader and the uploader)."""

    def __init__(self, work: StagingWork, verified: Sequence[VerifiedChunk]) -> None:
        self.work = work
        self.verified = {chunk.offset: chunk for chunk in verified}
        self.verified_end = max((c.offset + c.length for c in verified), default=0)
        self.digests = Digests()
        self.received = 0
        self.sent = 0
        self.chunks_sent = 0
        self.skipped = 0
        self.broken: StreamBroken | None = None
        self.refused: AgentError | None = None  # the reader's own verdict on the bytes
        # Each chunk in its own buffer, drawn from the transfer's share of the byte budget and
        # reused once Corestore took it.
        settings = work.settings
        most = buffer_count(work.entry.size, settings.chunk_size, verified, settings.max_in_flight)
        self.buffers = ChunkBuffers(settings.chunk_size, most=most, draws=work.draws)
        self.queue: asyncio.Queue[tuple[int, bytes | memoryview, str] | None] = asyncio.Queue(
            maxsize=work.settings.max_in_flight
        )
        self._started = work.clock.monotonic()
        self._pace = ProgressPace(work.settings.progress_interval, last=self._started)

    async def read(self, source: ByteSource) -> None:
        work = self.work
        entry = work.entry
        chunks = rechunk(
            source,
            work.settings.chunk_size,
            boundaries=[self.verified[offset].length for offset in sorted(self.verified)],
            limit=entry.size,
            too_long=lambda: IntegrityError(
                f"object {entry.path} arrived longer than its {entry.size} bytes"
            ),
            buffers=self.buffers,
        )
        try:
            async for chunk in chunks:
                offset = self.received
                self.received += len(chunk)
                digest = await self.digests.chunk(chunk)
                if offset < self.verified_end:
                    self._check_verified(offset, len(chunk), digest)
                    self.skipped += len(chunk)
                    self.buffers.put_back(chunk)
                    continue
                await self.queue.put((offset, chunk, digest))
        except StreamBroken as exc:
            self.broken = exc  # what is queued still goes out: it stays resumable
        except AgentError as exc:
            # The bytes count for nothing. Not raised here: that would cancel the uploader in
            # the middle of a PUT, which Corestore may still complete after the object was
            # discarded. The uploader finishes the PUT in flight and sends nothing more.
            self.refused = exc
        finally:
            await chunks.aclose()
            await source.aclose()  # closing the chunker does not close what it read
        await self.queue.put(None)

    def _check_verified(self, offset: int, length: int, digest: str) -> None:
        known = self.verified.get(offset)
        if known is None or known.length != length or known.sha256 != digest:
            raise IntegrityError(
                f"object {self.work.entry.path} at offset {offset} differs from the bytes "
                "Corestore already verified"
            )

    async def upload(self) -> None:
        work = self.work
        while (item := await self.queue.get()) is not None:
            if self.refused is not None:
                self.buffers.put_back(item[1])
                continue  # drain what the reader queued before it refused the bytes
            offset, chunk, digest = item
            for attempt in range(1, work.settings.chunk_attempts + 1):
                try:
                    await work.client.put_chunk(
                        work.archive_id, work.entry.path, offset, chunk, digest, work.grant
                    )
                    break
                except IntegrityError:
                    if attempt >= work.settings.chunk_attempts:
                        raise
                    _log.warning(
                        "staging_chunk_resent",
                        restore_id=work.key.restore_id,
                        path=work.entry.path,
                        offset=offset,
                        attempt=attempt,
                    )
                    await _before_resend(work, attempt)
            self.buffers.put_back(chunk)
            await work.store.record_chunk(work.key, work.entry.path, offset, len(chunk), digest)
            self.sent += len(chunk)
            self.chunks_sent += 1
            self.log_progress()

    def log_progress(self, *, final: bool = False) -> None:
        work = self.work
        now = work.clock.monotonic()
        if not self._pace.due(now, final=final):
            return
        elapsed = max(now - self._started, 1e-9)
        _log.info(
            "staging_progress",
            restore_id=work.key.restore_id,
            node=work.key.node_name,
            path=work.entry.path,
            bytes=self.skipped + self.sent,
            total=work.entry.size,
            mb_per_s=round(self.sent / elapsed / 1e6, 2),
        )


async def stage_object(work: StagingWork, open_source: Callable[[], ByteSource]) -> StageOutcome:
    """Stage `work.entry` from the stream `open_source()` opens (only if bytes are needed)."""
    client, entry = work.client, work.entry
    progress = await client.object_progress(work.archive_id, entry.path, work.grant)
    if progress.state == "committed":
        if (progress.size, progress.sha256) != (entry.size, entry.sha256):
            raise IntegrityError(f"Corestore holds {entry.path} with another size or sha256")
        await work.store.mark_object_written(work.key, entry.path, entry.size, entry.sha256)
        return StageOutcome(0, 0, 0, stream_opened=False)
    verified = list(progress.chunks) if progress.state == "partial" else []
    await _align_records(work, verified)

    transfer = _Transfer(work, verified)
    # Its buffers before the stream is read: a stream being read is emptied by its reader, so
    # what it holds of the byte budget always comes back; all of them, so every stage that
    # moves moves at the same depth (the others wait their turn holding nothing). Two (one
    # filling while the one before goes to Corestore), more as the budget has room, let twice
    # as many stages move at once, each with its own per-stage work: at 128 stages the status
    # p99 was 76 ms against 36 (docs/benchmarks.md, "Four stages opened at once").
    await transfer.buffers.prime(whole=True)
    error: AgentError | None = None
    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(transfer.upload())
            await transfer.read(open_source())
    except* AgentError as caught:
        error = first_leaf(caught)
    finally:
        transfer.buffers.close()
        while not transfer.queue.empty():
            transfer.queue.get_nowait()
    error = error or transfer.refused
    if isinstance(error, IntegrityError):
        await _discard(work)
    if error is not None:
        raise error
    if transfer.broken is not None:
        raise transfer.broken
    transfer.log_progress(final=True)

    actual = (transfer.received, transfer.digests.hexdigest())
    if actual != (entry.size, entry.sha256):
        await _discard(work)
        raise IntegrityError(
            f"object {entry.path} arrived as {actual[0]} bytes with sha256 {actual[1]}, "
            f"not the manifest's {entry.size} bytes with sha256 {entry.sha256}"
        )
    await _commit(work)
    await work.store.mark_object_written(work.key, entry.path, entry.size, entry.sha256)
    return StageOutcome(transfer.sent, transfer.skipped, transfer.chunks_sent, stream_opened=True)


async def _align_records(work: StagingWork, verified: Sequence[VerifiedChunk]) -> None:
    """Forget the store's chunk records of this object when Corestore does not confirm them."""
    recorded = await work.store.verified_chunks(work.key, work.entry.path)
    confirmed = {(c.offset, c.length, c.sha256) for c in verified}
    if any((r.offset, r.length, r.sha256) not in confirmed for r in recorded):
        await work.store.forget_object(work.key, work.entry.path)


async def _commit(work: StagingWork) -> None:
    """Have Corestore re-hash and count the object; after an unknown outcome, ask its progress.

    Not an availability retry (the client does those, and never resends a commit): the commit
    is sent again only when Corestore's progress answer says every byte is there but the object
    is not committed, at most `commit_attempts` commits in all.
    """
    client, entry = work.client, work.entry
    for attempt in range(1, work.settings.commit_attempts + 1):
        try:
            await client.commit_object(
                work.archive_id, entry.path, entry.size, entry.sha256, work.grant
            )
            return
        except IntegrityError:
            # Corestore removed the partial object: forget it here too.
            await work.store.forget_object(work.key, entry.path)
            raise
        except CorestoreUnavailable:
            if attempt >= work.settings.commit_attempts:
                raise
            progress = await client.object_progress(work.archive_id, entry.path, work.grant)
            if progress.state == "committed":
                return
            if progress.state == "absent" or progress.verified_bytes < entry.size:
                await work.store.forget_object(work.key, entry.path)
                raise
            # Every byte is there and Corestore answered: commit again, after a backoff (the
            # commit that failed may have met a Corestore still settling).
            await _before_resend(work, attempt)


async def _before_resend(work: StagingWork, attempt: int) -> None:
    """The wait before a chunk or a commit goes again (full jitter): no resend is immediate."""
    await work.clock.sleep(work.settings.resend_backoff.delay(attempt, work.rng()))


async def _discard(work: StagingWork) -> None:
    """Delete the partial object at Corestore (best effort) and forget it here."""
    try:
        await work.client.delete_object(work.archive_id, work.entry.path, work.grant)
    except AgentError as exc:
        # The object is not counted either way; a later stage or cleanup removes it.
        _log.warning(
            "staging_discard_failed",
            restore_id=work.key.restore_id,
            path=work.entry.path,
            code=exc.code,
        )
    await work.store.forget_object(work.key, work.entry.path)
