"""routes.py, shapes.py and models.py: the documented requests and what each answer means (pure)."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from agent.corestore import builders, routes
from agent.corestore.models import ObjectProgress, PrepareRestoreBody, VerificationAnswer
from agent.corestore.routes import ROUTES, AnswerKind, RouteName
from agent.corestore.shapes import MAX_CHUNK_SIZE
from agent.errors import GrantInvalid, LocalProtocolError
from agent.secret import Secret

GRANT = Secret("aGVhZGVy.cGF5bG9hZA.c2lnbmF0dXJl")
BEARER = Secret("bearer-value-0123456789")
SHA = "a" * 64


def _mapping(mapping_id: str = "m-1") -> dict[str, Any]:
    return {
        "id": mapping_id,
        "type": "objectstorage",
        "source": {"snapshotId": "s-1", "resourceName": "r", "bucketName": "b"},
        "target": {"resourceName": "r2", "bucketName": "b2"},
    }


def _manifest(*paths: str) -> dict[str, Any]:
    return {"objects": [{"path": p, "size": 1, "sha256": SHA} for p in paths]}


def test_chunk_put_carries_offset_digest_and_bytes() -> None:
    """A chunk PUT names the object and offset in the query and its sha256 in a header."""
    data = b"chunk"
    request = builders.build_put_chunk("archive-1", "s-1/a b+c.bin", 7, data, SHA, GRANT)
    assert (request.spec.method, request.path) == ("PUT", "/v1/staging-archives/archive-1/objects")
    assert request.query == {"path": "s-1/a b+c.bin", "offset": "7"}
    assert request.body == data
    assert routes.request_headers(request, BEARER)[routes.HEADER_CHUNK_SHA256] == SHA


def test_every_control_route_carries_bearer_and_grant_in_headers() -> None:
    """Bearer and grant travel only as headers, revealed only by request_headers."""
    request = builders.build_delete_resource("restore-1", "m-1", GRANT)
    headers = routes.request_headers(request, BEARER)
    assert headers[routes.HEADER_AUTHORIZATION] == "Bearer " + BEARER.reveal()
    assert headers[routes.HEADER_RESTORE_GRANT] == GRANT.reveal()
    assert GRANT.reveal() not in request.path + repr(request)
    assert BEARER.reveal() not in repr(request)


def test_health_carries_no_credential() -> None:
    """Health is unauthenticated: no Authorization and no grant header."""
    assert routes.request_headers(builders.build_health(), BEARER) == {}


def test_request_repr_leaves_out_chunk_bytes() -> None:
    """A logged RouteRequest does not dump up to 16 MiB of payload."""
    request = builders.build_put_chunk("a", "p", 0, b"\x01" * 1000, SHA, GRANT)
    assert "\\x01" not in repr(request)


def test_delete_restore_is_a_delete_of_the_restore_itself() -> None:
    """Forgetting a restore is DELETE on the prepare path, with the grant in its header."""
    request = builders.build_delete_restore("restore:1", GRANT)
    assert (request.spec.method, request.path) == ("DELETE", "/v1/isolated-restores/restore%3A1")
    assert (request.body, request.query) == (None, {})
    assert routes.request_headers(request, BEARER)[routes.HEADER_RESTORE_GRANT] == GRANT.reveal()


def test_ids_are_percent_encoded_into_one_segment() -> None:
    """A ':' the id rule allows is percent-encoded; each id stays one path segment."""
    request = builders.build_resource_status("rst-1.2:a", "map_db-1", GRANT)
    assert request.path == "/v1/isolated-restores/rst-1.2%3Aa/resources/map_db-1"


@pytest.mark.parametrize(
    "bad_id", ["", ".", "..", "../../x", "a/b", "a\\b", "a b", "a\nb", "x\u0000", "é", "x" * 257]
)
def test_unusable_ids_are_refused_before_sending(bad_id: str) -> None:
    """An id outside the contracts' path-segment rule (empty, a dot segment, a separator,
    whitespace, control or non-ASCII characters, over 256 characters) is a local bug."""
    with pytest.raises(LocalProtocolError, match="mappingId"):
        builders.build_verify_resource("restore-1", bad_id, GRANT)


@pytest.mark.parametrize("bad_path", ["", "/abs", "a//b", "a/./b", "../a", "a/..", "a\x00b"])
def test_object_paths_follow_the_manifest_rule(bad_path: str) -> None:
    """Object paths are relative POSIX paths without empty, '.' or '..' segments or NUL."""
    with pytest.raises(LocalProtocolError, match="object path"):
        builders.build_object_progress("archive-1", bad_path, GRANT)


def test_object_path_over_1024_bytes_is_refused() -> None:
    """The 1024-byte bound counts UTF-8 bytes, not characters."""
    with pytest.raises(LocalProtocolError, match="1024 bytes"):
        builders.build_object_progress("archive-1", "é" * 513, GRANT)


@pytest.mark.parametrize("size", [0, MAX_CHUNK_SIZE + 1])
def test_chunk_size_is_bounded(size: int) -> None:
    """A chunk holds 1 byte to 16 MiB."""
    with pytest.raises(LocalProtocolError, match="chunk holds"):
        builders.build_put_chunk("a", "p", 0, b"x" * size, SHA, GRANT)


def test_chunk_digest_must_be_lower_case_hex() -> None:
    """The chunk header is a sha256 in 64 lower-case hex characters."""
    with pytest.raises(LocalProtocolError, match="sha256"):
        builders.build_put_chunk("a", "p", 0, b"x", SHA.upper(), GRANT)


@pytest.mark.parametrize("bad_grant", ["", "a.b", "a.b.c.d", "a.b.c d", "a.b.", "x" * 9000])
def test_a_grant_that_is_no_compact_jws_is_refused_without_quoting_it(bad_grant: str) -> None:
    """A malformed grant is GrantInvalid, and the message does not repeat it."""
    with pytest.raises(GrantInvalid) as caught:
        builders.build_object_progress("a", "p", Secret(bad_grant))
    assert bad_grant == "" or bad_grant not in str(caught.value)


def test_prepare_passes_mappings_and_manifest_through_unchanged() -> None:
    """Fields the agent does not read (target, extra manifest keys) reach Corestore verbatim."""
    mapping = _mapping()
    mapping["target"]["databaseAllocation"] = {"purpose": "scratch-rehearsal", "generation": 1}
    manifest = {**_manifest("s-1/a"), "format": "containerarchive-v2"}
    request = builders.build_prepare_restore(
        "restore-1",
        scratch_namespace_id="ns",
        staging_archive_id="sa",
        resource_mappings=[mapping],
        archive_manifest=manifest,
        grant=GRANT,
    )
    body = routes.parse_answer(PrepareRestoreBody, request.body or b"")
    assert body.to_wire()["resourceMappings"] == [mapping]
    assert body.to_wire()["archiveManifest"] == manifest


@pytest.mark.parametrize(
    ("mappings", "manifest", "field"),
    [
        ([], _manifest("s-1/a"), "resource_mappings"),
        ([_mapping(), _mapping()], _manifest("s-1/a"), "mapping ids must be unique"),
        ([_mapping()], _manifest("s-1/a", "s-1/a"), "paths must be unique"),
        ([{**_mapping(), "type": "queue"}], _manifest("s-1/a"), "type"),
    ],
)
def test_prepare_body_is_checked_before_sending(
    mappings: list[dict[str, Any]], manifest: dict[str, Any], field: str
) -> None:
    """A prepare body the agent got wrong is a LocalProtocolError naming the problem."""
    with pytest.raises(LocalProtocolError, match=field):
        builders.build_prepare_restore(
            "r",
            scratch_namespace_id="ns",
            staging_archive_id="sa",
            resource_mappings=mappings,
            archive_manifest=manifest,
            grant=GRANT,
        )


def test_only_the_commits_are_not_retried() -> None:
    """Every route is idempotent except the two commits, whose mismatch removes what they
    would commit (a staging object, a closure import)."""
    not_idempotent = {name for name, spec in ROUTES.items() if not spec.idempotent}
    assert not_idempotent == {RouteName.COMMIT_OBJECT, RouteName.CLOSURE_IMPORT_COMMIT}


SERVICE_ROUTES = {
    RouteName.SERVICE_BACKUP,
    RouteName.BACKUP_RECORD,
    RouteName.SERVICE_RESTORE,
    RouteName.SERVICE_RESTORE_STATUS,
    RouteName.ARCHIVE_LIST,
    RouteName.ARCHIVE_PRUNE,
    RouteName.CLOSURE_DESCRIPTOR,
    RouteName.CLOSURE_READ,
    RouteName.CLOSURE_IMPORT,
    RouteName.CLOSURE_IMPORT_CHUNK,
    RouteName.CLOSURE_IMPORT_COMMIT,
    RouteName.CLOSURE_IMPORT_ABORT,
    RouteName.CLOSURE_IMPORT_STATUS,
}


def test_only_health_is_unauthenticated() -> None:
    """Every control route needs the bearer; health does not."""
    unauthenticated = {n for n, s in ROUTES.items() if not s.authenticated}
    assert unauthenticated == {RouteName.HEALTH}


LISTING_ROUTES = {RouteName.RESTORE_LIST, RouteName.CLOSURE_IMPORT_LIST}


def test_the_isolated_restore_routes_and_only_they_carry_the_grant() -> None:
    """The relay's service routes carry no restore grant (their requests have none); every
    isolated-restore route does; health does not, nor the reconciliation listings (node-wide:
    no one restore's grant covers them, and they change nothing)."""
    without_grant = {n for n, s in ROUTES.items() if not s.grant}
    assert without_grant == SERVICE_ROUTES | LISTING_ROUTES | {RouteName.HEALTH}


def test_only_the_closure_read_answers_raw_bytes_up_to_a_chunk() -> None:
    """Every answer is a small JSON document except a closure read (bytes, one chunk at most)."""
    raw = {n: s.answer_limit for n, s in ROUTES.items() if s.answer is None}
    assert raw == {RouteName.CLOSURE_READ: MAX_CHUNK_SIZE}


@pytest.mark.parametrize(
    ("route", "status", "code", "kind"),
    [
        (RouteName.PUT_CHUNK, 200, None, AnswerKind.OK),
        (RouteName.PREPARE_RESTORE, 201, None, AnswerKind.OK),
        (RouteName.RESTORE_RESOURCE, 202, None, AnswerKind.OK),
        (RouteName.PUT_CHUNK, 503, "unavailable", AnswerKind.UNAVAILABLE),
        (RouteName.PUT_CHUNK, 500, None, AnswerKind.UNAVAILABLE),
        (RouteName.OBJECT_PROGRESS, 429, None, AnswerKind.UNAVAILABLE),
        (RouteName.OBJECT_PROGRESS, 408, None, AnswerKind.UNAVAILABLE),
        (RouteName.PUT_CHUNK, 422, "chunk-digest-mismatch", AnswerKind.INTEGRITY),
        (RouteName.COMMIT_OBJECT, 422, "object-digest-mismatch", AnswerKind.INTEGRITY),
        (RouteName.COMMIT_OBJECT, 422, "something-else", AnswerKind.REFUSED),
        (RouteName.PUT_CHUNK, 409, "offset-gap", AnswerKind.REFUSED),
        (RouteName.PUT_CHUNK, 401, "unauthorized", AnswerKind.REFUSED),
        (RouteName.DELETE_RESOURCE, 404, "resource-not-found", AnswerKind.GONE),
        (RouteName.DELETE_RESOURCE, 404, "restore-not-found", AnswerKind.GONE),
        (RouteName.DELETE_RESOURCE, 404, "mapping-not-found", AnswerKind.REFUSED),
        (RouteName.DELETE_RESOURCE, 404, None, AnswerKind.REFUSED),
        (RouteName.DELETE_STAGING_ARCHIVE, 404, "staging-archive-not-found", AnswerKind.GONE),
        (RouteName.DELETE_OBJECT, 404, "object-not-found", AnswerKind.GONE),
        (RouteName.RESOURCE_STATUS, 404, "resource-not-found", AnswerKind.REFUSED),
        (RouteName.DELETE_RESTORE, 200, None, AnswerKind.OK),
        (RouteName.DELETE_RESTORE, 404, "restore-not-found", AnswerKind.GONE),
        (RouteName.DELETE_RESTORE, 404, "resource-not-found", AnswerKind.REFUSED),
        (RouteName.DELETE_RESTORE, 409, "restore-not-empty", AnswerKind.REFUSED),
    ],
)
def test_answers_are_classified_as_documented(
    route: RouteName, status: int, code: str | None, kind: AnswerKind
) -> None:
    """Status and Corestore's code decide success, cleaned, integrity, refusal or unavailable."""
    assert routes.classify_answer(ROUTES[route], status, code) is kind


@pytest.mark.parametrize("body", [b"", b"<html>502</html>", b'{"error": "x"}', b"[]"])
def test_an_error_body_of_another_shape_has_no_code(body: bytes) -> None:
    """Only `{error: {code, message}}` yields a code; a proxy's page does not."""
    assert routes.parse_error(body) is None


def test_answers_ignore_fields_a_newer_corestore_adds() -> None:
    """Answers are tolerant, so a newer Corestore does not break the agent."""
    progress = routes.parse_answer(
        ObjectProgress,
        b'{"path":"p","state":"partial","size":9,"verifiedBytes":4,"chunks":[],"extra":1}',
    )
    assert progress.verified_bytes == 4


def test_a_verification_answer_holds_the_contract_checks() -> None:
    """Checks parse into {code, status, message?} as IIsolatedRestoreVerificationCheck."""
    answer = routes.parse_answer(
        VerificationAnswer,
        b'{"mappingId":"m","resourceType":"volume","status":"failed",'
        b'"checks":[{"code":"c1","status":"passed"},{"code":"c2","status":"failed","message":"x"}]}',
    )
    assert [check.to_wire() for check in answer.checks] == [
        {"code": "c1", "status": "passed"},
        {"code": "c2", "status": "failed", "message": "x"},
    ]


def test_a_verification_answer_with_an_empty_check_code_is_another_shape() -> None:
    """The node state's check code is never empty, so Corestore's may not be either."""
    with pytest.raises(ValueError, match=r"checks\.0\.code"):
        routes.parse_answer(
            VerificationAnswer,
            b'{"mappingId":"m","resourceType":"volume","status":"failed",'
            b'"checks":[{"code":"","status":"failed"}]}',
        )


def test_commit_body_is_the_whole_object_size_and_digest() -> None:
    """Commit sends `{size, sha256}` and nothing else."""
    digest = hashlib.sha256(b"x").hexdigest()
    request = builders.build_commit_object("a", "p", 1, digest, GRANT)
    assert request.body == f'{{"size":1,"sha256":"{digest}"}}'.encode()
