"""Enrolling the recipient key: begin, open the challenge, complete, record; only when needed,
once for concurrent askers, nothing recorded when a step fails; replay-safe on Cloudly's side."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from agent.contracts.credentials import (
    METHOD_BEGIN_ENROLLMENT,
    METHOD_COMPLETE_ENROLLMENT,
    BeginEnrollmentResponse,
    b64url,
)
from agent.credentials.binding import challenge_info, open_challenge
from agent.credentials.enrollment import read_answer
from agent.credentials.keys import ENROLLMENT_FILE, EnrollmentRecord
from agent.errors import CallFailed, EnrollmentFailed
from agent.protocol.handlers import Route, Routes
from tests.credentials._helpers import CLUSTER, Cloudly, cloudly_side
from tests.session._helpers import Body

BEARERS = {"node-a": "bearer-a-SENTINEL-0f3e"}


def _replacing(routes: Routes, method: str, handler: Any) -> Routes:
    """`routes` with `method`'s handler wrapped by `handler(original) -> new handler`."""
    return Routes(
        Route(route.method, route.request, handler(route.handler))
        if route.method == method
        else route
        for route in routes
    )


async def test_a_fresh_agent_enrolls_and_records_the_recipient(tmp_path: Path) -> None:
    """begin -> challenge opened -> complete: the record names the recipient Cloudly now knows,
    for this key and cluster, and is on disk before it is used."""
    async with cloudly_side(tmp_path, BEARERS) as cloudly:
        record = await cloudly.enrollment.ensure(cloudly.peer, CLUSTER)
        assert cloudly.kinds() == ["enrollment-begun", "recipient-enrolled"]
        assert cloudly.authority.recipients == (record.recipient_id,)
        assert cloudly.authority.recipient_key(record.recipient_id) == cloudly.keys.key.public_bytes
        saved = json.loads((tmp_path / ENROLLMENT_FILE).read_text())
    assert saved["recipientId"] == record.recipient_id
    assert (saved["clusterId"], saved["publicKey"]) == (CLUSTER, cloudly.keys.key.public_key)
    assert record.enrolled_at == 1_700_000_000_000


async def test_an_enrolled_agent_asks_nothing(tmp_path: Path) -> None:
    """With a usable record, ensure() returns it without calling Cloudly."""
    async with cloudly_side(tmp_path, BEARERS) as cloudly:
        first = await cloudly.enrollment.ensure(cloudly.peer, CLUSTER)
        again = await cloudly.enrollment.ensure(cloudly.peer, CLUSTER)
        assert again == first
        assert cloudly.count("enrollment-begun") == 1


async def test_a_record_for_another_cluster_or_expiring_soon_enrolls_again(tmp_path: Path) -> None:
    """Another cluster's record, or one with less than a minute left, is not used."""
    async with cloudly_side(tmp_path, BEARERS, recipient_lifetime_s=3600.0) as cloudly:
        await cloudly.enrollment.ensure(cloudly.peer, CLUSTER)
        cloudly.clock.advance(3600.0 - 59.0)
        renewed = await cloudly.enrollment.ensure(cloudly.peer, CLUSTER)
        assert cloudly.count("recipient-enrolled") == 2
        cloudly.keys.save_enrollment(
            EnrollmentRecord("cluster-2", "r-9", cloudly.keys.key.public_key, None, 0)
        )
        other = await cloudly.enrollment.ensure(cloudly.peer, CLUSTER)
        assert cloudly.count("recipient-enrolled") == 3
    assert renewed.expires_at == 1_700_000_000_000 + (3600 - 59) * 1000 + 3_600_000
    assert other.recipient_id not in (renewed.recipient_id, "r-9")


async def test_concurrent_askers_replacing_one_recipient_enroll_once(tmp_path: Path) -> None:
    """Five tasks told `unknown-recipient` for the same recipient: one enrollment, one answer."""
    async with cloudly_side(tmp_path, BEARERS) as cloudly:
        first = await cloudly.enrollment.ensure(cloudly.peer, CLUSTER)
        records = await asyncio.gather(
            *(
                cloudly.enrollment.ensure(cloudly.peer, CLUSTER, replacing=first.recipient_id)
                for _ in range(5)
            )
        )
        assert cloudly.count("recipient-enrolled") == 2
    assert len({record.recipient_id for record in records}) == 1
    assert records[0].recipient_id != first.recipient_id


async def test_a_challenge_that_does_not_open_fails_and_records_nothing(tmp_path: Path) -> None:
    """A challenge sealed for another enrollment binding: EnrollmentFailed; no complete is sent,
    no record written."""

    def swap_id(handler: Any) -> Any:
        async def begin(request: Any, ctx: Any) -> Any:
            answer = await handler(request, ctx)
            return answer.model_copy(update={"enrollment_id": "enrollment-elsewhere"})

        return begin

    async with cloudly_side(
        tmp_path, BEARERS, edit=lambda r: _replacing(r, METHOD_BEGIN_ENROLLMENT, swap_id)
    ) as cloudly:
        with pytest.raises(EnrollmentFailed, match="does not open with the agent's key"):
            await cloudly.enrollment.ensure(cloudly.peer, CLUSTER)
        assert cloudly.kinds() == ["enrollment-begun"]
    assert not (tmp_path / ENROLLMENT_FILE).exists()


async def test_a_refused_completion_fails_and_records_nothing(tmp_path: Path) -> None:
    """Cloudly refuses the completion: EnrollmentFailed with its (scrubbed) text; no record."""

    def refuse(handler: Any) -> Any:
        async def complete(request: Any, ctx: Any) -> Any:
            raise EnrollmentFailed("enrollment window closed")

        return complete

    async with cloudly_side(
        tmp_path, BEARERS, edit=lambda r: _replacing(r, METHOD_COMPLETE_ENROLLMENT, refuse)
    ) as cloudly:
        with pytest.raises(EnrollmentFailed) as caught:
            await cloudly.enrollment.ensure(cloudly.peer, CLUSTER)
    assert str(caught.value) == (
        f"Cloudly refused {METHOD_COMPLETE_ENROLLMENT}: enrollment window closed"
    )
    assert isinstance(caught.value.__cause__, CallFailed)
    assert not (tmp_path / ENROLLMENT_FILE).exists()


async def test_an_unusable_answer_fails_naming_the_field(tmp_path: Path) -> None:
    """An answer without `recipientId`: EnrollmentFailed naming the field path."""

    def drop_recipient(handler: Any) -> Any:
        async def complete(request: Any, ctx: Any) -> Any:
            await handler(request, ctx)
            return Body.model_validate({})

        return complete

    async with cloudly_side(
        tmp_path, BEARERS, edit=lambda r: _replacing(r, METHOD_COMPLETE_ENROLLMENT, drop_recipient)
    ) as cloudly:
        with pytest.raises(EnrollmentFailed) as caught:
            await cloudly.enrollment.ensure(cloudly.peer, CLUSTER)
    assert str(caught.value) == (
        f"the {METHOD_COMPLETE_ENROLLMENT} answer is unusable: recipientId: Field required"
    )


# --- Cloudly's side is replay-safe ---------------------------------------------------------------


async def _begin(cloudly: Cloudly) -> tuple[str, str]:
    """Begin an enrollment and open its challenge: (enrollmentId, opened challenge)."""
    key = cloudly.keys.key
    reply = await cloudly.peer.call(
        METHOD_BEGIN_ENROLLMENT, {"kemId": 32, "publicKey": key.public_key}, timeout=5.0
    )
    offer = read_answer(METHOD_BEGIN_ENROLLMENT, reply, BeginEnrollmentResponse)
    info = challenge_info(CLUSTER, offer.enrollment_id, key.public_bytes)
    return offer.enrollment_id, b64url(open_challenge(offer.challenge, key.private_key, info))


async def test_a_replayed_completion_gets_the_same_recipient(tmp_path: Path) -> None:
    """The same complete request twice (its answer was lost): the same recipient, enrolled
    once."""
    async with cloudly_side(tmp_path, BEARERS) as cloudly:
        enrollment_id, challenge = await _begin(cloudly)
        body = {"enrollmentId": enrollment_id, "challenge": challenge}
        first = await cloudly.peer.call(METHOD_COMPLETE_ENROLLMENT, body, timeout=5.0)
        again = await cloudly.peer.call(METHOD_COMPLETE_ENROLLMENT, body, timeout=5.0)
        assert first == again
        assert cloudly.count("recipient-enrolled") == 1
        assert cloudly.count("enrollment-replayed") == 1


async def test_a_wrong_proof_burns_the_enrollment(tmp_path: Path) -> None:
    """A wrong challenge is refused, and the right one afterwards too: one guess per challenge."""
    async with cloudly_side(tmp_path, BEARERS) as cloudly:
        enrollment_id, challenge = await _begin(cloudly)
        wrong = {"enrollmentId": enrollment_id, "challenge": b64url(bytes(32))}
        with pytest.raises(CallFailed) as guessed:
            await cloudly.peer.call(METHOD_COMPLETE_ENROLLMENT, wrong, timeout=5.0)
        right = {"enrollmentId": enrollment_id, "challenge": challenge}
        with pytest.raises(CallFailed) as after:
            await cloudly.peer.call(METHOD_COMPLETE_ENROLLMENT, right, timeout=5.0)
        assert cloudly.authority.recipients == ()
    assert guessed.value.error_data["code"] == "enrollment-proof-invalid"
    assert after.value.error_data["code"] == "enrollment-not-found"


async def test_an_expired_challenge_cannot_be_completed(tmp_path: Path) -> None:
    """A challenge answered after its expiry is refused (`enrollment-expired`)."""
    async with cloudly_side(tmp_path, BEARERS, enrollment_lifetime_s=60.0) as cloudly:
        enrollment_id, challenge = await _begin(cloudly)
        cloudly.clock.advance(61.0)
        body = {"enrollmentId": enrollment_id, "challenge": challenge}
        with pytest.raises(CallFailed) as caught:
            await cloudly.peer.call(METHOD_COMPLETE_ENROLLMENT, body, timeout=5.0)
    assert caught.value.error_data["code"] == "enrollment-expired"
