"""CorestoreClients: one client per node and endpoint, each with its node's credential, closing on
shutdown."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agent.corestore import CorestoreClient, CorestoreClients, DeleteOutcome
from agent.corestore.credentials import FixedCredentials
from agent.corestore.routes import RouteName
from agent.errors import LocalProtocolError, NodeWithoutCorestore, ShuttingDown
from agent.secret import Secret
from devstack.corestore import CorestoreHandle, start


class PerNode:
    """A credential source with one credential per node; records what it was asked."""

    def __init__(self, credentials: dict[str, Secret]) -> None:
        self.credentials = credentials
        self.asked: list[str] = []

    async def credential(self, node_id: str) -> Secret:
        self.asked.append(node_id)
        return self.credentials[node_id]

    def invalidate(self, node_id: str, rejected: Secret) -> None:
        del node_id, rejected


@pytest.fixture
async def second(tmp_path: Path) -> AsyncIterator[CorestoreHandle]:
    """A second node's reference Corestore, with a bearer of its own."""
    async with await start(data_dir=tmp_path / "second", bearer="second-node-bearer") as handle:
        yield handle


def test_one_node_at_one_endpoint_gets_one_client() -> None:
    """The engine asking twice for a node's client gets the same one; another node, or the
    same node at a new endpoint (it moved), gets another."""
    clients = CorestoreClients(credentials=FixedCredentials(Secret("a")))
    first = clients.client_for("node-1", "http://10.0.0.1:3000")
    assert clients.client_for("node-1", "http://10.0.0.1:3000") is first
    assert clients.client_for("node-2", "http://10.0.0.1:3000") is not first
    assert clients.client_for("node-1", "http://10.0.0.9:3000") is not first
    assert len(clients) == 3


async def test_each_client_sends_its_own_nodes_credential(
    corestore: CorestoreHandle, second: CorestoreHandle, bearer: Secret, grant: Secret
) -> None:
    """Two nodes, two Corestores, two bearers: each client asks the source for its node's
    credential before the call, and each Corestore accepts it."""
    source = PerNode({"node-1": bearer, "node-2": Secret("second-node-bearer")})
    clients = CorestoreClients(credentials=source)
    try:
        for node, handle in (("node-1", corestore), ("node-2", second)):
            client = clients.client_for(node, handle.url)
            outcome = await client.delete_staging_archive("archive-1", grant)
            assert outcome is DeleteOutcome.ALREADY_ABSENT
            assert handle.faults.hits[RouteName.DELETE_STAGING_ARCHIVE] == 1
    finally:
        await clients.close()
    assert source.asked == ["node-1", "node-2"]


async def test_a_route_without_bearer_asks_for_no_credential(corestore: CorestoreHandle) -> None:
    """`/health` carries no credential, so it never makes the source fetch one."""
    source = PerNode({})
    clients = CorestoreClients(credentials=source)
    try:
        assert (await clients.client_for("node-1", corestore.url).health()).status == "ok"
    finally:
        await clients.close()
    assert source.asked == []


@pytest.mark.parametrize(
    "endpoint",
    [
        "http://10.0.0.1:3000/api",
        "ftp://10.0.0.1",
        "http://user:pw@10.0.0.1:3000",
        "http://10.0.0.1:3000?x=1",
        "not a url",
    ],
)
def test_an_endpoint_that_is_no_origin_is_refused(endpoint: str) -> None:
    """Only a canonical http(s) origin is dialled."""
    with pytest.raises(NodeWithoutCorestore):
        CorestoreClient(endpoint, Secret("a"))


def test_a_credential_that_cannot_be_a_header_is_refused_without_quoting_it() -> None:
    """A credential with a newline would split the header: refused, not echoed."""
    with pytest.raises(LocalProtocolError, match="header-safe") as caught:
        CorestoreClient("http://10.0.0.1:3000", Secret("bad\nvalue"))
    assert "bad" not in str(caught.value)


async def test_a_sourced_credential_that_cannot_be_a_header_is_refused_before_sending(
    corestore: CorestoreHandle, grant: Secret
) -> None:
    """A source handing out a credential with a newline: refused before any byte is sent."""
    clients = CorestoreClients(credentials=PerNode({"node-1": Secret("bad\nvalue")}))
    try:
        client = clients.client_for("node-1", corestore.url)
        with pytest.raises(LocalProtocolError, match="header-safe") as caught:
            await client.object_progress("archive-1", "a/b.bin", grant)
    finally:
        await clients.close()
    assert "bad" not in str(caught.value)
    assert corestore.faults.hits[RouteName.OBJECT_PROGRESS] == 0


async def test_close_closes_every_client_and_refuses_new_ones(world: Any, bearer: Secret) -> None:
    """After close, neither the registry nor its clients take work."""
    clients = CorestoreClients(credentials=FixedCredentials(bearer))
    client = clients.client_for("node-1", world.corestore.url)
    assert (await client.health()).status == "ok"
    await clients.close()
    with pytest.raises(ShuttingDown):
        await client.health()
    with pytest.raises(ShuttingDown):
        clients.client_for("node-1", world.corestore.url)


async def test_discard_closes_one_client(world: Any, bearer: Secret) -> None:
    """A node that left the cluster loses its client; it gets a fresh one after."""
    clients = CorestoreClients(credentials=FixedCredentials(bearer))
    old = clients.client_for("node-1", world.corestore.url)
    await old.health()
    await clients.discard("node-1", world.corestore.url)
    fresh = clients.client_for("node-1", world.corestore.url)
    assert fresh is not old
    assert (await fresh.health()).status == "ok"
    await clients.close()
