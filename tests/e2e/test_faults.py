"""Faults while staging, through the real session: nothing counts without its digest, retries
converge, cleanup leaves nothing.

The volume image is 2 MiB: 32 chunks of 64 KiB at Corestore. Faults are set by a hook on
Corestore's hit counter, so they land on an exact chunk mid-object (`stack.on_hit`).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agent.corestore.routes import RouteName
from agent.errors import CallFailed, SessionClosed
from devstack.driver import Progress, RestorePlan, Retrying

KiB, MiB = 1024, 1024 * 1024
VOLUME = "snap-vol/volume.img"
CHUNKS = 32  # 2 MiB in 64 KiB chunks
PUT = RouteName.PUT_CHUNK


async def _prepared(driver: Any) -> int:
    """Prepare and stage every object but the volume image; the revision reached."""
    await driver.prepare()
    for spec in driver.plan.objects:
        if spec.path != VOLUME:
            await driver.stage(spec)
    return int(driver.revision)


def _retries(events: list[Progress]) -> list[str]:
    return [event.reason for event in events if isinstance(event, Retrying)]


async def _stage_refused(
    driver: Any, **options: Any
) -> tuple[pytest.ExceptionInfo[CallFailed], dict[str, Any] | None]:
    """Stage the volume image expecting a refusal: the refusal, and the status right after."""
    with pytest.raises(CallFailed) as refused:
        await driver.stage(VOLUME, **options)
    return refused, await driver.status()


def _assert_refused_without_a_revision(
    refused: pytest.ExceptionInfo[CallFailed], after: Any, revision: int, code: str
) -> None:
    """The stage was refused with `code` and the restore's revision did not move."""
    assert refused.value.error_data["code"] == code
    assert after is not None
    assert after["revision"] == revision


def _assert_staged_then_cleaned(
    stack: Any, staged: Any, revision: int, cleaned: dict[str, Any]
) -> None:
    """The (re-)stage counted once, and cleanup left nothing at Corestore."""
    assert (staged["status"], staged["revision"]) == ("staging", revision + 1)
    assert cleaned["status"] == "cleaned"
    assert stack.leftovers() == []


async def test_a_chunk_corrupted_on_the_way_to_corestore_is_sent_again(
    stack: Any, plan: RestorePlan
) -> None:
    """Corestore refuses a truncated chunk (422); the agent resends it; the stage succeeds."""
    driver = stack.driver(plan)
    async with stack.agent():
        revision = await _prepared(driver)
        before = stack.hits[PUT]
        stack.on_hit(PUT, before + 10, lambda: stack.faults.truncate_next(PUT, drop_bytes=5))
        staged = await driver.stage(VOLUME)
        assert stack.hits[PUT] - before == CHUNKS + 1
        assert stack.staged_digest(driver.plan, VOLUME) == driver.plan.object(VOLUME).sha256
        cleaned = await stack.clean_up(driver)
    _assert_staged_then_cleaned(stack, staged, revision, cleaned)


async def test_bytes_that_differ_from_the_manifest_count_for_nothing(
    stack: Any, plan: RestorePlan
) -> None:
    """A stream with one flipped byte: integrity-mismatch, no revision, nothing left staged."""
    driver = stack.driver(plan)
    async with stack.agent():
        revision = await _prepared(driver)
        refused, after_refusal = await _stage_refused(driver, corrupt_at=MiB + 7)
        held = stack.object_progress(driver.plan, VOLUME)
        staged = await driver.stage(VOLUME)
        cleaned = await stack.clean_up(driver)
    _assert_refused_without_a_revision(refused, after_refusal, revision, "integrity-mismatch")
    assert refused.value.error_data["retryable"] is True
    assert held["state"] == "absent"
    _assert_staged_then_cleaned(stack, staged, revision, cleaned)


async def test_a_commit_acknowledged_with_another_digest_is_not_counted(
    stack: Any, plan: RestorePlan
) -> None:
    """Corestore echoes another sha256 on commit: refused, no revision; the re-stage converges."""
    driver = stack.driver(plan)
    async with stack.agent():
        revision = await _prepared(driver)
        stack.faults.wrong_digest_next(RouteName.COMMIT_OBJECT)
        refused, after_refusal = await _stage_refused(driver)
        staged = await driver.stage(VOLUME)
        on_disk = stack.staged_digest(driver.plan, VOLUME)
        cleaned = await stack.clean_up(driver)
    _assert_refused_without_a_revision(refused, after_refusal, revision, "integrity-mismatch")
    assert on_disk == driver.plan.object(VOLUME).sha256
    _assert_staged_then_cleaned(stack, staged, revision, cleaned)


@pytest.mark.parametrize(
    "fault",
    [
        pytest.param(lambda faults: faults.fail_next(PUT, status=503, times=100), id="5xx"),
        pytest.param(lambda faults: faults.reset_next(PUT, times=100), id="connection-reset"),
    ],
)
async def test_corestore_failing_mid_object_fails_the_stage_and_a_re_stage_resumes(
    stack: Any, plan: RestorePlan, fault: Any
) -> None:
    """From chunk 8 on Corestore fails: corestore-unavailable, no revision, the 7 verified
    chunks stay; once Corestore is back the re-stage sends only the other 25."""
    driver = stack.driver(plan)
    async with stack.agent():
        revision = await _prepared(driver)
        before = stack.hits[PUT]
        stack.on_hit(PUT, before + 8, lambda: fault(stack.faults))
        refused, after_refusal = await _stage_refused(driver)
        held = stack.object_progress(driver.plan, VOLUME)
        stack.faults.clear()
        before_re_stage = stack.hits[PUT]
        staged = await driver.stage(VOLUME)
        on_disk = stack.staged_digest(driver.plan, VOLUME)
        cleaned = await stack.clean_up(driver)
    _assert_refused_without_a_revision(refused, after_refusal, revision, "corestore-unavailable")
    assert refused.value.error_data["retryable"] is True
    assert (held["state"], held["verifiedBytes"]) == ("partial", 7 * 64 * KiB)
    assert stack.hits[PUT] - before_re_stage == CHUNKS - 7
    assert on_disk == driver.plan.object(VOLUME).sha256
    _assert_staged_then_cleaned(stack, staged, revision, cleaned)


async def test_a_chunk_put_outlasting_the_configured_transfer_timeout_fails_the_stage(
    stack: Any, plan: RestorePlan
) -> None:
    """`transfer_timeout_s = 0.3` and Corestore stalls chunk PUTs for 30 s: the stage fails
    corestore-unavailable after the client's 2 attempts; once Corestore answers it converges."""
    driver = stack.driver(plan)
    async with stack.agent(transfer_timeout_s=0.3):
        revision = await _prepared(driver)
        before = stack.hits[PUT]
        stack.faults.delay_next(PUT, seconds=30.0, times=100)
        with pytest.raises(CallFailed) as refused:
            await driver.stage(VOLUME)
        stalled = stack.hits[PUT] - before
        stack.faults.clear()
        staged = await driver.stage(VOLUME)
        cleaned = await stack.clean_up(driver)
    assert refused.value.error_data["code"] == "corestore-unavailable"
    assert stalled == 2
    _assert_staged_then_cleaned(stack, staged, revision, cleaned)


async def test_a_chunk_whose_answer_was_lost_is_answered_as_before(
    stack: Any, plan: RestorePlan
) -> None:
    """Corestore writes chunk 8, then the connection drops: the client resends it, no error."""
    driver = stack.driver(plan)
    async with stack.agent():
        revision = await _prepared(driver)
        before = stack.hits[PUT]
        stack.on_hit(PUT, before + 8, lambda: stack.faults.reset_next(PUT, after=True))
        staged = await driver.stage(VOLUME)
        on_disk = stack.staged_digest(driver.plan, VOLUME)
        cleaned = await stack.clean_up(driver)
    assert stack.hits[PUT] - before == CHUNKS + 1
    assert on_disk == driver.plan.object(VOLUME).sha256
    _assert_staged_then_cleaned(stack, staged, revision, cleaned)


async def test_a_corestore_timeout_while_resuming_a_half_staged_object_is_retried(
    stack: Any, plan: RestorePlan
) -> None:
    """The resume's progress read outlives the 0.5 s control timeout; the client asks again."""
    events: list[Progress] = []
    driver = stack.driver(plan, retries=2, on_progress=events.append)

    def fail_then_stall() -> None:
        stack.faults.fail_next(PUT, status=503, times=2)
        stack.faults.delay_next(RouteName.OBJECT_PROGRESS, seconds=30.0)

    async with stack.agent(request_timeout_s=0.5):
        revision = await _prepared(driver)
        before, progress_reads = stack.hits[PUT], stack.hits[RouteName.OBJECT_PROGRESS]
        stack.on_hit(PUT, before + 8, fail_then_stall)
        staged = await driver.stage(VOLUME)
        on_disk = stack.staged_digest(driver.plan, VOLUME)
        cleaned = await stack.clean_up(driver)
    assert _retries(events) == ["corestore-unavailable"]
    # first stage: 1 read; the re-stage: 1 read timed out + 1 answered
    assert stack.hits[RouteName.OBJECT_PROGRESS] - progress_reads == 3
    assert stack.hits[PUT] - before == CHUNKS + 2
    assert on_disk == driver.plan.object(VOLUME).sha256
    _assert_staged_then_cleaned(stack, staged, revision, cleaned)


async def test_the_websocket_dropping_mid_stream_counts_nothing_and_the_retry_converges(
    stack: Any, plan: RestorePlan
) -> None:
    """Cloudly drops the session at chunk 8: no revision, the object is not committed; after
    the agent reconnects the re-stage resumes, and the restore goes on to ready and cleaned."""
    events: list[Progress] = []
    driver = stack.driver(plan, on_progress=events.append)
    dropping = asyncio.Event()
    async with stack.agent():
        revision = await _prepared(driver)
        before = stack.hits[PUT]
        stack.on_hit(PUT, before + 8, dropping.set)
        stage = asyncio.create_task(driver.stage(VOLUME))
        await dropping.wait()
        await stack.cloudly.drop_connections()
        with pytest.raises(SessionClosed):
            await stage
        held = stack.object_progress(driver.plan, VOLUME)
        driver.retries = 5  # the first attempts may meet the agent still reconnecting
        after_drop = await driver.status()
        staged = await driver.stage(VOLUME)
        await driver.execute()
        ready = await driver.wait_until({"ready", "failed"})
        cleaned = await stack.clean_up(driver)
    assert held["state"] == "partial"
    assert after_drop is not None
    assert (after_drop["status"], after_drop["revision"]) == ("staging", revision)
    assert stack.hits[PUT] - before < CHUNKS + 8, "the re-stage resumed after verified chunks"
    assert ready["status"] == "ready"
    _assert_staged_then_cleaned(stack, staged, revision, cleaned)


async def test_a_stage_stream_kept_alive_without_bytes_is_refused_and_the_re_stage_resumes(
    stack: Any, plan: RestorePlan
) -> None:
    """Cloudly sends 8 chunks of the volume image and then only keep-alives: after the stall
    deadline (scaled to 1.5 s) the stage is refused `transfer-interrupted`, retryable, with no
    revision; the restore is not pinned: the re-stage resumes after the verified chunks."""
    driver = stack.driver(plan)
    async with asyncio.timeout(60), stack.agent(streams={"stall_timeout_s": 1.5}):
        revision = await _prepared(driver)
        before = stack.hits[PUT]
        refused, after = await _stage_refused(driver, stall_after=8 * 64 * KiB)
        held = stack.object_progress(driver.plan, VOLUME)
        re_staged_from = stack.hits[PUT]
        staged = await driver.stage(VOLUME)
        cleaned = await stack.clean_up(driver)
    _assert_refused_without_a_revision(refused, after, revision, "transfer-interrupted")
    assert refused.value.error_data["retryable"] is True
    assert (held["state"], held["verifiedBytes"]) == ("partial", 8 * 64 * KiB)
    assert re_staged_from - before == 8
    assert stack.hits[PUT] - re_staged_from == CHUNKS - 8
    _assert_staged_then_cleaned(stack, staged, revision, cleaned)
