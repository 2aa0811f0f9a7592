"""Specification of `agent.contracts.backup`: manifest, failures, the partial-restore rule."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from pydantic import TypeAdapter, ValidationError

from agent.contracts.backup import (
    ArchivePruneResult,
    ArchiveRetentionPolicy,
    BackupArchiveManifest,
    BackupArchiveObject,
    BackupFailure,
    BackupReplicationResult,
    BackupRestoreEvent,
    BackupSnapshot,
    IncompleteBackupFailure,
    UncapturedBinding,
    UnreadableArchiveFailure,
    read_partial_restore_resource_types,
)
from tests.contracts.node_oracle import NodeOracle
from tests.contracts.strategies import archive_manifests, from_wire, json_values, mutated

FAST = settings(max_examples=100, deadline=None)
SHA = "a" * 64


def _object(path: str, size: int = 1, sha256: str = SHA) -> dict[str, Any]:
    return {"path": path, "size": size, "sha256": sha256}


class TestArchiveObject:
    @pytest.mark.parametrize(
        "path",
        ["db/closure.bin", "a", "a/b/c", "...", "a/.hidden", "a\\b", "ü/ß", "é" * 512, "a" * 1024],
    )
    def test_relative_posix_paths_are_accepted(self, path: str) -> None:
        """Relative paths of non-empty, non-dot segments up to 1024 UTF-8 bytes are valid."""
        assert from_wire(BackupArchiveObject, _object(path)).path == path

    @pytest.mark.parametrize(
        "path",
        [
            "",
            "/abs",
            "a//b",
            "a/",
            "./a",
            "a/./b",
            "a/../b",
            "..",
            ".",
            "a\x00b",
            "a" * 1025,
            "é" * 513,
            "a\ud800",
        ],
        ids=repr,
    )
    def test_unsafe_paths_are_refused(self, path: str) -> None:
        """Absolute, dotted, empty-segment, NUL, over-long and non-Unicode paths are refused."""
        with pytest.raises(ValidationError):
            from_wire(BackupArchiveObject, _object(path))

    @pytest.mark.parametrize(
        "sha256", ["A" * 64, "a" * 63, "a" * 65, "g" * 64, "a" * 64 + "\n", 0], ids=repr
    )
    def test_sha256_is_64_lower_case_hex(self, sha256: Any) -> None:
        """Only 64 lower-case hex characters are a sha256."""
        with pytest.raises(ValidationError):
            from_wire(BackupArchiveObject, _object("a", sha256=sha256))

    @pytest.mark.parametrize("size", [-1, 2**53, True, 1.0, "1"], ids=repr)
    def test_size_is_a_safe_natural(self, size: Any) -> None:
        """`size` is a non-negative safe integer: no bool, float or string."""
        with pytest.raises(ValidationError):
            from_wire(BackupArchiveObject, _object("a", size=size))

    def test_object_is_exact(self) -> None:
        """An unknown field on an archive object is refused."""
        with pytest.raises(ValidationError):
            from_wire(BackupArchiveObject, {**_object("a"), "mode": 420})


class TestArchiveManifest:
    def test_duplicate_paths_are_refused(self) -> None:
        """Two entries with one path make the manifest invalid."""
        with pytest.raises(ValidationError, match="more than once"):
            from_wire(BackupArchiveManifest, {"objects": [_object("a"), _object("a", size=2)]})

    def test_extra_fields_pass_through_verbatim(self) -> None:
        """Unknown top-level fields, null included, survive parse and dump unchanged."""
        wire = {"objects": [_object("a")], "format": "v1", "note": None, "meta": {"k": None}}
        assert from_wire(BackupArchiveManifest, wire).to_wire() == wire

    def test_contains_needs_an_exact_entry(self) -> None:
        """`contains` matches path, size and sha256 together."""
        manifest = from_wire(BackupArchiveManifest, {"objects": [_object("a", size=3)]})
        assert manifest.contains(from_wire(BackupArchiveObject, _object("a", size=3)))
        assert not manifest.contains(from_wire(BackupArchiveObject, _object("a", size=4)))

    def test_objects_is_required(self) -> None:
        """A manifest without `objects` is refused."""
        with pytest.raises(ValidationError):
            from_wire(BackupArchiveManifest, {"format": "v1"})

    @FAST
    @given(wire=archive_manifests())
    def test_round_trip_is_identity(self, wire: dict[str, Any]) -> None:
        """parse -> to_wire gives back the input; parsing that again gives the same model."""
        manifest = from_wire(BackupArchiveManifest, wire)
        assert manifest.to_wire() == wire
        assert from_wire(BackupArchiveManifest, manifest.to_wire()) == manifest

    @FAST
    @given(wire=mutated(archive_manifests()))
    def test_invalid_manifest_raises_only_validation_error(self, wire: Any) -> None:
        """Broken manifests either parse or raise ValidationError, nothing else."""
        with contextlib.suppress(ValidationError):
            from_wire(BackupArchiveManifest, wire)


_FAILURE = TypeAdapter(BackupFailure)


class TestFailures:
    def test_incomplete_failure_parses_both_uncaptured_kinds(self) -> None:
        """`incomplete` names volumes by mount path and bindings by id."""
        failure = _FAILURE.validate_python(
            {
                "kind": "incomplete",
                "uncaptured": [
                    {
                        "type": "volume",
                        "mountPath": "/data",
                        "reason": "volume-capture-unavailable",
                    },
                    {"type": "database", "bindingId": "b1", "reason": "binding-not-snapshotted"},
                ],
            },
            by_name=False,
        )
        assert isinstance(failure, IncompleteBackupFailure)
        assert isinstance(failure.uncaptured[1], UncapturedBinding)

    def test_archive_unreadable_has_no_other_field(self) -> None:
        """`archive-unreadable` is exact."""
        assert isinstance(
            _FAILURE.validate_python({"kind": "archive-unreadable"}), UnreadableArchiveFailure
        )
        with pytest.raises(ValidationError):
            _FAILURE.validate_python({"kind": "archive-unreadable", "uncaptured": []})

    @pytest.mark.parametrize(
        "resource",
        [
            {"type": "volume", "bindingId": "b", "reason": "binding-not-snapshotted"},
            {"type": "database", "mountPath": "/d", "reason": "volume-capture-unavailable"},
            {"type": "database", "bindingId": "b", "reason": "volume-capture-unavailable"},
            {"type": "secret", "bindingId": "b", "reason": "binding-not-snapshotted"},
        ],
    )
    def test_each_resource_kind_has_its_own_reason(self, resource: dict[str, Any]) -> None:
        """A volume is named by mount path, a binding by id, each with its one reason."""
        with pytest.raises(ValidationError):
            _FAILURE.validate_python({"kind": "incomplete", "uncaptured": [resource]})


class TestRestoreEventAndDocuments:
    def test_partial_restore_event_round_trips(self) -> None:
        """A partial restore event keeps `resourceTypes` and `partial: true`."""
        wire = {
            "restoredAt": 1,
            "status": "restored",
            "resourceTypes": ["database"],
            "partial": True,
        }
        assert from_wire(BackupRestoreEvent, wire).to_wire() == wire

    def test_partial_is_only_ever_true(self) -> None:
        """`partial: false` is not a value the seed allows."""
        with pytest.raises(ValidationError):
            from_wire(BackupRestoreEvent, {"restoredAt": 1, "status": "failed", "partial": False})

    def test_snapshot_keeps_corestore_fields(self) -> None:
        """A snapshot's `type` is typed; everything else passes through."""
        wire = {"type": "database", "snapshotId": "s1", "sizeBytes": 5, "labels": None}
        assert from_wire(BackupSnapshot, wire).to_wire() == wire

    def test_snapshot_type_is_a_resource_type(self) -> None:
        """A snapshot of an unknown resource type is refused."""
        with pytest.raises(ValidationError):
            from_wire(BackupSnapshot, {"type": "secrets"})

    @pytest.mark.parametrize(
        ("model", "wire"),
        [
            (BackupReplicationResult, {"totalSize": 10, "completedAt": 2, "target": "s3"}),
            (ArchiveRetentionPolicy, {"keepLast": 3, "keepDaily": 7}),
            (ArchiveRetentionPolicy, {}),
            (ArchivePruneResult, {"freedBytes": 0, "dryRun": True, "removed": ["a"]}),
        ],
    )
    def test_partially_known_documents_pass_through(
        self, model: type[BackupSnapshot], wire: dict[str, Any]
    ) -> None:
        """Replication result, retention policy and prune result keep what the seeds do not show."""
        assert from_wire(model, wire).to_wire() == wire


def _backup(status: str = "failed", failure: Any = None, *types: str) -> dict[str, Any]:
    backup: dict[str, Any] = {
        "id": "b1",
        "status": status,
        "snapshots": [{"type": t, "id": f"s{i}"} for i, t in enumerate(types)],
    }
    if failure is not None:
        backup["failure"] = failure
    return backup


_INCOMPLETE_NOTHING = {"kind": "incomplete", "uncaptured": []}
_MISSED_VOLUME = {
    "kind": "incomplete",
    "uncaptured": [{"type": "volume", "mountPath": "/v", "reason": "volume-capture-unavailable"}],
}
_MISSED_DATABASE = {
    "kind": "incomplete",
    "uncaptured": [{"type": "database", "bindingId": "b", "reason": "binding-not-snapshotted"}],
}

PARTIAL_CASES: list[tuple[str, dict[str, Any], list[str]]] = [
    (
        "incomplete with both types",
        _backup("failed", _INCOMPLETE_NOTHING, "database", "objectstorage"),
        ["database", "objectstorage"],
    ),
    (
        "database comes before object storage",
        _backup("failed", _INCOMPLETE_NOTHING, "objectstorage", "database"),
        ["database", "objectstorage"],
    ),
    ("volume is never named", _backup("failed", _INCOMPLETE_NOTHING, "volume"), []),
    (
        "an uncaptured volume excludes no other type",
        _backup("failed", _MISSED_VOLUME, "volume", "database"),
        ["database"],
    ),
    (
        "an uncaptured database binding excludes database",
        _backup("failed", _MISSED_DATABASE, "database", "objectstorage"),
        ["objectstorage"],
    ),
    ("no snapshots, nothing", _backup("failed", _INCOMPLETE_NOTHING), []),
    (
        "duplicate snapshots name a type once",
        _backup("failed", _INCOMPLETE_NOTHING, "database", "database"),
        ["database"],
    ),
    (
        "archive-unreadable restores nothing",
        _backup("failed", {"kind": "archive-unreadable"}, "database"),
        [],
    ),
    ("a failure without kind restores nothing", _backup("failed", None, "database"), []),
    (
        "a completed backup is no partial restore",
        _backup("completed", _INCOMPLETE_NOTHING, "database"),
        [],
    ),
    ("unknown snapshot types are ignored", _backup("failed", _INCOMPLETE_NOTHING, "secrets"), []),
]


class TestPartialRestoreResourceTypes:
    @pytest.mark.parametrize(
        ("backup", "expected"),
        [(backup, expected) for _, backup, expected in PARTIAL_CASES],
        ids=[name for name, _, _ in PARTIAL_CASES],
    )
    def test_table(self, backup: dict[str, Any], expected: list[str]) -> None:
        """Seed 002's rule on its own cases."""
        assert read_partial_restore_resource_types(backup) == expected

    @pytest.mark.parametrize(
        "backup",
        [
            {"status": "failed", "failure": {"kind": "incomplete"}, "snapshots": []},
            {"status": "failed", "snapshots": "database"},
            {"status": "failed"},
            {"snapshots": []},
        ],
    )
    def test_out_of_type_input_raises_validation_error(self, backup: dict[str, Any]) -> None:
        """A record outside the seed's types raises ValidationError, never a wrong answer."""
        with pytest.raises(ValidationError):
            read_partial_restore_resource_types(backup)

    def test_table_matches_node(self, oracle: NodeOracle) -> None:
        """Every table case gets the answer the seed's JavaScript gives."""
        for _, backup, expected in PARTIAL_CASES:
            assert oracle.ask({"fn": "partial", "backup": backup}) == {"ok": expected}

    @settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        status=st.sampled_from(["failed", "completed", "running"]),
        failure=st.none()
        | st.just({"kind": "archive-unreadable"})
        | st.fixed_dictionaries(
            {
                "kind": st.just("incomplete"),
                "uncaptured": st.lists(
                    st.one_of(
                        st.just(
                            {
                                "type": "volume",
                                "mountPath": "/v",
                                "reason": "volume-capture-unavailable",
                            }
                        ),
                        st.sampled_from(["database", "objectstorage"]).map(
                            lambda t: {
                                "type": t,
                                "bindingId": "b",
                                "reason": "binding-not-snapshotted",
                            }
                        ),
                    ),
                    max_size=3,
                ),
            }
        ),
        types=st.lists(
            st.sampled_from(["volume", "database", "objectstorage", "other"]), max_size=4
        ),
        extra=st.dictionaries(
            st.sampled_from(["id", "serviceId", "tags"]), json_values, max_size=2
        ),
    )
    def test_generated_backups_match_node(
        self,
        oracle: NodeOracle,
        status: str,
        failure: Any,
        types: list[str],
        extra: dict[str, Any],
    ) -> None:
        """For any type-correct backup record the port answers as the seed's JavaScript."""
        backup = {**extra, **_backup(status, failure, *types)}
        expected = oracle.ask({"fn": "partial", "backup": backup})
        assert expected == {"ok": read_partial_restore_resource_types(backup)}
