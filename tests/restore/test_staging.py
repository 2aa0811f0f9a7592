"""Staging one object under faults: nothing counts without its digest, retries converge,
an interrupted stage resumes without re-sending what Corestore verified."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
import structlog

from agent.contracts.isolatedrestore import METHOD_STAGE
from agent.corestore import CorestoreTimeouts
from agent.corestore.models import VerifiedChunk
from agent.corestore.routes import RouteName
from agent.errors import CorestoreUnavailable, IntegrityError, StreamBroken
from agent.restore.settings import EngineSettings
from agent.restore.staging import buffer_count

DUMP = "snap-db/dump.bson"  # 3 full chunks and 123 bytes: 4 chunk PUTs


@pytest.fixture
def corestore_timeouts() -> CorestoreTimeouts:
    """Short enough that the timeout test stays fast; loopback answers in milliseconds."""
    return CorestoreTimeouts(connect=1.0, control=1.0, transfer=0.3)


async def _written(world: Any) -> list[str]:
    return [record.object_path for record in await world.store.written_objects(world.KEY)]


def _staged_ok(world: Any, path: str) -> bool:
    staged = world.staged_file(path).read_bytes()
    return hashlib.sha256(staged).digest() == hashlib.sha256(world.objects[path]).digest()


async def _stage_raw(world: Any, revision: int, source: Any, path: str = DUMP) -> dict[str, Any]:
    state: dict[str, Any] = await world.state_of(
        METHOD_STAGE, world.stage_body(path, revision), source
    )
    return state


async def test_a_chunk_corrupted_in_transit_is_resent_and_the_object_converges(
    world: Any,
) -> None:
    """Corestore refuses a chunk whose bytes lost their tail; the engine sends it again."""
    prepared = await world.prepare()
    world.corestore.faults.truncate_next(RouteName.PUT_CHUNK, drop_bytes=7)
    slept = len(world.clock.slept)
    state = await world.stage(DUMP, prepared["revision"])
    assert state["status"] == "staging"
    assert world.corestore.faults.hits[RouteName.PUT_CHUNK] == 5
    assert world.clock.slept[slept:] == [0.25]  # the resend waited one backoff
    assert await _written(world) == [DUMP]
    assert _staged_ok(world, DUMP)


async def test_bytes_that_miss_the_manifest_digest_count_for_nothing(
    world: Any, source_factory: Any
) -> None:
    """Right size, wrong sha256: integrity-mismatch, the partial object is deleted."""
    prepared = await world.prepare()
    wrong = bytearray(world.objects[DUMP])
    wrong[-1] ^= 0xFF
    with pytest.raises(IntegrityError) as caught:
        await _stage_raw(world, prepared["revision"], source_factory(bytes(wrong)))
    assert caught.value.code == "integrity-mismatch"
    assert await _written(world) == []
    assert await world.store.verified_chunks(world.KEY, DUMP) == []
    assert not world.staged_file(DUMP).exists()
    assert world.corestore.faults.hits[RouteName.COMMIT_OBJECT] == 0
    assert (await world.store.get(world.KEY)).revision == prepared["revision"]
    # Cloudly sends the right bytes again: the same request proceeds.
    assert (await world.stage(DUMP, prepared["revision"]))["status"] == "staging"
    assert _staged_ok(world, DUMP)


async def test_a_stream_longer_than_the_object_counts_for_nothing(
    world: Any, source_factory: Any
) -> None:
    """Bytes beyond the manifest size stop the stage before they reach Corestore."""
    prepared = await world.prepare()
    with pytest.raises(IntegrityError):
        await _stage_raw(world, prepared["revision"], source_factory(world.objects[DUMP] + b"!"))
    assert await _written(world) == []
    assert not world.staged_file(DUMP).exists()


async def test_a_chunk_in_flight_when_the_bytes_are_refused_is_finished_not_cut(
    world: Any, source_factory: Any
) -> None:
    """Corestore is still taking the first chunk when the stream runs past the object's size:
    that PUT is completed (never cut, or Corestore could finish it after the discard), nothing
    more is sent, and then the partial object is deleted."""
    prepared = await world.prepare()
    # Within this module's 0.3 s transfer timeout: the PUT is slow, not lost.
    world.corestore.faults.delay_next(RouteName.PUT_CHUNK, seconds=0.1)
    with structlog.testing.capture_logs() as events, pytest.raises(IntegrityError, match="longer"):
        await _stage_raw(world, prepared["revision"], source_factory(world.objects[DUMP] + b"!"))
    sent = [e["bytes"] for e in events if e["event"] == "staging_progress"]
    assert sent == [world.CHUNK]  # the one PUT in flight finished; no final line
    assert world.corestore.faults.hits[RouteName.PUT_CHUNK] == 1
    assert world.corestore.faults.hits[RouteName.DELETE_OBJECT] == 1
    assert await world.store.verified_chunks(world.KEY, DUMP) == []
    assert not world.staged_file(DUMP).exists()


@pytest.mark.parametrize(
    "fault",
    [
        pytest.param(lambda f: f.fail_next(RouteName.PUT_CHUNK, status=503), id="5xx"),
        pytest.param(lambda f: f.reset_next(RouteName.PUT_CHUNK), id="reset-before"),
        pytest.param(lambda f: f.reset_next(RouteName.PUT_CHUNK, after=True), id="reset-after"),
        pytest.param(lambda f: f.delay_next(RouteName.PUT_CHUNK, seconds=5), id="timeout"),
        pytest.param(lambda f: f.wrong_digest_next(RouteName.PUT_CHUNK), id="wrong-ack"),
    ],
)
async def test_a_failed_chunk_put_is_retried_and_the_object_converges(
    world: Any, fault: Any
) -> None:
    """One chunk PUT fails (5xx, reset, timeout, a wrong acknowledgement): it is sent again."""
    prepared = await world.prepare()
    fault(world.corestore.faults)
    assert (await world.stage(DUMP, prepared["revision"]))["status"] == "staging"
    assert world.corestore.faults.hits[RouteName.PUT_CHUNK] == 5
    assert await _written(world) == [DUMP]
    assert _staged_ok(world, DUMP)


async def test_corestore_down_mid_object_keeps_the_verified_chunks_for_a_resume(
    world: Any,
) -> None:
    """The stage fails retryable; its retry sends only the chunks Corestore lacks."""
    prepared = await world.prepare()
    faults = world.corestore.faults
    # Two PUTs pass (a zero delay), then both client attempts of chunk 3 answer 503.
    faults.delay_next(RouteName.PUT_CHUNK, seconds=0, times=2)
    faults.fail_next(RouteName.PUT_CHUNK, status=503, times=2)
    with pytest.raises(CorestoreUnavailable):
        await world.stage(DUMP, prepared["revision"])
    recorded = await world.store.verified_chunks(world.KEY, DUMP)
    assert [c.offset for c in recorded] == [0, world.CHUNK]
    assert await _written(world) == []
    assert (await world.store.get(world.KEY)).revision == prepared["revision"]
    puts = faults.hits[RouteName.PUT_CHUNK]
    assert (await world.stage(DUMP, prepared["revision"]))["status"] == "staging"
    assert faults.hits[RouteName.PUT_CHUNK] - puts == 2
    assert _staged_ok(world, DUMP)


async def test_a_stream_broken_mid_object_resumes_without_resending_verified_chunks(
    world: Any, source_factory: Any
) -> None:
    """StreamBroken after 2.5 chunks: 2 chunks stay verified; the retry PUTs only the rest."""
    prepared = await world.prepare()
    broken = source_factory(world.objects[DUMP], break_after=world.CHUNK * 2 + 100)
    with pytest.raises(StreamBroken):
        await _stage_raw(world, prepared["revision"], broken)
    faults = world.corestore.faults
    assert faults.hits[RouteName.PUT_CHUNK] == 2
    assert len(await world.store.verified_chunks(world.KEY, DUMP)) == 2
    assert await _written(world) == []
    assert (await world.store.get(world.KEY)).revision == prepared["revision"]

    state = await world.stage(DUMP, prepared["revision"])
    assert state["status"] == "staging"
    assert faults.hits[RouteName.PUT_CHUNK] == 4  # chunks 3 and 4 only
    assert _staged_ok(world, DUMP)


async def test_an_interrupted_stage_resumes_after_an_agent_restart(
    world: Any, source_factory: Any
) -> None:
    """Corestore's progress answer is the authority: a new engine resumes from it."""
    prepared = await world.prepare()
    broken = source_factory(world.objects[DUMP], break_after=world.CHUNK * 3)
    with pytest.raises(StreamBroken):
        await _stage_raw(world, prepared["revision"], broken)
    await world.restart()
    await world.stage(DUMP, prepared["revision"])
    assert world.corestore.faults.hits[RouteName.PUT_CHUNK] == 4
    assert _staged_ok(world, DUMP)


async def test_a_resume_with_other_bytes_than_corestore_verified_counts_for_nothing(
    world: Any, source_factory: Any
) -> None:
    """The resent prefix must hash to Corestore's chunk digests, else the object is discarded."""
    prepared = await world.prepare()
    broken = source_factory(world.objects[DUMP], break_after=world.CHUNK * 2)
    with pytest.raises(StreamBroken):
        await _stage_raw(world, prepared["revision"], broken)
    other = bytearray(world.objects[DUMP])
    other[10] ^= 0x01
    with pytest.raises(IntegrityError):
        await _stage_raw(world, prepared["revision"], source_factory(bytes(other)))
    assert not world.staged_file(DUMP).exists()
    assert await world.store.verified_chunks(world.KEY, DUMP) == []


async def test_a_commit_whose_answer_was_lost_is_confirmed_through_progress(
    world: Any,
) -> None:
    """Commit is not retried blindly: progress says every byte is there, so commit again,
    after a backoff (it used to go again at once, 0 ms after the 503)."""
    prepared = await world.prepare()
    world.corestore.faults.fail_next(RouteName.COMMIT_OBJECT, status=503)
    slept = len(world.clock.slept)
    await world.stage(DUMP, prepared["revision"])
    assert world.corestore.faults.hits[RouteName.COMMIT_OBJECT] == 2
    assert world.clock.slept[slept:] == [0.25]  # the first window, the draw fixed at its top
    assert await _written(world) == [DUMP]


async def test_an_object_corestore_already_committed_moves_no_bytes(
    world: Any, source_factory: Any
) -> None:
    """Written at Corestore but not recorded here (a crash in between): no stream is read."""
    prepared = await world.prepare()
    await world.stage(DUMP, prepared["revision"])
    await world.store.forget_object(world.KEY, DUMP)
    puts = world.corestore.faults.hits[RouteName.PUT_CHUNK]
    source = source_factory(world.objects[DUMP])
    state = await _stage_raw(world, prepared["revision"] + 1, source)
    assert state["revision"] == prepared["revision"] + 2
    assert source.opened is False
    assert world.corestore.faults.hits[RouteName.PUT_CHUNK] == puts
    assert await _written(world) == [DUMP]


class _Watching:
    """A source that notes, before each piece, how far reading ran ahead of Corestore."""

    def __init__(self, world: Any, path: str, piece: int) -> None:
        self.world, self.path, self.piece = world, path, piece
        self.ahead: list[int] = []

    def __aiter__(self) -> Any:
        return self._pieces()

    async def _pieces(self) -> Any:
        data = self.world.objects[self.path]
        for start in range(0, len(data), self.piece):
            records = await self.world.store.verified_chunks(self.world.KEY, self.path)
            self.ahead.append(start - sum(record.length for record in records))
            yield data[start : start + self.piece]

    async def aclose(self) -> None:
        return None


async def test_reading_runs_at_most_max_in_flight_chunks_ahead_of_corestore(
    world: Any,
) -> None:
    """With Corestore stalled, the stream is read no further than the bounded queue allows."""
    path = "snap-db/big.bin"
    world.objects = {path: world.pattern(12 * world.CHUNK, "big")}
    prepared = await world.prepare()
    world.corestore.faults.delay_next(RouteName.PUT_CHUNK, seconds=5)  # > transfer timeout
    piece = 1000
    source = _Watching(world, path, piece)
    await _stage_raw(world, prepared["revision"], source, path)
    bound = (world.engine.settings.max_in_flight + 2) * world.CHUNK + piece
    assert max(source.ahead) <= bound
    assert max(source.ahead) >= world.engine.settings.max_in_flight * world.CHUNK
    assert _staged_ok(world, path)


@pytest.mark.parametrize(
    ("settings", "lines"),
    [
        (EngineSettings(chunk_size=4096, progress_interval=3600.0), 1),
        (EngineSettings(chunk_size=4096, progress_interval=0.0), 5),
    ],
)
async def test_staging_progress_is_logged_at_most_once_per_interval(world: Any, lines: int) -> None:
    """A long interval leaves only the final line (bytes = total); zero logs every chunk."""
    prepared = await world.prepare()
    with structlog.testing.capture_logs() as events:
        await world.stage(DUMP, prepared["revision"])
    progress = [e for e in events if e["event"] == "staging_progress"]
    assert len(progress) == lines
    size = len(world.objects[DUMP])
    assert (progress[-1]["bytes"], progress[-1]["total"], progress[-1]["path"]) == (
        size,
        size,
        DUMP,
    )
    assert progress[-1]["mb_per_s"] >= 0


async def test_a_stage_that_fails_closes_its_stream(world: Any, source_factory: Any) -> None:
    """Corestore down mid-object: the stage fails, and the stream it read is closed (left
    open, its reader's wake-up stayed registered on the connection for the connection's life,
    one per failed stage)."""
    prepared = await world.prepare()
    source = source_factory(world.objects[DUMP])
    world.corestore.faults.fail_next(RouteName.PUT_CHUNK, status=503, times=2)
    with pytest.raises(CorestoreUnavailable):
        await _stage_raw(world, prepared["revision"], source, DUMP)
    assert source.opened
    assert source.closed


MiB = 1 << 20


@pytest.mark.parametrize(
    ("size", "verified", "count"),
    [
        (256 * MiB, 0, 5),  # max_in_flight (4) queued and one being filled
        (8 * MiB, 0, 2),  # two chunks: two buffers
        (8 * MiB + 1, 0, 3),  # the last chunk is one byte
        (0, 0, 1),  # an empty object still reads its stream's end into one
        (6 * MiB, 2, 3),  # two verified chunks of 1 MiB (read again), then 4 MiB in one
    ],
)
def test_a_stage_draws_no_more_buffers_than_its_object_has_chunks(
    size: int, verified: int, count: int
) -> None:
    chunks = [VerifiedChunk(offset=n * MiB, length=MiB, sha256="0" * 64) for n in range(verified)]
    assert buffer_count(size, 4 * MiB, chunks, max_in_flight=4) == count
