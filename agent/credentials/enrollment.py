"""Enrolling the agent's X25519 recipient with Cloudly (docs/credentials.md, "Enrollment").

    beginSecretRecipientEnrollment {kemId, publicKey}
        <- {enrollmentId, challenge (sealed to publicKey), expiresAt}
    the agent opens the challenge with its private key (the proof it holds it)
    completeSecretRecipientEnrollment {enrollmentId, challenge (opened)}
        <- {recipientId, expiresAt?}
    the record is written to the state directory, then used

The session runs `ensure()` after authentication on every connect (it enrolls only when the
record is missing, for another key or cluster, or expires within a minute); the credential
provider runs it again when Cloudly answers `unknown-recipient`, naming the recipient it
replaces, so concurrent askers enroll once. Replay-safe: begin only creates a pending,
expiring, single-use challenge on Cloudly's side; an attempt that breaks anywhere leaves nothing
recorded here and the next attempt begins afresh. A refused or unusable step raises
`EnrollmentFailed` (a session error: the session reconnects with backoff).
"""

from __future__ import annotations

import asyncio
from typing import Any, Final, TypeVar

import structlog
from pydantic import ValidationError

from agent.clock import SYSTEM_CLOCK, Clock, epoch_ms
from agent.contracts.base import WireModel, first_problem
from agent.contracts.credentials import (
    METHOD_BEGIN_ENROLLMENT,
    METHOD_COMPLETE_ENROLLMENT,
    BeginEnrollmentRequest,
    BeginEnrollmentResponse,
    CompleteEnrollmentRequest,
    CompleteEnrollmentResponse,
    b64url,
)
from agent.credentials.binding import challenge_info, open_challenge
from agent.credentials.hpke import KEM_X25519_HKDF_SHA256
from agent.credentials.keys import EnrollmentRecord, KeyStore
from agent.errors import CallFailed, EnrollmentFailed, SealedMaterialRefused
from agent.log import scrub_text
from agent.protocol.handlers import Caller

__all__ = ["Enrollment", "read_answer"]

_log = structlog.get_logger("agent.credentials.enrollment")

# An enrollment that expires sooner than this is renewed now rather than mid-restore.
RENEW_MARGIN_MS: Final = 60_000

_Answer = TypeVar("_Answer", bound=WireModel)


def read_answer(method: str, data: Any, model: type[_Answer]) -> _Answer:
    """`data` as `model`; ValueError naming the field path (never the value) if it is not."""
    try:
        return model.from_wire(data)
    except ValidationError as exc:
        path, reason = first_problem(exc, root="answer")
        raise ValueError(f"the {method} answer is unusable: {path}: {reason}") from None


class Enrollment:
    """The agent's recipient enrollment: the record in the state directory, kept current."""

    def __init__(
        self, keys: KeyStore, *, call_timeout: float = 30.0, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self._keys = keys
        self._call_timeout = call_timeout
        self._clock = clock
        self._lock = asyncio.Lock()

    def current(self, cluster_id: str) -> EnrollmentRecord | None:
        """The enrollment that serves `cluster_id` now, None if there is none."""
        record = self._keys.enrollment
        now = epoch_ms(self._clock)
        if record is None or not record.usable(cluster_id, self._keys.key, now, RENEW_MARGIN_MS):
            return None
        return record

    async def ensure(
        self, caller: Caller, cluster_id: str, *, replacing: str | None = None
    ) -> EnrollmentRecord:
        """The current enrollment for `cluster_id`, enrolling first if there is none (or if
        it is `replacing`, a recipient Cloudly said it does not know)."""
        async with self._lock:
            record = self.current(cluster_id)
            if record is not None and record.recipient_id != replacing:
                return record
            return await self._enroll(caller, cluster_id)

    async def _enroll(self, caller: Caller, cluster_id: str) -> EnrollmentRecord:
        key = self._keys.key
        begin = BeginEnrollmentRequest(kem_id=KEM_X25519_HKDF_SHA256, public_key=key.public_key)
        offer = await self._call(
            caller, METHOD_BEGIN_ENROLLMENT, begin.to_wire(), BeginEnrollmentResponse
        )
        info = challenge_info(cluster_id, offer.enrollment_id, key.public_bytes)
        try:
            challenge = open_challenge(offer.challenge, key.private_key, info)
        except SealedMaterialRefused as exc:
            raise EnrollmentFailed(
                f"the challenge of enrollment {offer.enrollment_id} does not open with the "
                f"agent's key for cluster {cluster_id}: {exc}"
            ) from exc
        complete = CompleteEnrollmentRequest(
            enrollment_id=offer.enrollment_id, challenge=b64url(challenge)
        )
        done = await self._call(
            caller, METHOD_COMPLETE_ENROLLMENT, complete.to_wire(), CompleteEnrollmentResponse
        )
        record = EnrollmentRecord(
            cluster_id=cluster_id,
            recipient_id=done.recipient_id,
            public_key=key.public_key,
            expires_at=done.expires_at,
            enrolled_at=epoch_ms(self._clock),
        )
        # Written before it is used: a recipient the agent would forget on a crash is one
        # Cloudly keeps sealing to.
        await asyncio.to_thread(self._keys.save_enrollment, record)
        _log.info(
            "recipient_enrolled",
            cluster_id=cluster_id,
            recipient_id=record.recipient_id,
            public_key=record.public_key,
            expires_at_ms=record.expires_at,
        )
        return record

    async def _call(
        self, caller: Caller, method: str, body: dict[str, Any], model: type[_Answer]
    ) -> _Answer:
        try:
            reply = await caller.call(method, body, timeout=self._call_timeout)
        except CallFailed as exc:
            raise EnrollmentFailed(f"Cloudly refused {method}: {scrub_text(exc.text)}") from exc
        try:
            return read_answer(method, reply, model)
        except ValueError as exc:
            raise EnrollmentFailed(str(exc)) from None
