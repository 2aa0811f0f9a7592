"""Specification of the sans-I/O handshake: the calls it asks for, what each answer means.

Synchronous: answers are fed by hand, time is a number, no socket and no sleep.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, strategies as st

from agent.contracts.cluster import SetTagRequest
from agent.errors import (
    AuthenticationFailed,
    CallFailed,
    InvalidState,
    RemoteProtocolError,
    SessionError,
)
from agent.secret import Secret
from agent.session.handshake import (
    Authenticated,
    Call,
    ClusterRead,
    Deviation,
    Handshake,
    Stage,
    StepFailed,
    Tagged,
    renew_delay,
)
from devstack.cloudly import cluster_document
from tests.contracts.strategies import json_values

TOKEN = "machine-token-4d2a9e7c1b30f586"
JWT = "eyJhbGciOiJIUzI1NiJ9.payload.signature-7Q"
NOW = 1_700_000_000.0  # wall-clock seconds
TAG = SetTagRequest(name="restore-agent", payload={"role": "relay"})
IDENTITY_ANSWER: dict[str, Any] = {
    "identity": {
        "name": "machine",
        "userId": "machine-user-1",
        "type": "machine",
        "role": "cluster",
        "expiresAt": int((NOW + 3600) * 1000),
        "jwt": JWT,
    }
}
CLUSTER_ANSWER: dict[str, Any] = {
    "configData": cluster_document("cluster-1", {"node-1": "http://10.0.0.1:3000"}),
    "services": [],
}


def _connect() -> Handshake:
    return Handshake.connect(Secret(TOKEN), TAG)


def _call(handshake: Handshake) -> Call:
    call = handshake.next_call()
    assert call is not None
    return call


def _authenticated(handshake: Handshake) -> Handshake:
    outcome = handshake.receive(IDENTITY_ANSWER, now=NOW)
    assert isinstance(outcome, Authenticated)
    return handshake


def test_the_first_call_asks_for_an_identity_with_the_token() -> None:
    """A handshake starts with getIdentityByToken, the machine token revealed in its body."""
    call = _call(_connect())
    assert (call.method, dict(call.body)) == ("getIdentityByToken", {"token": TOKEN})


def test_an_identity_answer_authenticates_and_the_tag_is_due_next() -> None:
    """The identity is read (its expiry, its JWT); the connection's tag is the next call."""
    handshake = _connect()
    outcome = handshake.receive(IDENTITY_ANSWER, now=NOW)
    assert isinstance(outcome, Authenticated)
    assert outcome.identity.expires_at == IDENTITY_ANSWER["identity"]["expiresAt"]
    assert outcome.identity.jwt.reveal() == JWT
    assert handshake.identity == outcome.identity
    call = _call(handshake)
    assert (call.method, dict(call.body)) == (
        "__typedsocket_setTag",
        {"name": "restore-agent", "payload": {"role": "relay"}},
    )


def test_a_tag_without_a_payload_sends_it_as_null() -> None:
    """The tag's payload goes as configured, an absent one as null (never left out)."""
    handshake = _authenticated(Handshake.connect(Secret(TOKEN), SetTagRequest(name="agent")))
    assert dict(_call(handshake).body) == {"name": "agent", "payload": None}


def test_after_the_tag_the_cluster_document_is_asked_with_the_jwt_alone() -> None:
    """getClusterConfig carries the identity's JWT and nothing else; no token in sight."""
    handshake = _authenticated(_connect())
    assert isinstance(handshake.receive({"success": True}, now=NOW), Tagged)
    call = _call(handshake)
    assert (call.method, dict(call.body)) == ("getClusterConfig", {"identity": {"jwt": JWT}})
    assert TOKEN not in repr(dict(call.body))


def test_the_cluster_answer_is_read_into_the_view_and_ends_the_handshake() -> None:
    """The document becomes the routing view; then nothing more is due."""
    handshake = _authenticated(_connect())
    handshake.receive({"success": True}, now=NOW)
    outcome = handshake.receive(CLUSTER_ANSWER, now=NOW)
    assert isinstance(outcome, ClusterRead)
    assert outcome.view.cluster_id == "cluster-1"
    assert outcome.view.corestore_endpoint("node-1") == "http://10.0.0.1:3000"
    assert (handshake.stage, handshake.next_call()) == (Stage.DONE, None)


def test_the_probe_reads_the_cluster_without_tagging() -> None:
    """check-config's probe goes from the identity straight to the cluster document."""
    handshake = _authenticated(Handshake.probe(Secret(TOKEN)))
    assert _call(handshake).method == "getClusterConfig"


def test_a_renewal_ends_with_the_new_identity() -> None:
    """Renewing asks for an identity only."""
    handshake = _authenticated(Handshake.renewal(Secret(TOKEN)))
    assert (handshake.stage, handshake.next_call()) == (Stage.DONE, None)


def test_a_refused_token_fails_with_the_token_masked_and_the_refusal_as_its_cause() -> None:
    """Cloudly's refusal is AuthenticationFailed; a token it echoes is masked in the text."""
    refusal = CallFailed("getIdentityByToken", f"unknown token {TOKEN}")
    outcome = _connect().receive(refusal, now=NOW)
    assert isinstance(outcome, StepFailed)
    assert isinstance(outcome.error, AuthenticationFailed)
    assert str(outcome.error) == "Cloudly refused the machine token: unknown token **********"
    assert outcome.error.__cause__ is refusal


def test_an_identity_expired_on_arrival_fails() -> None:
    """An identity whose expiry is already past (clocks out of sync) cannot be used."""
    expired = {"identity": dict(IDENTITY_ANSWER["identity"], expiresAt=int(NOW * 1000) - 1)}
    handshake = _connect()
    outcome = handshake.receive(expired, now=NOW)
    assert isinstance(outcome, StepFailed)
    assert isinstance(outcome.error, AuthenticationFailed)
    assert "already expired" in str(outcome.error)
    assert handshake.identity is None


def test_an_unusable_answer_fails_naming_the_field_never_the_value() -> None:
    """An identity without its JWT is RemoteProtocolError naming the field path."""
    answer = {"identity": {"expiresAt": 1, "password": "hunter2-SENTINEL"}}
    outcome = _connect().receive(answer, now=NOW)
    assert isinstance(outcome, StepFailed)
    assert isinstance(outcome.error, RemoteProtocolError)
    assert str(outcome.error) == (
        "the getIdentityByToken answer is unusable: identity.jwt: Field required"
    )
    assert "SENTINEL" not in repr(outcome)


def test_a_refused_tag_fails_naming_it() -> None:
    """`success: false` to the tag ends the handshake; the cluster is never asked."""
    handshake = _authenticated(_connect())
    outcome = handshake.receive({"success": False}, now=NOW)
    assert isinstance(outcome, StepFailed)
    assert type(outcome.error) is SessionError
    assert str(outcome.error) == "Cloudly did not accept the connection tag restore-agent"
    assert handshake.next_call() is None


def test_a_refusal_of_the_cluster_call_is_the_failure_as_it_came() -> None:
    """After authentication a refused call is no token problem: the CallFailed itself."""
    handshake = _authenticated(Handshake.probe(Secret(TOKEN)))
    refusal = CallFailed("getClusterConfig", "not now")
    outcome = handshake.receive(refusal, now=NOW)
    assert isinstance(outcome, StepFailed)
    assert outcome.error is refusal


def test_an_unused_field_missing_is_a_deviation_not_a_failure() -> None:
    """A cluster answer without `services` is read; the outcome names the field to note."""
    handshake = _authenticated(Handshake.probe(Secret(TOKEN)))
    answer = {key: value for key, value in CLUSTER_ANSWER.items() if key != "services"}
    outcome = handshake.receive(answer, now=NOW)
    assert isinstance(outcome, ClusterRead)
    assert outcome.deviation == Deviation("getClusterConfig", "services", "Field required")


def test_answers_of_the_exact_shape_have_no_deviation() -> None:
    """The seed's exact shapes are no deviation."""
    handshake = Handshake.probe(Secret(TOKEN))
    outcomes = [handshake.receive(answer, now=NOW) for answer in (IDENTITY_ANSWER, CLUSTER_ANSWER)]
    assert [type(outcome) for outcome in outcomes] == [Authenticated, ClusterRead]
    assert [outcome.deviation for outcome in outcomes] == [None, None]


def test_nothing_is_due_after_a_failure_and_another_answer_changes_nothing() -> None:
    """A failed handshake refuses further answers with InvalidState and stays failed."""
    handshake = _connect()
    handshake.receive(CallFailed("getIdentityByToken", "no"), now=NOW)
    with pytest.raises(InvalidState):
        handshake.receive(IDENTITY_ANSWER, now=NOW)
    assert (handshake.stage, handshake.identity, handshake.next_call()) == (
        Stage.FAILED,
        None,
        None,
    )


def test_an_answer_after_the_last_one_is_refused() -> None:
    """A finished handshake expects nothing more."""
    handshake = _authenticated(Handshake.renewal(Secret(TOKEN)))
    with pytest.raises(InvalidState, match="done"):
        handshake.receive(IDENTITY_ANSWER, now=NOW)


def test_no_call_shows_a_secret_in_its_repr() -> None:
    """The bodies carry the token and the JWT, their reprs neither."""
    handshake = _connect()
    calls = [repr(_call(handshake))]
    handshake.receive(IDENTITY_ANSWER, now=NOW)
    handshake.receive({"success": True}, now=NOW)
    calls.append(repr(_call(handshake)))
    assert all(TOKEN not in text and JWT not in text for text in calls)


_objects = st.dictionaries(st.text(max_size=6), json_values, max_size=4)
_near_identity = st.fixed_dictionaries(
    {"identity": st.fixed_dictionaries({"expiresAt": json_values, "jwt": json_values})}
)
_near_cluster = st.fixed_dictionaries(
    {
        "configData": st.fixed_dictionaries(
            {
                "id": json_values,
                "data": st.fixed_dictionaries(
                    {
                        "nodes": st.lists(
                            st.fixed_dictionaries({"id": json_values, "data": _objects}),
                            max_size=3,
                        )
                    }
                ),
            }
        )
    }
)
_answers = (
    _objects | _near_identity | _near_cluster | st.fixed_dictionaries({"success": json_values})
)


@given(answer=_answers, stage=st.sampled_from([0, 1, 2]))
def test_no_answer_raises_out_of_the_handshake(answer: dict[str, Any], stage: int) -> None:
    """Whatever Cloudly answers at any step, `receive` returns an outcome instead of raising."""
    handshake = _connect()
    for earlier in (IDENTITY_ANSWER, {"success": True})[:stage]:
        handshake.receive(earlier, now=NOW)
    outcome = handshake.receive(answer, now=NOW)
    assert isinstance(outcome, Authenticated | Tagged | ClusterRead | StepFailed)


def test_a_plan_that_tags_needs_the_tag() -> None:
    """A connect plan without the tag to set is refused at once."""
    with pytest.raises(InvalidState, match="needs the tag"):
        Handshake((Stage.IDENTITY, Stage.TAG, Stage.CLUSTER), Secret(TOKEN))


def test_renewal_happens_the_margin_before_expiry() -> None:
    """An identity valid for an hour is renewed `margin` seconds before it expires."""
    assert renew_delay(expires_at_ms=1_000_000 + 3_600_000, now=1_000.0, margin_s=300.0) == 3300.0


def test_short_lived_identity_is_renewed_at_half_life() -> None:
    """An identity living shorter than the margin is renewed half-way, not at once."""
    assert renew_delay(expires_at_ms=1_060_000, now=1_000.0, margin_s=300.0) == 30.0


def test_identity_issued_already_expired_is_an_authentication_failure() -> None:
    """An identity whose expiry lies in the past cannot be used: AuthenticationFailed."""
    with pytest.raises(AuthenticationFailed, match="already expired"):
        renew_delay(expires_at_ms=999_000, now=1_000.0, margin_s=300.0)
