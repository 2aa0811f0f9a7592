"""`AnswerBook`: where the answer of each service's last restore run went, in this process.

The runner notes every answer it gives (`given`: on the connection its request arrived on), a
run that ended here before anyone was given its answer (`ended`), and a pong's confirmation
(`confirmed`); `fate(last, connection)` names where the answer of the service's last run went
for a request arriving on `connection` (`agent.domain.answer_fate`). It knows one run per
service, the latest it heard of: a note about an older run changes nothing. An earlier
process's run is known only by the store (`delivered_at`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.domain.answer_fate import AnswerFate, answer_fate
from agent.domain.jobs import JobKey, JobScope, StoredJob

__all__ = ["AnswerBook"]


@dataclass(slots=True)
class _Given:
    """Where the answer restore run `key` gave at `revision` went: the connections it was
    handed out on, and whether a pong confirmed it."""

    key: JobKey
    revision: int
    connections: set[int] = field(default_factory=set)
    confirmed: bool = False


class AnswerBook:
    """Where each service's last restore run's answer went (module docstring)."""

    def __init__(self) -> None:
        self._runs: dict[JobScope, _Given] = {}

    def ended(self, key: JobKey, revision: int) -> None:
        """Run `key` recorded its outcome at `revision` here; nobody was given it yet."""
        self._at(key, revision)

    def given(self, key: JobKey, revision: int, connection: int) -> None:
        """The answer run `key` gave at `revision` was handed out on `connection`."""
        if (run := self._at(key, revision)) is not None:
            run.connections.add(connection)

    def confirmed(self, key: JobKey, revision: int) -> None:
        """A pong confirmed the answer run `key` gave at `revision`."""
        if (run := self._at(key, revision)) is not None:
            run.confirmed = True

    def fate(self, last: StoredJob, connection: int) -> AnswerFate:
        """Where the answer of `last` (the service's last run, as recorded now) went, for a
        request arriving on `connection`."""
        run = self._runs.get(last.key.scope)
        if run is None or (run.key, run.revision) != (last.key, last.revision):
            return answer_fate(
                confirmed=last.delivered_at is not None, given_on=None, connection=connection
            )
        return answer_fate(
            confirmed=run.confirmed or last.delivered_at is not None,
            given_on=run.connections,
            connection=connection,
        )

    def _at(self, key: JobKey, revision: int) -> _Given | None:
        """The entry of run `key` at `revision` (made now if new); None when its service has a
        later run already."""
        run = self._runs.get(key.scope)
        if run is not None and (run.key, run.revision) == (key, revision):
            return run
        if run is not None and (run.key.run, run.revision) > (key.run, revision):
            return None
        run = self._runs[key.scope] = _Given(key, revision)
        return run
