"""Request digests and the exact-replay rule for expectedRevision."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from agent.domain.replay import (
    Verdict,
    canonical_json,
    check_expected_revision,
    request_digest,
)
from agent.errors import RevisionConflict
from agent.secret import Secret

STAGE = "stageIsolatedRestoreArchive"


def _stage_body(
    grant: str = "eyJhbGciOiJSUzI1NiJ9.grant-one.sig", stream_id: str = "uni_a"
) -> dict[str, Any]:
    return {
        "restoreGrant": grant,
        "clusterId": "cluster-1",
        "targetNodeName": "node-1",
        "restoreId": "restore-1",
        "expectedRevision": 3,
        "object": {"path": "db/dump.bin", "size": 12, "sha256": "a" * 64},
        "archive": {"_isVirtualStream": True, "streamId": stream_id},
    }


def test_digest_is_sha256_of_the_canonical_request() -> None:
    """The digest pins the canonical form: sorted keys, no whitespace, UTF-8, no grant."""
    body = {"restoreGrant": "g", "b": 1, "a": "ü"}
    expected = hashlib.sha256('{"method":"m","request":{"a":"ü","b":1}}'.encode()).hexdigest()
    assert request_digest("m", body) == expected


def test_the_grant_does_not_change_the_digest() -> None:
    """A retry carries a freshly signed grant and is still the same request."""
    first = request_digest(STAGE, _stage_body(grant="grant-one"))
    assert request_digest(STAGE, _stage_body(grant="grant-two")) == first
    without = _stage_body()
    del without["restoreGrant"]
    assert request_digest(STAGE, without) == first


def test_a_secret_grant_is_dropped_not_serialised() -> None:
    """A grant held as Secret is excluded like a plain one."""
    body = _stage_body()
    plain = request_digest(STAGE, body)
    body["restoreGrant"] = Secret("grant-one")
    assert request_digest(STAGE, body) == plain


def test_key_order_does_not_change_the_digest() -> None:
    """Two encodings of one object in different key orders hash alike."""
    body = _stage_body()
    reordered = dict(reversed(list(body.items())))
    reordered["object"] = dict(reversed(list(body["object"].items())))
    assert request_digest(STAGE, reordered) == request_digest(STAGE, body)


def test_the_stream_id_does_not_change_the_digest() -> None:
    """A replayed stage opens a fresh stream; its random id is not part of the request."""
    assert request_digest(STAGE, _stage_body(stream_id="uni_x")) == request_digest(
        STAGE, _stage_body(stream_id="uni_y")
    )


def test_a_nested_stream_id_is_ignored_too() -> None:
    """Markers at any depth, inside lists too, lose their streamId."""
    one = {"items": [{"s": {"_isVirtualStream": True, "streamId": "uni_1"}}]}
    two = {"items": [{"s": {"_isVirtualStream": True, "streamId": "uni_2"}}]}
    assert request_digest("m", one) == request_digest("m", two)


def test_stream_id_outside_a_marker_counts() -> None:
    """Only markers lose streamId; an ordinary field of that name is request content."""
    assert request_digest("m", {"streamId": "a"}) != request_digest("m", {"streamId": "b"})


def test_the_marker_itself_counts() -> None:
    """A stream where the contract wants one is not the same as no stream."""
    body = _stage_body()
    body["archive"] = None
    assert request_digest(STAGE, body) != request_digest(STAGE, _stage_body())


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("expectedRevision", 4),
        ("restoreId", "restore-2"),
        ("object", {"path": "db/dump.bin", "size": 13, "sha256": "a" * 64}),
    ],
)
def test_any_other_field_changes_the_digest(field: str, value: object) -> None:
    """Everything but the grant and the stream id is part of the request."""
    body = _stage_body()
    body[field] = value
    assert request_digest(STAGE, body) != request_digest(STAGE, _stage_body())


def test_the_method_changes_the_digest() -> None:
    """The same body sent to another method is another request."""
    body = {"clusterId": "c", "expectedRevision": 2}
    assert request_digest("coreflowExecuteIsolatedRestore", body) != request_digest(
        "coreflowCleanupIsolatedRestore", body
    )


def test_a_secret_elsewhere_in_the_body_is_refused() -> None:
    """A Secret outside restoreGrant is a caller bug, never hashed as its mask."""
    with pytest.raises(TypeError):
        request_digest("m", {"token": Secret("t")})


def test_canonical_json_refuses_nan() -> None:
    """NaN has no JSON form."""
    with pytest.raises(ValueError):
        canonical_json({"x": float("nan")})


def test_current_expected_revision_proceeds() -> None:
    """expectedRevision equal to the current revision is a new mutation."""
    verdict = check_expected_revision(
        expected=5, current=5, status="staging", last_digest="d" * 64, digest="e" * 64
    )
    assert verdict is Verdict.PROCEED


def test_absent_state_with_expected_revision_zero_proceeds() -> None:
    """A missing state has revision 0, so prepare at 0 proceeds."""
    verdict = check_expected_revision(
        expected=0, current=0, status=None, last_digest=None, digest="e" * 64
    )
    assert verdict is Verdict.PROCEED


def test_exact_replay_of_the_last_request_is_a_replay() -> None:
    """A stale revision with the digest of the last request answers the current state."""
    verdict = check_expected_revision(
        expected=3, current=6, status="ready", last_digest="d" * 64, digest="d" * 64
    )
    assert verdict is Verdict.REPLAY


def test_stale_revision_with_another_digest_conflicts() -> None:
    """A stale revision that is no replay is refused with the current revision and status."""
    with pytest.raises(RevisionConflict) as raised:
        check_expected_revision(
            expected=3, current=6, status="ready", last_digest="d" * 64, digest="e" * 64
        )
    assert raised.value.code == "revision-conflict"
    assert raised.value.data == {"currentRevision": 6, "status": "ready"}


def test_stale_revision_on_an_absent_state_conflicts() -> None:
    """Without a state there is nothing to replay."""
    with pytest.raises(RevisionConflict) as raised:
        check_expected_revision(
            expected=2, current=0, status=None, last_digest=None, digest="e" * 64
        )
    assert raised.value.data == {"currentRevision": 0, "status": None}


def test_a_deeply_nested_body_is_digested_without_recursion() -> None:
    """The walk that drops stream ids is iterative: a body 800 levels deep digests (the
    recursive one hit the recursion limit), its buried stream id ignored as at the top."""

    def body(stream_id: str) -> dict[str, Any]:
        value: Any = {"_isVirtualStream": True, "streamId": stream_id}
        for _ in range(400):
            value = {"a": [value]}
        return {"deep": value}

    assert request_digest(STAGE, body("uni_x")) == request_digest(STAGE, body("uni_y"))
