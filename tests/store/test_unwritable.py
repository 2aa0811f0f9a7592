"""Specification of a state disk that refuses writes: a named, retryable error, said once at
error with its cause, reported to the observer, reads still served, and over by itself once a
write gets through. On a real full tmpfs (tests/disk.py), not an injected fault."""

from __future__ import annotations

import errno
import sqlite3
from pathlib import Path

import pytest
import structlog

from agent.domain.job_machine import JobOp
from agent.domain.jobs import JobKey
from agent.domain.outcomes import JobReport, Succeeded
from agent.domain.restore_machine import Op
from agent.domain.restores import RestoreKey
from agent.errors import StateUnwritable, StoreError, wire_error_data
from agent.store import RevisionStore
from agent.store.faults import store_error, unwritable_cause
from tests.clock import ManualClock
from tests.disk import small_disk
from tests.store.states import node_state, plan


class Heard:
    """A StoreObserver that keeps what the store said about its disk."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str | None]] = []

    def state_write_failed(self, *, cause: str) -> None:
        self.events.append(("failed", cause))

    def state_writable(self) -> None:
        self.events.append(("writable", None))

    def store_mutation(self, *, op: str, outcome: str, seconds: float) -> None:
        del seconds
        self.events.append(("mutation", f"{op}:{outcome}"))

    def chunk_recorded(self, *, length: int) -> None:
        del length

    def object_written(self, *, size: int) -> None:
        del size


async def _until_refused(store: RevisionStore) -> tuple[int, StateUnwritable]:
    """Prepare restores 1, 2, ... until the disk refuses one (the WAL may take a few rows
    before it must grow): that restore's number and the refusal."""
    for n in range(1, 200):
        try:
            await _prepare(store, n)
        except StateUnwritable as exc:
            return n, exc
    raise AssertionError("the full disk took 199 restores")


def _key(n: int) -> RestoreKey:
    return RestoreKey("cluster-1", "node-1", f"restore-{n}")


async def _prepare(store: RevisionStore, n: int) -> None:
    key = _key(n)
    await store.mutate(key, expected_revision=0, op=Op.PREPARE, state=node_state(key), plan=plan())


@pytest.mark.parametrize(
    ("code", "cause"),
    [(errno.ENOSPC, "disk-full"), (errno.EDQUOT, "disk-full"), (errno.EROFS, "read-only"),
     (errno.EIO, "io-error"), (errno.EACCES, None)],
)  # fmt: skip
def test_os_errors_name_the_cause_of_an_unwritable_disk(code: int, cause: str | None) -> None:
    """ENOSPC/EDQUOT are a full disk, EROFS a read-only one, EIO a failing one; a permission
    error is none of them (a configuration matter)."""
    assert unwritable_cause(OSError(code, "x")) == cause


def test_an_unwritable_disk_is_its_own_retryable_wire_code() -> None:
    """Never `internal`: `state-unwritable`, retryable, with its cause."""
    error = store_error(OSError(errno.ENOSPC, "No space left on device"), "writing x")
    assert isinstance(error, StateUnwritable)
    assert wire_error_data(error) == {
        "code": "state-unwritable",
        "retryable": True,
        "cause": "disk-full",
    }
    other = store_error(sqlite3.OperationalError("database is locked"), "writing x")
    assert type(other) is StoreError


async def test_a_full_disk_refuses_a_mutation_with_state_unwritable(tmp_path: Path) -> None:
    """A mutation on a full disk raises StateUnwritable (disk-full), changes nothing, and the
    same mutation succeeds once there is room again."""
    with small_disk(tmp_path / "state", 2 * 1024 * 1024) as disk:
        async with await RevisionStore.open(disk.path, clock=ManualClock()) as store:
            await _prepare(store, 0)
            disk.fill()
            refused, error = await _until_refused(store)
            assert error.cause == "disk-full"
            assert await store.get(_key(refused)) is None
            disk.free()
            await _prepare(store, refused)
            stored = await store.get(_key(refused))
            assert stored is not None
            assert stored.revision == 1


async def test_the_refusal_is_said_once_at_error_and_heard_until_a_write_gets_through(
    tmp_path: Path,
) -> None:
    """One error line with the cause however many writes fail; the observer hears each
    failure and then `state_writable` once a write commits; `write_fault` says it meanwhile."""
    heard = Heard()
    with small_disk(tmp_path / "state", 2 * 1024 * 1024) as disk:
        store = await RevisionStore.open(disk.path, clock=ManualClock(), observer=heard)
        try:
            await _prepare(store, 0)
            disk.fill()
            with structlog.testing.capture_logs() as logs:
                refused, _ = await _until_refused(store)
                for _ in range(2):
                    with pytest.raises(StateUnwritable):
                        await _prepare(store, refused)
                assert store.write_fault is not None
                assert store.write_fault.cause == "disk-full"
                disk.free()
                assert await store.probe_write()
            assert store.write_fault is None
        finally:
            await store.aclose()
    lines = [entry for entry in logs if entry["event"] == "state_database_unwritable"]
    assert len(lines) == 1
    assert lines[0]["log_level"] == "error"
    assert lines[0]["cause"] == "disk-full"
    assert [entry["event"] for entry in logs if entry["event"] == "state_database_writable"]
    failed = [event for event in heard.events if event[0] == "failed"]
    assert failed == [("failed", "disk-full")] * 3
    assert heard.events[-1] == ("writable", None)


async def test_reads_are_served_while_the_disk_is_full(tmp_path: Path) -> None:
    """A status read needs no room: it is answered while writes are refused."""
    with small_disk(tmp_path / "state", 2 * 1024 * 1024) as disk:
        async with await RevisionStore.open(disk.path, clock=ManualClock()) as store:
            await _prepare(store, 0)
            disk.fill()
            await _until_refused(store)
            stored = await store.get(_key(0))
            assert stored is not None
            assert stored.status == "preparing"
            assert [s.key for s in await store.list_states()][-1] == _key(0)
            assert not await store.probe_write()


async def test_opening_on_a_full_disk_is_state_unwritable_not_a_crash(tmp_path: Path) -> None:
    """A new database on a disk with no room left: StateUnwritable (disk-full) from open(),
    not a bare StoreError; it opens once there is room."""
    with small_disk(tmp_path / "state", 1024 * 1024) as disk:
        disk.fill()
        with pytest.raises(StateUnwritable) as raised:
            await RevisionStore.open(disk.path, clock=ManualClock())
        assert raised.value.cause == "disk-full"
        disk.free()
        async with await RevisionStore.open(disk.path, clock=ManualClock()) as store:
            assert store.integrity == "new"


async def test_a_delivery_recorded_once_the_disk_has_room_ends_the_refusal(tmp_path: Path) -> None:
    """Recording that an answer reached Cloudly is a write like any other: once it commits,
    the remembered refusal is over (`write_fault` clears, the observer hears it)."""
    heard = Heard()
    key = JobKey("cluster-1", "node-1", "backup", "bk-1", "svc-1")
    with small_disk(tmp_path / "state", 2 * 1024 * 1024) as disk:
        store = await RevisionStore.open(disk.path, clock=ManualClock(), observer=heard)
        try:
            await store.move_job(key, op=JobOp.START, expected_revision=0, digest="a" * 64)
            done = await store.move_job(
                key,
                op=JobOp.SUCCEED,
                expected_revision=1,
                digest="a" * 64,
                result=Succeeded({"snapshots": []}, JobReport(snapshots=0)),
            )
            disk.fill()
            await _until_refused(store)
            disk.free()
            assert await store.mark_delivered(key, revision=done.revision)
            assert store.write_fault is None
        finally:
            await store.aclose()
    assert heard.events[-1] == ("writable", None)
