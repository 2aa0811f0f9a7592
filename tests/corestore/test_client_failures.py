"""CorestoreClient against the reference Corestore's faults: error mapping, retries, timeouts."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from agent.corestore import CorestoreClient, CorestoreTimeouts
from agent.corestore.routes import RouteName
from agent.errors import (
    CorestoreCredentialRejected,
    CorestoreRefused,
    CorestoreUnavailable,
    IntegrityError,
)
from agent.retry import Backoff, RetryPolicy
from agent.secret import Secret

DUMP = "snap-db-1/dump.bson"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
async def impatient(corestore: Any, bearer: Secret, clock: Any) -> AsyncIterator[CorestoreClient]:
    """A client that gives up on an attempt after 0.2 s, trying twice."""
    async with CorestoreClient(
        corestore.url,
        bearer,
        timeouts=CorestoreTimeouts(connect=1.0, control=0.2, transfer=0.2),
        retry=RetryPolicy(attempts=2, backoff=Backoff(base=0.1)),
        clock=clock,
    ) as opened:
        yield opened


async def test_a_wrong_bearer_is_refused_and_nothing_is_written(
    world: Any, corestore: Any, grant: Secret
) -> None:
    """401 with a fixed credential (nothing fresher to try) is CorestoreCredentialRejected after
    one send; Corestore wrote nothing."""
    await world.prepare()
    async with CorestoreClient(corestore.url, Secret("not-the-bearer")) as intruder:
        with pytest.raises(CorestoreCredentialRejected, match="401 unauthorized") as caught:
            await intruder.put_chunk(world.archive, DUMP, 0, b"data", _sha(b"data"), grant)
    assert caught.value.data == {"httpStatus": 401, "corestoreCode": "unauthorized"}
    assert (caught.value.code, caught.value.retryable) == ("corestore-credential-rejected", True)
    assert corestore.faults.hits[RouteName.PUT_CHUNK] == 1
    assert not world.staged_file(DUMP).exists()
    assert (await world.client.object_progress(world.archive, DUMP, grant)).state == "absent"


async def test_a_wrong_bearer_cannot_prepare_a_restore(corestore: Any, grant: Secret) -> None:
    """An unauthenticated prepare leaves no restore behind."""
    async with CorestoreClient(corestore.url, Secret("not-the-bearer")) as intruder:
        with pytest.raises(CorestoreCredentialRejected, match="401"):
            await intruder.prepare_restore(
                "restore-x",
                scratch_namespace_id="ns",
                staging_archive_id="sa",
                resource_mappings=[
                    {"id": "m", "type": "volume", "source": {"snapshotId": "s"}, "target": {}}
                ],
                archive_manifest={"objects": []},
                grant=grant,
            )
    assert not (corestore.data_dir / "restores").exists()


async def test_a_chunk_digest_mismatch_is_an_integrity_error_and_counts_nothing(world: Any) -> None:
    """Bytes that do not match their header: IntegrityError, no byte written or counted."""
    await world.prepare()
    with pytest.raises(IntegrityError, match="chunk-digest-mismatch") as caught:
        await world.client.put_chunk(world.archive, DUMP, 0, b"data", _sha(b"other"), world.grant)
    progress = await world.client.object_progress(world.archive, DUMP, world.grant)
    assert (progress.state, progress.verified_bytes) == ("absent", 0)
    assert not world.staged_file(DUMP).exists()
    assert isinstance(caught.value.__cause__, CorestoreRefused)
    assert caught.value.retryable


async def test_a_body_truncated_on_the_way_is_an_integrity_error(world: Any) -> None:
    """What Corestore received differs from what was sent: its digest check catches it."""
    await world.prepare()
    world.corestore.faults.truncate_next(RouteName.PUT_CHUNK, drop_bytes=10)
    chunk = world.objects[DUMP][:4096]
    with pytest.raises(IntegrityError):
        await world.client.put_chunk(world.archive, DUMP, 0, chunk, _sha(chunk), world.grant)
    assert (
        await world.client.object_progress(world.archive, DUMP, world.grant)
    ).verified_bytes == 0


async def test_an_acknowledgement_of_another_digest_is_an_integrity_error(world: Any) -> None:
    """Corestore answering a different sha256 than sent is not taken as success."""
    await world.prepare()
    world.corestore.faults.wrong_digest_next(RouteName.PUT_CHUNK)
    chunk = world.objects[DUMP][:4096]
    with pytest.raises(IntegrityError, match="acknowledged another chunk"):
        await world.client.put_chunk(world.archive, DUMP, 0, chunk, _sha(chunk), world.grant)


async def test_a_commit_answered_with_another_digest_is_an_integrity_error(world: Any) -> None:
    """The commit echo is checked like the chunk echo."""
    await world.prepare()
    await world.stage(DUMP, commit=False)
    world.corestore.faults.wrong_digest_next(RouteName.COMMIT_OBJECT)
    entry = world.entry(DUMP)
    with pytest.raises(IntegrityError, match="another size or sha256"):
        await world.client.commit_object(
            world.archive, DUMP, entry["size"], entry["sha256"], world.grant
        )


async def test_commit_with_a_wrong_whole_object_digest_removes_the_partial_object(
    world: Any,
) -> None:
    """Chunks verified one by one but the whole differs: refused, the partial object removed."""
    await world.prepare()
    wrong = bytes(len(world.objects[DUMP]))  # right size, wrong bytes
    await world.client.put_chunk(world.archive, DUMP, 0, wrong, _sha(wrong), world.grant)
    entry = world.entry(DUMP)
    with pytest.raises(IntegrityError, match="object-digest-mismatch"):
        await world.client.commit_object(
            world.archive, DUMP, entry["size"], entry["sha256"], world.grant
        )
    progress = await world.client.object_progress(world.archive, DUMP, world.grant)
    assert (progress.state, progress.verified_bytes) == ("absent", 0)
    assert not world.staged_file(DUMP).exists()


async def test_an_idempotent_call_converges_through_two_503s(world: Any) -> None:
    """503 twice, then success: the chunk is counted once, after two backoff sleeps."""
    await world.prepare()
    world.corestore.faults.fail_next(RouteName.PUT_CHUNK, status=503, times=2)
    chunk = world.objects[DUMP][:4096]
    accepted = await world.client.put_chunk(world.archive, DUMP, 0, chunk, _sha(chunk), world.grant)
    assert accepted.verified_bytes == 4096
    assert world.corestore.faults.hits[RouteName.PUT_CHUNK] == 3
    assert world.clock.slept == [0.1, 0.2]


async def test_persistent_5xx_ends_in_corestore_unavailable(world: Any) -> None:
    """After the last attempt the client gives up with a retryable CorestoreUnavailable."""
    world.corestore.faults.fail_next(RouteName.HEALTH, status=502, times=5)
    with pytest.raises(CorestoreUnavailable, match="attempt 3 of 3") as caught:
        await world.client.health()
    assert (caught.value.code, caught.value.retryable) == ("corestore-unavailable", True)
    assert world.corestore.faults.hits[RouteName.HEALTH] == 3


async def test_connection_resets_end_in_corestore_unavailable_after_retries(world: Any) -> None:
    """A Corestore that drops every connection: retried with backoff, then unavailable."""
    await world.prepare()
    world.corestore.faults.reset_next(RouteName.OBJECT_PROGRESS, times=100)
    with pytest.raises(CorestoreUnavailable, match="ServerDisconnectedError"):
        await world.client.object_progress(world.archive, DUMP, world.grant)
    assert world.clock.slept == [0.1, 0.2]


async def test_a_lost_chunk_answer_is_retried_into_the_same_state(world: Any) -> None:
    """The chunk was written but its answer lost: the resend is a replay, counted once."""
    await world.prepare()
    world.corestore.faults.reset_next(RouteName.PUT_CHUNK, after=True)
    chunk = world.objects[DUMP][:4096]
    accepted = await world.client.put_chunk(world.archive, DUMP, 0, chunk, _sha(chunk), world.grant)
    progress = await world.client.object_progress(world.archive, DUMP, world.grant)
    assert accepted.verified_bytes == progress.verified_bytes == 4096
    assert len(progress.chunks) == 1


async def test_a_slow_corestore_times_out_as_unavailable(
    world: Any, impatient: CorestoreClient
) -> None:
    """No answer within the total timeout: CorestoreUnavailable naming the timeout."""
    await world.prepare()
    world.corestore.faults.delay_next(RouteName.OBJECT_PROGRESS, seconds=30, times=2)
    with pytest.raises(CorestoreUnavailable, match=r"within 0\.2 s") as caught:
        await impatient.object_progress(world.archive, DUMP, world.grant)
    assert isinstance(caught.value.__cause__, CorestoreUnavailable)
    assert world.corestore.faults.hits[RouteName.OBJECT_PROGRESS] == 2


async def test_a_commit_is_not_retried_after_a_503(world: Any) -> None:
    """The non-idempotent commit is sent once: no backoff, one hit."""
    await world.prepare()
    await world.stage(DUMP, commit=False)
    world.corestore.faults.fail_next(RouteName.COMMIT_OBJECT, status=503)
    entry = world.entry(DUMP)
    with pytest.raises(CorestoreUnavailable, match="attempt 1 of 1"):
        await world.client.commit_object(
            world.archive, DUMP, entry["size"], entry["sha256"], world.grant
        )
    assert world.corestore.faults.hits[RouteName.COMMIT_OBJECT] == 1
    assert world.clock.slept == []


async def test_a_commit_is_not_retried_after_a_reset(world: Any) -> None:
    """Not even a dropped connection makes the client resend a commit."""
    await world.prepare()
    await world.stage(DUMP, commit=False)
    world.corestore.faults.reset_next(RouteName.COMMIT_OBJECT)
    entry = world.entry(DUMP)
    with pytest.raises(CorestoreUnavailable):
        await world.client.commit_object(
            world.archive, DUMP, entry["size"], entry["sha256"], world.grant
        )
    assert world.corestore.faults.hits[RouteName.COMMIT_OBJECT] == 1


async def test_a_4xx_is_not_retried(world: Any) -> None:
    """A refusal is final: one hit, no sleep."""
    await world.prepare()
    chunk = world.objects[DUMP][4096:8192]
    with pytest.raises(CorestoreRefused):
        await world.client.put_chunk(world.archive, DUMP, 4096, chunk, _sha(chunk), world.grant)
    assert world.corestore.faults.hits[RouteName.PUT_CHUNK] == 1
    assert world.clock.slept == []


async def test_an_unreachable_corestore_is_unavailable(
    corestore: Any, bearer: Secret, clock: Any
) -> None:
    """Connection refused (nothing listens any more) is CorestoreUnavailable after the default
    policy's four sends, each wait a full-jitter draw within its doubling window."""
    url = corestore.url
    await corestore.stop()
    async with CorestoreClient(url, bearer, clock=clock) as client:
        with pytest.raises(CorestoreUnavailable, match="ClientConnectorError"):
            await client.health()
    windows = [RetryPolicy().backoff.window(n) for n in (1, 2, 3)]
    assert windows == [0.25, 0.5, 1.0]
    assert len(clock.slept) == 3
    assert all(0.0 <= wait <= window for wait, window in zip(clock.slept, windows, strict=True))


async def test_a_bare_404_on_a_delete_is_not_taken_for_cleaned(
    bearer: Secret, grant: Secret
) -> None:
    """A server without the route (e.g. a wrong base URL) answers 404 without Corestore's code."""
    runner = web.AppRunner(web.Application(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        async with CorestoreClient(url, bearer) as client:
            with pytest.raises(CorestoreRefused, match="404 unknown"):
                await client.delete_staging_archive("staging-archive-1", grant)
    finally:
        await runner.cleanup()


class _Answers:
    """A `CorestoreObserver` that keeps every attempt's (route, outcome)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self.unavailable: list[tuple[str, float | None]] = []

    def corestore_answer(self, *, route: str, outcome: str, seconds: float) -> None:
        self.seen.append((route, outcome))

    def corestore_resend(self, *, route: str) -> None:
        pass

    def corestore_unavailable(self, *, node: str, since: float | None) -> None:
        self.unavailable.append((node, since))


async def test_each_attempt_is_reported_by_the_kind_of_answer_it_got(
    corestore: Any, bearer: Secret, clock: Any
) -> None:
    """A reset connection is reported `error` (no answer), a 503 `unavailable` (Corestore
    answered), the resend that succeeds `ok`."""
    answers = _Answers()
    async with CorestoreClient(
        corestore.url,
        bearer,
        retry=RetryPolicy(attempts=3, backoff=Backoff(base=0.01)),
        clock=clock,
        observer=answers,
    ) as client:
        # Two resets: aiohttp itself sends an idempotent request once more when its connection
        # drops, so one attempt of the client meets both.
        corestore.faults.reset_next(RouteName.HEALTH, times=2)
        corestore.faults.fail_next(RouteName.HEALTH, status=503)
        await client.health()
    assert answers.seen == [
        (RouteName.HEALTH, "error"),
        (RouteName.HEALTH, "unavailable"),
        (RouteName.HEALTH, "ok"),
    ]
