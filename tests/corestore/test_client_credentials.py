"""A refused credential is fetched again once and the call sent once more; then a named error.

The refresh rule of `CorestoreClient` (agent/corestore/credentials.py), against the reference
Corestore whose accepted bearer a test rotates at runtime (`corestore.bearer.set`).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from agent.corestore import CorestoreClients
from agent.corestore.routes import RouteName
from agent.errors import CorestoreCredentialRejected, CorestoreRefused
from agent.secret import Secret
from devstack.corestore import CorestoreHandle

DUMP = "snap-db-1/dump.bson"
NODE = "node-1"


class Rotating:
    """A source that hands out `credentials` in turn: the next one after each invalidation."""

    def __init__(self, *credentials: str) -> None:
        self.credentials = [Secret(value) for value in credentials]
        self.fetched = 0
        self.invalidated: list[Secret] = []

    async def credential(self, node_id: str) -> Secret:
        assert node_id == NODE
        self.fetched += 1
        return self.credentials[0]

    def invalidate(self, node_id: str, rejected: Secret) -> None:
        assert node_id == NODE
        self.invalidated.append(rejected)
        if self.credentials[0] == rejected and len(self.credentials) > 1:
            self.credentials.pop(0)


@pytest.fixture
async def clients_of() -> AsyncIterator[Any]:
    """`clients_of(source)`: a registry on `source`, closed after the test."""
    made: list[CorestoreClients] = []

    def make(source: Rotating) -> CorestoreClients:
        made.append(CorestoreClients(credentials=source))
        return made[-1]

    yield make
    for clients in made:
        await clients.close()


def _chunk() -> tuple[bytes, str]:
    data = b"x" * 4096
    return data, hashlib.sha256(data).hexdigest()


async def test_a_rotated_bearer_is_fetched_again_once_and_the_call_succeeds(
    world: Any, corestore: CorestoreHandle, clients_of: Any, bearer: Secret
) -> None:
    """Corestore rotated its bearer: the first send is 401, the source is asked again (the
    refused credential named), the second send carries the new one and the chunk counts."""
    await world.prepare()
    corestore.bearer.set(Secret("rotated-bearer-value"))
    source = Rotating(bearer.reveal(), "rotated-bearer-value")
    client = clients_of(source).client_for(NODE, corestore.url)
    data, sha = _chunk()
    accepted = await client.put_chunk(world.archive, DUMP, 0, data, sha, world.grant)
    assert accepted.verified_bytes == len(data)
    assert corestore.faults.hits[RouteName.PUT_CHUNK] == 2
    assert (source.fetched, source.invalidated) == (2, [bearer])


async def test_a_credential_refused_again_after_the_refetch_is_a_named_error(
    world: Any, corestore: CorestoreHandle, clients_of: Any
) -> None:
    """The refetched credential is refused too: exactly two sends, one refetch, then
    `corestore-credential-rejected` (retryable); nothing written."""
    await world.prepare()
    source = Rotating("stale-bearer-value-1", "stale-bearer-value-2")
    client = clients_of(source).client_for(NODE, corestore.url)
    data, sha = _chunk()
    with pytest.raises(CorestoreCredentialRejected) as caught:
        await client.put_chunk(world.archive, DUMP, 0, data, sha, world.grant)
    assert str(caught.value) == (
        f"Corestore at {corestore.url} refused the control credential of node {NODE} on "
        "put-chunk with 401 unauthorized, also after fetching it again"
    )
    assert caught.value.data == {"httpStatus": 401, "corestoreCode": "unauthorized"}
    assert corestore.faults.hits[RouteName.PUT_CHUNK] == 2
    assert (source.fetched, len(source.invalidated)) == (2, 1)
    assert not world.staged_file(DUMP).exists()


class _Rejections:
    """A Corestore observer that counts only credential rejections."""

    def __init__(self) -> None:
        self.count = 0

    def corestore_answer(self, *, route: str, outcome: str, seconds: float) -> None:
        del route, outcome, seconds

    def corestore_resend(self, *, route: str) -> None:
        del route

    def credential_rejected(self) -> None:
        self.count += 1

    def corestore_unavailable(self, *, node: str, since: float | None) -> None:
        del node, since


async def test_a_credential_refused_for_good_is_reported_once(
    world: Any, corestore: CorestoreHandle
) -> None:
    """The observer hears one rejection per call refused after the refetch (the metrics'
    `restore_agent_corestore_credential_rejections_total`), none for the refusal the refetch
    answered."""
    await world.prepare()
    observer = _Rejections()
    clients = CorestoreClients(
        credentials=Rotating("stale-bearer-value-1", "stale-bearer-value-2"), observer=observer
    )
    try:
        client = clients.client_for(NODE, corestore.url)
        with pytest.raises(CorestoreCredentialRejected):
            await client.object_progress(world.archive, DUMP, world.grant)
    finally:
        await clients.close()
    assert observer.count == 1


async def test_a_source_with_nothing_fresher_costs_no_second_send(
    world: Any, corestore: CorestoreHandle, clients_of: Any
) -> None:
    """Refreshing yields the very credential just refused: no resend, the named error at once."""
    await world.prepare()
    source = Rotating("only-bearer-value")
    client = clients_of(source).client_for(NODE, corestore.url)
    with pytest.raises(CorestoreCredentialRejected, match="there is no other to try"):
        await client.object_progress(world.archive, DUMP, world.grant)
    assert corestore.faults.hits[RouteName.OBJECT_PROGRESS] == 1


async def test_a_grant_refusal_is_no_credential_refusal(
    world: Any, corestore: CorestoreHandle, clients_of: Any, bearer: Secret
) -> None:
    """403 `grant-refused` is the grant's fault: CorestoreRefused, the credential untouched."""
    await world.prepare()
    corestore.faults.fail_next(RouteName.OBJECT_PROGRESS, status=403, code="grant-refused")
    source = Rotating(bearer.reveal())
    client = clients_of(source).client_for(NODE, corestore.url)
    with pytest.raises(CorestoreRefused, match="403 grant-refused"):
        await client.object_progress(world.archive, DUMP, world.grant)
    assert (source.fetched, source.invalidated) == (1, [])
    assert corestore.faults.hits[RouteName.OBJECT_PROGRESS] == 1


async def test_a_403_without_a_grant_code_is_a_credential_refusal(
    world: Any, corestore: CorestoreHandle, clients_of: Any, bearer: Secret
) -> None:
    """403 `forbidden` (the bearer is not allowed): the credential is fetched again, once."""
    await world.prepare()
    corestore.faults.fail_next(RouteName.OBJECT_PROGRESS, status=403, code="forbidden")
    corestore.bearer.set(Secret("allowed-bearer-value"))
    source = Rotating(bearer.reveal(), "allowed-bearer-value")
    client = clients_of(source).client_for(NODE, corestore.url)
    progress = await client.object_progress(world.archive, DUMP, world.grant)
    assert progress.state == "absent"
    assert (source.fetched, source.invalidated) == (2, [bearer])
    assert corestore.faults.hits[RouteName.OBJECT_PROGRESS] == 2


async def test_a_refresh_serves_a_call_that_is_not_idempotent_once_more(
    world: Any, corestore: CorestoreHandle, clients_of: Any, bearer: Secret
) -> None:
    """A commit (never resent for availability) refused for its credential is sent once more:
    Corestore did nothing with the refused one."""
    await world.prepare()
    await world.stage(DUMP, commit=False)
    corestore.bearer.set(Secret("rotated-bearer-value"))
    source = Rotating(bearer.reveal(), "rotated-bearer-value")
    client = clients_of(source).client_for(NODE, corestore.url)
    entry = world.entry(DUMP)
    committed = await client.commit_object(
        world.archive, DUMP, entry["size"], entry["sha256"], world.grant
    )
    assert committed.sha256 == entry["sha256"]
    assert corestore.faults.hits[RouteName.COMMIT_OBJECT] == 2


async def test_concurrent_refused_calls_each_refresh_once(
    world: Any, corestore: CorestoreHandle, clients_of: Any, bearer: Secret
) -> None:
    """Four calls refused together: each sends at most twice, all succeed."""
    await world.prepare()
    corestore.bearer.set(Secret("rotated-bearer-value"))
    source = Rotating(bearer.reveal(), "rotated-bearer-value")
    client = clients_of(source).client_for(NODE, corestore.url)
    results = await asyncio.gather(
        *(client.object_progress(world.archive, DUMP, world.grant) for _ in range(4))
    )
    assert [result.state for result in results] == ["absent"] * 4
    assert 4 < corestore.faults.hits[RouteName.OBJECT_PROGRESS] <= 8
