"""A Corestore outage: idempotent calls ride it out up to the tolerance, the client says since
when Corestore is unavailable, and every answer is classified once.

The reference Corestore answers 503 (or drops the connection) for a number of requests; the
clients' clock is a `ManualClock` moved to each backoff's end at once (`clock.slept` keeps the
delays), so a two-minute outage takes no real time.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import pytest

from agent.corestore import CorestoreClient, routes
from agent.corestore.routes import RouteName
from agent.errors import CorestoreUnavailable
from agent.retry import Backoff, RetryPolicy
from agent.secret import Secret

DUMP = "snap-db-1/dump.bson"
# The agent's backoff (0.25 s doubling to 5 s, full jitter) with the draw fixed at the top of
# each window, and a two-minute tolerance: 3 resends, then more while the outage is young.
POLICY = RetryPolicy(attempts=4, backoff=Backoff(base=0.25, cap=5.0), tolerance=120.0)


class Outages:
    """A `CorestoreObserver` that keeps what it heard of availability."""

    def __init__(self) -> None:
        self.heard: list[tuple[str, float | None]] = []

    def corestore_answer(self, *, route: str, outcome: str, seconds: float) -> None:
        del route, outcome, seconds

    def corestore_resend(self, *, route: str) -> None:
        del route

    def credential_rejected(self) -> None:
        pass

    def corestore_unavailable(self, *, node: str, since: float | None) -> None:
        self.heard.append((node, since))


def client(corestore: Any, bearer: Secret, clock: Any, **kw: Any) -> CorestoreClient:
    return CorestoreClient(corestore.url, bearer, retry=POLICY, clock=clock, rng=lambda: 1.0, **kw)


async def test_a_status_poll_rides_out_twenty_503s(
    corestore: Any, bearer: Secret, clock: Any
) -> None:
    """Twenty 503s in a row (a Corestore restarting: about 80 s of backoff) and then an answer:
    the poll answers, where three resends used to end it `corestore-unavailable` after ~1.4 s."""
    corestore.faults.fail_next(RouteName.HEALTH, status=503, times=20)
    async with client(corestore, bearer, clock) as opened:
        health = await opened.health()
    assert health.status == "ok"
    assert corestore.faults.hits[RouteName.HEALTH] == 21
    assert len(clock.slept) == 20
    assert 60.0 < sum(clock.slept) < 120.0


async def test_an_outage_longer_than_the_tolerance_fails_the_call(
    corestore: Any, bearer: Secret, clock: Any
) -> None:
    """Corestore stays down: the call is resent until the outage is two minutes old, then it
    fails `corestore-unavailable` (retryable); a call made while the outage is older than the
    tolerance gives up after its `retries`."""
    corestore.faults.fail_next(RouteName.HEALTH, status=503, times=1000)
    async with client(corestore, bearer, clock) as opened:
        with pytest.raises(CorestoreUnavailable) as first:
            await opened.health()
        waited = sum(clock.slept)
        sends = corestore.faults.hits[RouteName.HEALTH]
        with pytest.raises(CorestoreUnavailable):
            await opened.health()
    assert (first.value.code, first.value.retryable) == ("corestore-unavailable", True)
    assert 120.0 <= waited < 120.0 + 5.0  # the last backoff may end past the tolerance
    assert corestore.faults.hits[RouteName.HEALTH] - sends == 4  # `attempts`, no more


async def test_a_call_that_is_not_idempotent_is_not_resent_in_an_outage(
    world: Any, corestore: Any, bearer: Secret, clock: Any
) -> None:
    """A commit is sent once whatever the tolerance (its outcome is checked, not resent)."""
    await world.prepare()
    await world.stage(DUMP, commit=False)
    corestore.faults.fail_next(RouteName.COMMIT_OBJECT, status=503)
    entry = world.entry(DUMP)
    async with client(corestore, bearer, clock) as opened:
        with pytest.raises(CorestoreUnavailable, match="attempt 1 of 1"):
            await opened.commit_object(
                world.archive, DUMP, entry["size"], entry["sha256"], world.grant
            )
    assert corestore.faults.hits[RouteName.COMMIT_OBJECT] == 1


async def test_the_client_says_since_when_corestore_is_unavailable(
    corestore: Any, bearer: Secret, clock: Any
) -> None:
    """The first attempt without an answer starts the outage (its wall time, told once); the
    next answer ends it (told as None)."""
    corestore.faults.fail_next(RouteName.HEALTH, status=503, times=3)
    corestore.faults.reset_next(RouteName.HEALTH, times=2)
    outages = Outages()
    started = clock.time()
    async with client(corestore, bearer, clock, observer=outages) as opened:
        await opened.health()
        after = opened.unavailable_since
    assert outages.heard == [(corestore.url, started), (corestore.url, None)]
    assert after is None


async def test_an_outage_is_told_while_it_lasts(corestore: Any, bearer: Secret, clock: Any) -> None:
    """While Corestore gives no answer the client's `unavailable_since` names its start."""
    corestore.faults.fail_next(RouteName.HEALTH, status=503, times=1000)
    outages = Outages()
    started = clock.time()
    async with client(corestore, bearer, clock, observer=outages) as opened:
        with pytest.raises(CorestoreUnavailable):
            await opened.health()
        assert opened.unavailable_since == started
    assert outages.heard == [(corestore.url, started)]


def counting(monkeypatch: pytest.MonkeyPatch, name: str) -> list[tuple[Any, ...]]:
    """Count the calls of `routes.<name>` (the transport and the client call it there)."""
    calls: list[tuple[Any, ...]] = []
    real: Callable[..., Any] = getattr(routes, name)

    def spy(*args: Any) -> Any:
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(routes, name, spy)
    return calls


async def test_an_answer_is_classified_once_and_a_2xx_body_is_never_parsed_as_an_error(
    world: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One chunk PUT answered 200: its answer is judged once, and no error parse runs on it (it
    used to be judged twice, with a failing error parse on every success)."""
    await world.prepare()
    chunk = world.objects[DUMP][:4096]
    sha256 = hashlib.sha256(chunk).hexdigest()
    judged, parsed = counting(monkeypatch, "classify_answer"), counting(monkeypatch, "parse_error")
    await world.client.put_chunk(world.archive, DUMP, 0, chunk, sha256, world.grant)
    assert (len(judged), len(parsed)) == (1, 0)


async def test_an_error_answer_is_parsed_once(world: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A delete of something absent (404 with Corestore's code): one parse, one judgement."""
    await world.prepare()
    judged, parsed = counting(monkeypatch, "classify_answer"), counting(monkeypatch, "parse_error")
    await world.client.delete_object(world.archive, DUMP, world.grant)
    assert (len(judged), len(parsed)) == (1, 1)
