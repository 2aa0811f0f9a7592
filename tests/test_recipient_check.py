"""The periodic recipient check (agent/entry/credentials.py): while connected, every
`recipient_check_s`; after a retirement, again after a fifth of it, so a second agent with the
token shows sooner; a check that fails is no crash."""

from __future__ import annotations

import asyncio

from agent.entry.credentials import check_recipient
from agent.errors import CredentialUnavailable
from agent.watch.status import AgentStatus, SessionState
from tests.clock import ManualClock


class ScriptedProvider:
    """A fake SealedCredentials: each check answers the next scripted result."""

    def __init__(self, *answers: bool | Exception | None) -> None:
        self.answers = list(answers)
        self.checked = 0

    async def check_recipient(self) -> bool | None:
        self.checked += 1
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def _connected() -> AgentStatus:
    status = AgentStatus()
    for state in (SessionState.CONNECTING, SessionState.AUTHENTICATING, SessionState.CONNECTED):
        status.move_to(state)
    return status


async def _delays(provider: ScriptedProvider, status: AgentStatus, checks: int) -> list[float]:
    """The delays slept until `checks` checks ran and the next one waits."""
    clock = ManualClock(start=0.0)
    task = asyncio.create_task(check_recipient(provider, status, 15.0, clock))  # type: ignore[arg-type]
    try:
        for _ in range(checks):  # each wake-up is one check
            await clock.run_until_sleeping()
        await clock.next_wakeup()  # the sleep after the last check
    finally:
        task.cancel()
    return clock.slept


async def test_a_retired_recipient_is_checked_again_after_a_fifth_of_the_interval() -> None:
    provider = ScriptedProvider(True, False, True, None)
    assert await _delays(provider, _connected(), 4) == [15.0, 15.0, 3.0, 15.0, 15.0]


async def test_a_check_that_failed_is_no_crash_and_the_next_comes_at_the_interval() -> None:
    provider = ScriptedProvider(CredentialUnavailable("no session"), True)
    assert await _delays(provider, _connected(), 2) == [15.0, 15.0, 15.0]
