"""`Handouts`: every answer the relay's runner gives, noted where it went and its delivery
recorded.

An answer (a run's outcome, joined or not, or a recorded one) that was recorded is noted with
the connection its request arrived on (`Requester.arrival`; a restore's, in the runner's
`AnswerBook`), and the requester is asked to say when a pong confirmed it
(`Requester.on_delivered`). A confirmation is noted too, and recorded in the store
(`delivered_at`, which survives a restart) as a task of the runner's `TaskOwner`. No request
waits for a pong: the verdict never rests on how fast Cloudly's websocket reads one.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import Protocol

import structlog

from agent.domain.jobs import JobKey
from agent.errors import AgentError, ShuttingDown
from agent.owner import TaskOwner
from agent.protocol.delivery import Mark
from agent.relay.answers import AnswerBook
from agent.relay.execution import Answered, job_fields
from agent.store import RevisionStore

__all__ = ["Handouts", "Requester"]

# The records keep the runner's name: an operator follows one job under one logger.
_log = structlog.get_logger("agent.relay.runner")


class Requester(Protocol):
    """What the runner needs of the request it answers (`RequestContext` has it)."""

    @property
    def arrival(self) -> Mark:
        """Where the request arrived on the session (its connection's number, from 1)."""
        ...

    def on_delivered(self, callback: Callable[[Mark], None]) -> None:
        """Have `callback` told once a pong confirmed the answer reached Cloudly."""
        ...


class Handouts:
    """Notes where answers went in `answers` and records their confirmations in `store`, in
    tasks of `owner`."""

    def __init__(self, store: RevisionStore, answers: AnswerBook, owner: TaskOwner) -> None:
        self._store = store
        self._answers = answers
        self._owner = owner

    def hand_out(self, answered: Answered, requester: Requester) -> None:
        """The answer goes to `requester`: note on which connection (a restore's), and have a
        pong's confirmation recorded."""
        if answered.revision is None:
            return  # nothing recorded: nothing to be delivered
        if answered.key.kind == "restore":
            self._answers.given(answered.key, answered.revision, requester.arrival.connection)
        requester.on_delivered(
            functools.partial(self._on_delivered, answered.key, answered.revision)
        )

    def _on_delivered(self, key: JobKey, revision: int, mark: Mark) -> None:
        """A pong confirmed the answer the job gave at `revision`: remember it (a restore's,
        for its service's next request) and record it."""
        del mark  # where it was confirmed no longer matters: that it was does
        if key.kind == "restore":
            self._answers.confirmed(key, revision)
        # Once the runner stops it is not recorded: after the restart the answer counts as
        # unconfirmed, and the identical request is then taken for a repeat of a lost answer.
        with contextlib.suppress(ShuttingDown):
            _ = self._owner.spawn(self._record_delivery(key, revision), name="relay-delivered")

    async def _record_delivery(self, key: JobKey, revision: int) -> None:
        try:
            if await self._store.mark_delivered(key, revision=revision):
                _log.debug("relay_job_delivered", **job_fields(key), revision=revision)
        except AgentError as exc:  # kept in memory; after a restart it counts as unconfirmed
            _log.warning("relay_job_delivery_unrecorded", **job_fields(key), code=exc.code)
