"""CorestoreClients: one client per node endpoint, credential rotation, closing on shutdown."""

from __future__ import annotations

from typing import Any

import pytest

from agent.corestore import CorestoreClient, CorestoreClients
from agent.errors import LocalProtocolError, NodeWithoutCorestore, ShuttingDown
from agent.secret import Secret


def test_one_endpoint_gets_one_client() -> None:
    """The engine asking twice for a node's client gets the same one."""
    clients = CorestoreClients()
    first = clients.client_for("http://10.0.0.1:3000", Secret("a"))
    assert clients.client_for("http://10.0.0.1:3000", Secret("a")) is first
    assert clients.client_for("http://10.0.0.2:3000", Secret("a")) is not first
    assert len(clients) == 2


def test_a_rotated_credential_replaces_the_old_one() -> None:
    """A new credential for a known endpoint is used from the next request on."""
    clients = CorestoreClients()
    client = clients.client_for("http://10.0.0.1:3000", Secret("old-credential"))
    clients.client_for("http://10.0.0.1:3000", Secret("new-credential"))
    assert client.credential == Secret("new-credential")


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


async def test_close_closes_every_client_and_refuses_new_ones(world: Any, bearer: Secret) -> None:
    """After close, neither the registry nor its clients take work."""
    clients = CorestoreClients()
    client = clients.client_for(world.corestore.url, bearer)
    assert (await client.health()).status == "ok"
    await clients.close()
    with pytest.raises(ShuttingDown):
        await client.health()
    with pytest.raises(ShuttingDown):
        clients.client_for(world.corestore.url, bearer)


async def test_discard_closes_one_client(world: Any, bearer: Secret) -> None:
    """A node that left the cluster loses its client; the endpoint gets a fresh one after."""
    clients = CorestoreClients()
    old = clients.client_for(world.corestore.url, bearer)
    await old.health()
    await clients.discard(world.corestore.url)
    fresh = clients.client_for(world.corestore.url, bearer)
    assert fresh is not old
    assert (await fresh.health()).status == "ok"
    await clients.close()
