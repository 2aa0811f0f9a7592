"""The files beside a state database named after it (agent/store/files.py, `beside`)."""

from __future__ import annotations

from pathlib import Path

from agent.store.files import beside, moved_aside

NAME = "state.sqlite3"


def _touch(directory: Path, *names: str) -> None:
    for name in names:
        (directory / name).write_bytes(b"")


def test_beside_finds_the_files_of_one_label_by_name(tmp_path: Path) -> None:
    _touch(
        tmp_path,
        NAME,
        f"{NAME}.schema-4-20260102T000000Z",
        f"{NAME}.schema-3-20260101T000000Z",
        f"{NAME}.corrupt-20260101T000000Z",
        "other.sqlite3.schema-3-20260101T000000Z",
    )
    assert [p.name for p in beside(tmp_path / NAME, "schema")] == [
        f"{NAME}.schema-3-20260101T000000Z",
        f"{NAME}.schema-4-20260102T000000Z",
    ]


def test_beside_leaves_the_sidecars_out(tmp_path: Path) -> None:
    kept = f"{NAME}.corrupt-20260101T000000Z"
    _touch(tmp_path, kept, f"{kept}-wal", f"{kept}-shm", f"{kept}-journal")
    assert beside(tmp_path / NAME, "corrupt") == [tmp_path / kept]


def test_moved_aside_of_a_directory_that_is_not_there_is_nothing(tmp_path: Path) -> None:
    assert moved_aside(tmp_path / "absent" / NAME) == []
