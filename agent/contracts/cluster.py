"""Identity, cluster configuration, and where each node's Corestore answers.

- `IdentityCredential` / `Identity` and the `getIdentityByToken`, `getClusterConfig` and
  `pushClusterConfig` bodies (seed 000, wire.md §5.3). The JWT and the machine token are `Secret`s;
  `revealed_wire()` is the one way they reach the wire. `SetTagRequest` is the connection's tag
  (`__typedsocket_setTag`, typedsocket 4.x).
- `ClusterDocument` / `NodeDocument`: tolerant pass-through documents; the agent reads the cluster
  `id`, `data.nodes[]`, each node's `id` and `data.corestore`, and keeps everything else verbatim.
- `validate_cluster_node_corestore()`: seed 001's `validateClusterNodeCorestore`, same rules and
  messages, with WHATWG URL semantics from `ada_url` (the parser Node's `URL` is built on).
- `read_cluster_view()`: the routing view the engine uses: node id -> validated endpoint or the
  reasons there is none. Never a guessed endpoint.

What the agent USES of Cloudly's answers is read with tolerant models (`TokenAnswer`,
`TagAnswer`, `ClusterConfigAnswer`, `ClusterConfigPush`): exactly the fields the agent needs are
required and typed, anything else may be missing or extra. The exact seed shapes
(`GetIdentityByTokenResponse`, `GetClusterConfigResponse`, ...) stay, to name how an answer
deviates from the contract (`contract_deviation()`), which the session logs once: a Cloudly
that leaves out `services`, which the agent does not use, must not keep it from working.

Decisions:

- `Identity` ignores fields it does not know instead of refusing them: the seed defines it exactly,
  but Cloudly may add fields, and refusing its identity would stop the agent from authenticating
  at all. Unknown fields are dropped rather than kept because the agent never sends an `Identity`
  back (`getClusterConfig` takes only the JWT) and an unknown field may be a credential that must
  not end up in a log.
- A node id that appears more than once in the cluster document routes nowhere: its view has no
  endpoint and says why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

import ada_url
from pydantic import ConfigDict, ValidationError

from agent.contracts.backup import Identifier, PassThroughDocument
from agent.contracts.base import NonNegativeSafeInt, WireModel, first_problem
from agent.contracts.relay import Service
from agent.errors import NodeWithoutCorestore, UnknownNode
from agent.secret import Secret

__all__ = [
    "MAX_CORESTORE_ENDPOINT_LENGTH",
    "METHOD_GET_CLUSTER_CONFIG",
    "METHOD_GET_IDENTITY_BY_TOKEN",
    "METHOD_PUSH_CLUSTER_CONFIG",
    "METHOD_SET_TAG",
    "ClusterConfigAnswer",
    "ClusterConfigPush",
    "ClusterData",
    "ClusterDocument",
    "ClusterView",
    "GetClusterConfigRequest",
    "GetClusterConfigResponse",
    "GetIdentityByTokenRequest",
    "GetIdentityByTokenResponse",
    "Identity",
    "IdentityCredential",
    "NodeData",
    "NodeDocument",
    "NodeView",
    "PushClusterConfigRequest",
    "PushClusterConfigResponse",
    "SetTagRequest",
    "TagAnswer",
    "TokenAnswer",
    "UsedIdentity",
    "contract_deviation",
    "read_cluster_view",
    "validate_cluster_node_corestore",
]

METHOD_GET_IDENTITY_BY_TOKEN = "getIdentityByToken"  # noqa: S105 -- a method name, not a token
METHOD_GET_CLUSTER_CONFIG = "getClusterConfig"
METHOD_PUSH_CLUSTER_CONFIG = "pushClusterConfig"
METHOD_SET_TAG = "__typedsocket_setTag"

MAX_CORESTORE_ENDPOINT_LENGTH = 2048


# --- identity -----------------------------------------------------------------------------------


class IdentityCredential(WireModel):
    """`IIdentityCredential`: the JWT alone."""

    jwt: Secret


class Identity(WireModel):
    """`IIdentity`, tolerant of fields Cloudly may add (they are dropped, see the module doc)."""

    model_config = ConfigDict(extra="ignore")

    name: str
    user_id: str
    type: Literal["machine", "human"]
    role: Literal["admin", "user", "api", "cluster"]
    expires_at: NonNegativeSafeInt
    jwt: Secret

    def credential(self) -> IdentityCredential:
        """The JWT-only credential `getClusterConfig` takes."""
        return IdentityCredential(jwt=self.jwt)


class GetIdentityByTokenRequest(WireModel):
    """`getIdentityByToken` request: the cluster's machine token."""

    token: Secret

    def revealed_wire(self) -> dict[str, Any]:
        """The wire body with the token itself: only for sending it to Cloudly."""
        return {"token": self.token.reveal()}


class GetIdentityByTokenResponse(WireModel):
    """`getIdentityByToken` response."""

    identity: Identity


class SetTagRequest(WireModel):
    """`__typedsocket_setTag {name, payload}` (typedsocket 4.x): the connection's tag. Its
    answer is `{success}` (`TagAnswer`)."""

    name: str
    payload: Any = None


# --- cluster and node documents -----------------------------------------------------------------


class NodeData(PassThroughDocument):
    """`IClusterNode.data`; `corestore` stays raw here and is judged by the validator."""


class NodeDocument(PassThroughDocument):
    """`IClusterNode`."""

    id: Identifier
    data: NodeData


class ClusterData(PassThroughDocument):
    """`ICluster.data`."""

    nodes: list[NodeDocument]


class ClusterDocument(PassThroughDocument):
    """`ICluster`."""

    id: Identifier
    data: ClusterData


class GetClusterConfigRequest(WireModel):
    """`getClusterConfig` request: `{identity: {jwt}}`."""

    identity: IdentityCredential

    def revealed_wire(self) -> dict[str, Any]:
        """The wire body with the JWT itself: only for sending it to Cloudly."""
        return {"identity": {"jwt": self.identity.jwt.reveal()}}


class GetClusterConfigResponse(WireModel):
    """`getClusterConfig` response."""

    config_data: ClusterDocument
    services: list[Service]


class PushClusterConfigRequest(WireModel):
    """`pushClusterConfig` request (Cloudly -> agent)."""

    config_data: ClusterDocument
    services: list[Service]


class PushClusterConfigResponse(WireModel):
    """`pushClusterConfig` response: `{}`."""


# --- what the agent uses of Cloudly's answers ---------------------------------------------------


class _Used(WireModel):
    """The fields the agent reads; any other field may be missing or extra (and is dropped)."""

    model_config = ConfigDict(extra="ignore")


class UsedIdentity(_Used):
    """What the agent uses of an identity: the JWT it sends back, and when it expires."""

    expires_at: NonNegativeSafeInt
    jwt: Secret

    def credential(self) -> IdentityCredential:
        """The JWT-only credential `getClusterConfig` takes."""
        return IdentityCredential(jwt=self.jwt)


class TokenAnswer(_Used):
    """What the agent uses of the `getIdentityByToken` answer."""

    identity: UsedIdentity


class TagAnswer(_Used):
    """What the agent uses of the `__typedsocket_setTag` answer."""

    success: bool


class ClusterConfigAnswer(_Used):
    """What the agent uses of the `getClusterConfig` answer: the cluster document."""

    config_data: ClusterDocument


class ClusterConfigPush(PassThroughDocument):
    """What the agent uses of a `pushClusterConfig` request: the cluster document (the rest is
    kept, so the session can name how the request deviates from the contract)."""

    config_data: ClusterDocument


def contract_deviation(contract: type[WireModel], data: Any) -> tuple[str, str] | None:
    """How `data` deviates from the exact `contract` shape (field path, reason), or None.

    The reason never quotes the value (it may be a credential).
    """
    try:
        contract.from_wire(data)
    except ValidationError as exc:
        return first_problem(exc, root="answer")
    return None


# --- the Corestore endpoint rule (seed 001 `validateClusterNodeCorestore`) ----------------------


def _utf16_length(text: str) -> int:
    # JS `string.length` counts UTF-16 code units; an astral character counts twice.
    return len(text.encode("utf-16-le", "surrogatepass")) // 2


def _to_usv_string(text: str) -> str:
    # WebIDL hands `new URL()` a USVString: lone surrogates become U+FFFD, and a surrogate pair
    # held as two code points is one character.
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def validate_cluster_node_corestore(
    value: object, path: str = "cluster node corestore"
) -> list[str]:
    """Every reason `value` is not a valid `IClusterNodeCorestore`; empty when it is.

    Args:
        value: the node's `data.corestore` as decoded from JSON.
        path: how the messages name the value.

    Returns:
        The seed's messages: a plain object whose only key is `endpoint`, a string of 1 to 2048
        UTF-16 code units that parses as a URL, uses http or https, carries no userinfo and is
        its own canonical origin.
    """
    if type(value) is not dict or list(value) != ["endpoint"]:
        return [f"{path} must use its exact schema"]
    endpoint = value["endpoint"]
    if (
        not isinstance(endpoint, str)
        or not endpoint
        or _utf16_length(endpoint) > MAX_CORESTORE_ENDPOINT_LENGTH
    ):
        return [
            f"{path} endpoint must be a string of 1 to {MAX_CORESTORE_ENDPOINT_LENGTH} characters"
        ]
    try:
        parsed = ada_url.URL(_to_usv_string(endpoint))
    except ValueError:
        return [f"{path} endpoint must be a parsable URL"]
    errors: list[str] = []
    if parsed.protocol not in ("http:", "https:"):
        errors.append(f"{path} endpoint must use the http or https scheme")
    if parsed.username or parsed.password:
        errors.append(f"{path} endpoint must not carry userinfo")
    origin: str = parsed.origin
    if origin != endpoint:
        errors.append(
            f"{path} endpoint must be the canonical origin {origin}, "
            "without a path, query, fragment, trailing slash or default port"
        )
    return errors


# --- the routing view ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeView:
    """One node as the engine routes to it: an endpoint, or the reasons there is none."""

    node_id: str
    corestore_endpoint: str | None
    corestore_problems: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ClusterView:
    """The cluster the session serves: its id and its nodes by `IClusterNode.id`."""

    cluster_id: str
    nodes: Mapping[str, NodeView] = field(default_factory=lambda: MappingProxyType({}))

    def corestore_endpoint(self, node_id: str) -> str:
        """The validated Corestore endpoint of `node_id`.

        Raises:
            UnknownNode: the cluster document lists no such node.
            NodeWithoutCorestore: the node has no valid endpoint (the message says why).
        """
        node = self.nodes.get(node_id)
        if node is None:
            raise UnknownNode(f"cluster {self.cluster_id} has no node {node_id}")
        if node.corestore_endpoint is None:
            raise NodeWithoutCorestore(
                f"node {node_id} has no usable Corestore endpoint: "
                + "; ".join(node.corestore_problems),
                problems=list(node.corestore_problems),
            )
        return node.corestore_endpoint


_ABSENT = object()


def _node_view(node: NodeDocument) -> NodeView:
    path = f"cluster node {node.id} corestore"
    corestore = (node.data.model_extra or {}).get("corestore", _ABSENT)
    if corestore is _ABSENT:
        return NodeView(node.id, None, (f"{path} is absent",))
    problems = validate_cluster_node_corestore(corestore, path)
    if problems:
        return NodeView(node.id, None, tuple(problems))
    assert isinstance(corestore, dict)  # the validator accepted it: a dict with a str endpoint
    endpoint: str = corestore["endpoint"]
    return NodeView(node.id, endpoint)


def read_cluster_view(config_data: Mapping[str, Any] | ClusterDocument) -> ClusterView:
    """The `ClusterView` of a cluster document (`getClusterConfig`/`pushClusterConfig` configData).

    Raises:
        pydantic.ValidationError: the document lacks a cluster id, `data.nodes`, or a node's `id`
            or `data`.
    """
    document = (
        config_data
        if isinstance(config_data, ClusterDocument)
        else ClusterDocument.model_validate(dict(config_data), by_name=False)
    )
    counts: dict[str, int] = {}
    for node in document.data.nodes:
        counts[node.id] = counts.get(node.id, 0) + 1
    nodes: dict[str, NodeView] = {}
    for node in document.data.nodes:
        if counts[node.id] > 1:
            problem = f"cluster node {node.id} appears {counts[node.id]} times in the cluster"
            nodes[node.id] = NodeView(node.id, None, (problem,))
        else:
            nodes[node.id] = _node_view(node)
    return ClusterView(document.id, MappingProxyType(nodes))
