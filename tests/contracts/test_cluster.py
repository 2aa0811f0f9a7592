"""Specification of `agent.contracts.cluster`: identities, cluster documents, the endpoint rule."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from pydantic import ValidationError

from agent.contracts.cluster import (
    ClusterDocument,
    GetClusterConfigRequest,
    GetClusterConfigResponse,
    GetIdentityByTokenRequest,
    GetIdentityByTokenResponse,
    Identity,
    IdentityCredential,
    NodeView,
    PushClusterConfigRequest,
    PushClusterConfigResponse,
    read_cluster_view,
    validate_cluster_node_corestore,
)
from agent.errors import NodeWithoutCorestore, UnknownNode
from agent.secret import MASK, Secret
from tests.contracts.node_oracle import NodeOracle
from tests.contracts.strategies import from_wire, json_values

FIXTURE = Path(__file__).parent / "fixtures" / "corestore_endpoint_cases.json"
CASES: list[dict[str, Any]] = json.loads(FIXTURE.read_text(encoding="utf-8"))

FAST = settings(max_examples=100, deadline=None)
ORACLE_SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

IDENTITY: dict[str, Any] = {
    "name": "cluster-1-machine",
    "userId": "user-1",
    "type": "machine",
    "role": "cluster",
    "expiresAt": 1_780_000_000_000,
    "jwt": "eyJhbGciOiJSUzI1NiJ9.payload.signature",
}


def _validate(case: dict[str, Any]) -> list[str]:
    if "path" in case:
        return validate_cluster_node_corestore(case["value"], case["path"])
    return validate_cluster_node_corestore(case["value"])


def _cluster(*nodes: dict[str, Any], **data: Any) -> dict[str, Any]:
    return {"id": "cluster-1", "data": {"name": "c1", "nodes": list(nodes), **data}}


def _node(node_id: str, **data: Any) -> dict[str, Any]:
    return {"id": node_id, "data": {"requiredDebianPackages": [], **data}}


# --- the endpoint rule ----------------------------------------------------------------------------


class TestCorestoreEndpointTable:
    @pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
    def test_answers_as_the_seed_validator_in_node(self, case: dict[str, Any]) -> None:
        """Each fixture case gets exactly the messages Node's run of seed 001 gave."""
        assert _validate(case) == case["expected"]

    def test_seed_example_is_valid(self) -> None:
        """The seed's own example endpoint passes."""
        assert validate_cluster_node_corestore({"endpoint": "http://10.20.0.15:3000"}) == []

    def test_length_counts_utf16_code_units(self) -> None:
        """1029 code points that are 2049 UTF-16 code units exceed the 2048 limit, as in JS."""
        endpoint = "http://h/" + "😀" * 1020
        assert len(endpoint) == 1029
        assert validate_cluster_node_corestore({"endpoint": endpoint}) == [
            "cluster node corestore endpoint must be a string of 1 to 2048 characters"
        ]

    def test_surrogate_pair_code_points_are_one_character(self) -> None:
        """A surrogate pair held as two code points is judged as the character it encodes."""
        split = "http://h:3000/" + "\ud83d\ude00"
        assert validate_cluster_node_corestore({"endpoint": split}) == (
            validate_cluster_node_corestore({"endpoint": "http://h:3000/😀"})
        )

    def test_dict_subclass_is_not_a_plain_object(self) -> None:
        """Only a plain dict is a plain object (JS refuses non-Object prototypes)."""

        class Special(dict[str, Any]):
            pass

        assert validate_cluster_node_corestore(Special(endpoint="http://h:3000")) == [
            "cluster node corestore must use its exact schema"
        ]

    def test_never_quotes_userinfo(self) -> None:
        """A password in the endpoint appears in no message."""
        messages = validate_cluster_node_corestore({"endpoint": "http://u:hunter2@h:3000/"})
        assert messages
        assert not any("hunter2" in message for message in messages)


# Each part leans towards what a valid origin has, so valid and near-valid endpoints are common.
_schemes = st.sampled_from(["http", "https"]) | st.sampled_from(
    ["HTTP", "hTTps", "ws", "ftp", "file", "corestore", "blob:http", "", "h ttp"]
)
_separators = st.just("://") | st.sampled_from([":", ":/", ":\\\\", ":///", "//"])
_userinfo = st.just("") | st.sampled_from(["u@", "u:p@", ":p@", "@", "u:@", "%75@"])
_octets = st.integers(0, 300).map(str)
_hosts = st.one_of(
    st.lists(_octets, min_size=1, max_size=5).map(".".join),
    st.sampled_from(
        [
            "[::1]",
            "[fd00::15]",
            "[FD00:0::15]",
            "[::ffff:10.20.0.15]",
            "[fd00::15",
            "bücher.example",
            "xn--bcher-kva.example",
            "Corestore.Example",
            "core store",
            "corestore.",
            "0x0a.20.0.15",
            "",
            "%41",
            "ß.example",
            "a..b",
        ]
    ),
    st.text("abcXYZ019-.é", min_size=1, max_size=12),
)
_ports = st.one_of(
    st.just(""),
    st.integers(0, 70000).map(lambda p: f":{p}"),
    st.sampled_from([":", ":080", ":+1", ":80", ":443"]),
)
_tails = st.just("") | st.sampled_from(["/", "/api", "?", "?x=1", "#", "#f", "/.", " ", "\t", "\n"])
_urlish = st.builds(
    lambda *parts: "".join(parts), _schemes, _separators, _userinfo, _hosts, _ports, _tails
)
_any_code_points = st.text(
    st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF) | st.characters(), max_size=5
)
_labels = st.text("abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=8)
_canonical_hosts = st.one_of(
    st.ip_addresses(v=4).map(str),
    st.ip_addresses(v=6).map(lambda address: f"[{address.compressed}]"),
    st.lists(_labels, min_size=1, max_size=3).map(".".join),
)
_origins = st.builds(
    "{}://{}{}".format,
    st.sampled_from(["http", "https"]),
    _canonical_hosts,
    st.just("") | st.integers(0, 65535).map(lambda p: f":{p}"),
)
_endpoints = st.one_of(
    _origins,
    _urlish,
    _urlish.map(lambda u: " " + u),
    st.builds(str.__add__, _urlish, _any_code_points),
    st.text(max_size=30),
)


class TestCorestoreEndpointAgainstNode:
    def test_fixture_still_matches_node(self, oracle: NodeOracle) -> None:
        """The committed table is what Node answers today for every one of its inputs."""
        for case in CASES:
            assert oracle.corestore(case["value"], case.get("path")) == case["expected"]

    @ORACLE_SETTINGS
    @given(endpoint=_endpoints)
    def test_generated_endpoints_match_node(self, oracle: NodeOracle, endpoint: str) -> None:
        """For URL-like strings the port gives the seed's messages, in the seed's order."""
        value = {"endpoint": endpoint}
        assert validate_cluster_node_corestore(value) == oracle.corestore(value)

    @ORACLE_SETTINGS
    @given(value=json_values, path=st.none() | st.text(max_size=10))
    def test_generated_json_values_match_node(
        self, oracle: NodeOracle, value: Any, path: str | None
    ) -> None:
        """For arbitrary JSON values (and paths) the port gives the seed's messages."""
        expected = oracle.corestore(value, path)
        if path is None:
            assert validate_cluster_node_corestore(value) == expected
        else:
            assert validate_cluster_node_corestore(value, path) == expected


# --- the routing view -----------------------------------------------------------------------------


class TestReadClusterView:
    def test_valid_node_has_its_endpoint(self) -> None:
        """A node with a valid corestore routes to exactly that endpoint."""
        view = read_cluster_view(
            _cluster(_node("node-a", corestore={"endpoint": "http://10.20.0.15:3000"}))
        )
        assert view.cluster_id == "cluster-1"
        assert view.nodes == {"node-a": NodeView("node-a", "http://10.20.0.15:3000", ())}

    def test_absent_corestore_is_a_problem(self) -> None:
        """A node without `data.corestore` has no endpoint and says it is absent."""
        view = read_cluster_view(_cluster(_node("node-a")))
        assert view.nodes["node-a"] == NodeView(
            "node-a", None, ("cluster node node-a corestore is absent",)
        )

    def test_null_corestore_is_invalid_not_absent(self) -> None:
        """`corestore: null` is judged by the validator, as in JS."""
        view = read_cluster_view(_cluster(_node("node-a", corestore=None)))
        assert view.nodes["node-a"].corestore_problems == (
            "cluster node node-a corestore must use its exact schema",
        )

    def test_invalid_corestore_gives_the_validator_messages(self) -> None:
        """A trailing-slash endpoint is refused with the validator's message, never fixed."""
        view = read_cluster_view(
            _cluster(_node("node-a", corestore={"endpoint": "http://10.20.0.15:3000/"}))
        )
        node = view.nodes["node-a"]
        assert node.corestore_endpoint is None
        assert node.corestore_problems == (
            "cluster node node-a corestore endpoint must be the canonical origin "
            "http://10.20.0.15:3000, without a path, query, fragment, trailing slash or "
            "default port",
        )

    def test_duplicate_node_ids_route_nowhere(self) -> None:
        """Two nodes with one id make that id unroutable, with a reason."""
        view = read_cluster_view(
            _cluster(
                _node("node-a", corestore={"endpoint": "http://10.0.0.1:3000"}),
                _node("node-a", corestore={"endpoint": "http://10.0.0.2:3000"}),
            )
        )
        assert view.nodes["node-a"] == NodeView(
            "node-a", None, ("cluster node node-a appears 2 times in the cluster",)
        )

    def test_nodes_are_keyed_by_id(self) -> None:
        """Every node appears under its `IClusterNode.id`, each judged on its own."""
        view = read_cluster_view(
            _cluster(
                _node("node-a", corestore={"endpoint": "http://10.0.0.1:3000"}),
                _node("node-b"),
            )
        )
        assert sorted(view.nodes) == ["node-a", "node-b"]
        assert view.nodes["node-a"].corestore_endpoint == "http://10.0.0.1:3000"
        assert view.nodes["node-b"].corestore_endpoint is None

    def test_reads_a_parsed_document(self) -> None:
        """A `ClusterDocument` gives the same view as its wire dict."""
        wire = _cluster(_node("node-a", corestore={"endpoint": "http://10.0.0.1:3000"}))
        assert read_cluster_view(from_wire(ClusterDocument, wire)) == read_cluster_view(wire)

    def test_document_without_nodes_is_refused(self) -> None:
        """A cluster document without `data.nodes` raises ValidationError."""
        with pytest.raises(ValidationError):
            read_cluster_view({"id": "cluster-1", "data": {}})

    def test_node_without_id_is_refused(self) -> None:
        """A node without `id` raises ValidationError rather than being guessed."""
        with pytest.raises(ValidationError):
            read_cluster_view(_cluster({"data": {}}))

    @FAST
    @given(document=json_values | st.dictionaries(st.sampled_from(["id", "data"]), json_values))
    def test_garbage_raises_only_validation_error(self, document: Any) -> None:
        """Any JSON object either gives a view or raises ValidationError."""
        if not isinstance(document, dict):
            document = {"id": "c", "data": {"nodes": [document]}}
        with contextlib.suppress(ValidationError):
            read_cluster_view(document)


class TestClusterViewRouting:
    def test_endpoint_of_a_valid_node(self) -> None:
        """`corestore_endpoint` returns the validated endpoint."""
        view = read_cluster_view(
            _cluster(_node("node-a", corestore={"endpoint": "http://10.0.0.1:3000"}))
        )
        assert view.corestore_endpoint("node-a") == "http://10.0.0.1:3000"

    def test_unknown_node_raises_unknown_node(self) -> None:
        """A node the document does not list raises UnknownNode."""
        view = read_cluster_view(_cluster())
        with pytest.raises(UnknownNode, match="node-x"):
            view.corestore_endpoint("node-x")

    def test_node_without_endpoint_raises_with_reasons(self) -> None:
        """A node without a valid endpoint raises NodeWithoutCorestore carrying the reasons."""
        view = read_cluster_view(_cluster(_node("node-a")))
        with pytest.raises(NodeWithoutCorestore) as caught:
            view.corestore_endpoint("node-a")
        assert caught.value.data == {"problems": ["cluster node node-a corestore is absent"]}


# --- documents and bodies -------------------------------------------------------------------------


class TestClusterDocuments:
    def test_unknown_fields_pass_through_verbatim(self) -> None:
        """Every field the agent does not read, nulls included, comes back out unchanged."""
        wire = _cluster(
            _node("node-a", corestore={"endpoint": "nope"}, labels=None, extra={"k": [1, None]}),
            acmeInfo={"serverAddress": "a", "serverSecret": "s"},
            cloudlyUrl=None,
        )
        wire["topLevel"] = None
        assert from_wire(ClusterDocument, wire).to_wire() == wire

    def test_cluster_config_response_round_trips(self) -> None:
        """`{configData, services}` parses and dumps back to the same dict."""
        wire = {
            "configData": _cluster(_node("node-a")),
            "services": [{"id": "svc-1", "data": {"name": "db", "ports": None}, "other": 1}],
        }
        assert from_wire(GetClusterConfigResponse, wire).to_wire() == wire
        assert from_wire(PushClusterConfigRequest, wire).to_wire() == wire

    def test_push_response_is_empty(self) -> None:
        """`pushClusterConfig` answers `{}`."""
        assert PushClusterConfigResponse().to_wire() == {}

    def test_cluster_config_response_is_exact(self) -> None:
        """An unknown top-level response field is refused."""
        with pytest.raises(ValidationError):
            from_wire(
                GetClusterConfigResponse,
                {"configData": _cluster(), "services": [], "surprise": 1},
            )


class TestIdentity:
    def test_identity_parses_the_seed_shape(self) -> None:
        """An IIdentity parses; its JWT is a Secret."""
        identity = from_wire(Identity, IDENTITY)
        assert identity.user_id == "user-1"
        assert identity.jwt.reveal() == IDENTITY["jwt"]

    def test_identity_drops_unknown_fields(self) -> None:
        """Fields Cloudly may add are tolerated and not kept."""
        identity = from_wire(Identity, {**IDENTITY, "refreshToken": "r-secret"})
        assert "r-secret" not in repr(identity)
        assert "refreshToken" not in identity.to_wire()

    def test_identity_dumps_its_jwt_masked(self) -> None:
        """`to_wire()` and `repr` never show the JWT."""
        identity = from_wire(Identity, IDENTITY)
        assert identity.to_wire()["jwt"] == MASK
        assert IDENTITY["jwt"] not in repr(identity)

    @pytest.mark.parametrize("expires_at", [True, 1.5e12, -1, 2**53, "1780000000000"])
    def test_identity_expiry_is_a_safe_natural(self, expires_at: Any) -> None:
        """`expiresAt` must be a non-negative safe integer, not a bool, float or string."""
        with pytest.raises(ValidationError):
            from_wire(Identity, {**IDENTITY, "expiresAt": expires_at})

    def test_identity_by_token_response_parses(self) -> None:
        """`getIdentityByToken` answers `{identity}`."""
        response = from_wire(GetIdentityByTokenResponse, {"identity": IDENTITY})
        assert response.identity.credential() == IdentityCredential(jwt=Secret(IDENTITY["jwt"]))

    def test_credential_is_exact(self) -> None:
        """`IIdentityCredential` is `{jwt}` only."""
        with pytest.raises(ValidationError):
            from_wire(IdentityCredential, {"jwt": "j", "name": "n"})

    def test_cluster_config_request_reveals_only_on_purpose(self) -> None:
        """`to_wire()` masks the JWT; `revealed_wire()` is the body sent to Cloudly."""
        request = GetClusterConfigRequest(identity=IdentityCredential(jwt=Secret("the-jwt")))
        assert request.to_wire() == {"identity": {"jwt": MASK}}
        assert request.revealed_wire() == {"identity": {"jwt": "the-jwt"}}

    def test_token_request_reveals_only_on_purpose(self) -> None:
        """`to_wire()` masks the machine token; `revealed_wire()` carries it."""
        request = GetIdentityByTokenRequest(token=Secret("machine-token"))
        assert request.to_wire() == {"token": MASK}
        assert request.revealed_wire() == {"token": "machine-token"}
