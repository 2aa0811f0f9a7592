"""Where a Corestore client gets the bearer it sends: per node, refreshed once when refused.

    CredentialSource    the per-node seam: `await credential(node_id) -> Secret` and
                        `invalidate(node_id, rejected)`. The agent's default is
                        `agent.credentials.provider.SealedCredentials` (fetched from Cloudly,
                        sealed to the agent's key); `FixedCredentials` is the development option
                        (`corestore.credential_source = "file"`) and the tests' stand-in.
    NodeCredential      one node's view of a source, which a `CorestoreClient` holds:
                        `current()` and `refresh(rejected)`.

The client asks `current()` before every authenticated call (the source caches; nothing here
does). When Corestore refuses the credential (`routes.is_credential_refusal`), the client asks
`refresh(rejected)` once and sends the call once more with what it gets; a second refusal, or a
refresh that yields the very credential just refused (a fixed one has nothing fresher), is
`CorestoreCredentialRejected`. So any number of concurrent calls that were refused together cost
the source one fetch (the source invalidates only the credential that was refused), and no peer
can make the agent loop. The relay package asks the same `CorestoreClients`, so it gets the same
per-node credentials and the same refresh rule without knowing where they come from.
"""

from __future__ import annotations

from typing import Protocol

from agent.secret import Secret

__all__ = ["CredentialSource", "FixedCredentials", "NodeCredential"]


class CredentialSource(Protocol):
    """Each node's Corestore control credential."""

    async def credential(self, node_id: str) -> Secret:
        """The credential to send to `node_id`'s Corestore (fetched if none is held).

        Raises a `CredentialError` (a `CorestoreError`) when it cannot be had.
        """
        ...

    def invalidate(self, node_id: str, rejected: Secret) -> None:
        """Corestore refused `rejected`: forget it if it is still the one held for `node_id`."""
        ...


class FixedCredentials:
    """One credential for every node: the file-based development option, and tests."""

    __slots__ = ("_credential",)

    def __init__(self, credential: Secret) -> None:
        self._credential = credential

    def __repr__(self) -> str:
        return "FixedCredentials(**********)"

    async def credential(self, node_id: str) -> Secret:
        """The one credential."""
        del node_id
        return self._credential

    def invalidate(self, node_id: str, rejected: Secret) -> None:
        """Nothing fresher exists: a refused fixed credential stays refused."""
        del node_id, rejected


class NodeCredential:
    """One node's credential from a source, as its Corestore client asks for it."""

    __slots__ = ("_node_id", "_source")

    def __init__(self, source: CredentialSource, node_id: str) -> None:
        self._source = source
        self._node_id = node_id

    @classmethod
    def fixed(cls, credential: Secret) -> NodeCredential:
        """A node credential that is always `credential`."""
        return cls(FixedCredentials(credential), "")

    @property
    def node_id(self) -> str:
        """The node whose Corestore this credential is for."""
        return self._node_id

    def __repr__(self) -> str:
        return f"NodeCredential({self._node_id!r}, {self._source!r})"

    async def current(self) -> Secret:
        """The credential to send now."""
        return await self._source.credential(self._node_id)

    async def refresh(self, rejected: Secret) -> Secret:
        """The credential to send after Corestore refused `rejected`."""
        self._source.invalidate(self._node_id, rejected)
        return await self._source.credential(self._node_id)
