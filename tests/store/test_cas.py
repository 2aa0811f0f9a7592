"""RevisionStore mutations: compare-and-swap revisions, the table in SQL, digests, races."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from agent.clock import epoch_ms
from agent.contracts.isolatedrestore import IsolatedRestoreNodeState
from agent.domain.restore_machine import Op
from agent.domain.restores import RestoreKey, StoredState
from agent.errors import IllegalTransition, InvalidState, RevisionConflict, StoreError
from agent.store import RevisionStore
from tests.clock import ManualClock
from tests.store.states import KEY, node_state, plan

DIGEST_A = "a" * 64
DIGEST_B = "b" * 64


def _state(**changes: Any) -> IsolatedRestoreNodeState:
    return node_state(KEY, **changes)


async def test_an_absent_key_reads_as_none(store: RevisionStore) -> None:
    """No row means no state (revision 0)."""
    assert await store.get(KEY) is None


async def test_prepare_at_revision_zero_creates_revision_one(store: RevisionStore) -> None:
    """The first mutation inserts the row at revision 1 in status preparing."""
    created = await store.mutate(
        KEY,
        expected_revision=0,
        op=Op.PREPARE,
        state=_state(),
        plan=plan(),
        request_digest=DIGEST_A,
    )
    assert (created.revision, created.status, created.mutation_digest) == (1, "preparing", DIGEST_A)
    assert await store.get(KEY) == created


async def test_a_whole_lifecycle_advances_the_revision_by_one_per_mutation(
    store: RevisionStore,
) -> None:
    """Every mutation, request or progress, advances the revision by exactly one."""
    steps = [
        (Op.PREPARE, "preparing"),
        (Op.PREPARE_SUCCEEDED, "prepared"),
        (Op.STAGE, "staging"),
        (Op.STAGE, "staging"),
        (Op.EXECUTE, "restoring"),
        (Op.PROGRESS, "restoring"),
        (Op.RESTORE_SUCCEEDED, "verifying"),
        (Op.VERIFY_PASSED, "ready"),
        (Op.CLEANUP, "cleaning"),
        (Op.CLEANUP_SUCCEEDED, "cleaned"),
    ]
    for revision, (op, status) in enumerate(steps):
        stored = await store.mutate(
            KEY,
            expected_revision=revision,
            op=op,
            state=_state(),
            plan=plan() if op is Op.PREPARE else None,
        )
        assert (stored.revision, stored.status) == (revision + 1, status)
        assert (stored.state.revision, stored.state.status) == (revision + 1, status)


async def test_a_stale_revision_conflicts_and_changes_nothing(
    prepared_store: RevisionStore,
) -> None:
    """expectedRevision behind the row raises RevisionConflict with the current facts."""
    before = await prepared_store.get(KEY)
    with pytest.raises(RevisionConflict) as raised:
        await prepared_store.mutate(
            KEY, expected_revision=1, op=Op.STAGE, state=_state(last_error_code="x")
        )
    assert raised.value.data == {"currentRevision": 2, "status": "prepared"}
    assert await prepared_store.get(KEY) == before


async def test_a_revision_ahead_of_the_row_conflicts(prepared_store: RevisionStore) -> None:
    """expectedRevision beyond the row is no more current than one behind it."""
    with pytest.raises(RevisionConflict) as raised:
        await prepared_store.mutate(KEY, expected_revision=9, op=Op.STAGE, state=_state())
    assert raised.value.data == {"currentRevision": 2, "status": "prepared"}


async def test_prepare_at_zero_on_an_existing_state_conflicts(
    prepared_store: RevisionStore,
) -> None:
    """The INSERT for revision 0 fails on the existing row, as a conflict."""
    with pytest.raises(RevisionConflict) as raised:
        await prepared_store.mutate(
            KEY, expected_revision=0, op=Op.PREPARE, state=_state(), plan=plan()
        )
    assert raised.value.data == {"currentRevision": 2, "status": "prepared"}


async def test_a_nonzero_revision_on_an_absent_state_conflicts(store: RevisionStore) -> None:
    """Without a row the current revision is 0 and the status absent."""
    with pytest.raises(RevisionConflict) as raised:
        await store.mutate(KEY, expected_revision=3, op=Op.EXECUTE, state=_state())
    assert raised.value.data == {"currentRevision": 0, "status": None}
    assert await store.get(KEY) is None


async def test_an_illegal_operation_at_the_current_revision_changes_nothing(
    prepared_store: RevisionStore,
) -> None:
    """The SQL carries the table: an illegal move is refused and nothing is written."""
    before = await prepared_store.get(KEY)
    with pytest.raises(IllegalTransition) as raised:
        await prepared_store.mutate(KEY, expected_revision=2, op=Op.VERIFY_PASSED, state=_state())
    assert raised.value.data == {"currentRevision": 2, "status": "prepared"}
    assert await prepared_store.get(KEY) == before


async def test_an_operation_other_than_prepare_cannot_create_a_state(
    store: RevisionStore,
) -> None:
    """At revision 0 only prepare inserts; anything else is illegal on an absent state."""
    with pytest.raises(IllegalTransition) as raised:
        await store.mutate(KEY, expected_revision=0, op=Op.EXECUTE, state=_state())
    assert raised.value.data == {"currentRevision": 0, "status": None}
    assert await store.get(KEY) is None


async def test_progress_keeps_the_digest_of_the_request_it_follows(
    prepared_store: RevisionStore,
) -> None:
    """A mutation without a request digest (engine progress) keeps the last request's."""
    stored = await prepared_store.get(KEY)
    assert stored is not None
    assert stored.mutation_digest == DIGEST_A


async def test_a_new_request_replaces_the_digest(prepared_store: RevisionStore) -> None:
    """The row remembers only the latest request."""
    staged = await prepared_store.mutate(
        KEY, expected_revision=2, op=Op.STAGE, state=_state(), request_digest=DIGEST_B
    )
    assert staged.mutation_digest == DIGEST_B


async def test_the_plan_is_written_with_the_new_state_and_read_back_whole(
    store: RevisionStore,
) -> None:
    """The plan given with `prepare` is the plan the store answers, manifest extras included."""
    written = plan(v=1)
    await store.mutate(KEY, expected_revision=0, op=Op.PREPARE, state=_state(), plan=written)
    assert await store.plan(KEY) == written


async def test_a_plan_cannot_be_replaced_after_prepare(prepared_store: RevisionStore) -> None:
    """The plan is fixed at prepare: a later mutation with a plan is a bug, and changes nothing."""
    with pytest.raises(InvalidState, match="plan"):
        await prepared_store.mutate(
            KEY, expected_revision=2, op=Op.STAGE, state=_state(), plan=plan(v=2)
        )
    stored = await prepared_store.get(KEY)
    assert stored is not None
    assert stored.revision == 2


async def test_a_mutation_without_a_state_keeps_the_stored_one(
    prepared_store: RevisionStore,
) -> None:
    """`state=None` moves revision, status and time and leaves the state's own fields as they
    were."""
    before = await prepared_store.get(KEY)
    staged = await prepared_store.mutate(KEY, expected_revision=2, op=Op.STAGE)
    assert before is not None
    assert (staged.revision, staged.status) == (3, "staging")
    unchanged = {"revision", "status", "updatedAt"}
    assert {k: v for k, v in staged.state.to_wire().items() if k not in unchanged} == {
        k: v for k, v in before.state.to_wire().items() if k not in unchanged
    }


async def test_a_new_state_needs_its_plan(store: RevisionStore) -> None:
    """Creating a state without the plan its later steps read is a bug: nothing is written."""
    with pytest.raises(InvalidState, match="plan"):
        await store.mutate(KEY, expected_revision=0, op=Op.PREPARE, state=_state())
    assert await store.get(KEY) is None


async def test_a_state_reads_back_as_the_model_it_was_written_as(store: RevisionStore) -> None:
    """Every field the engine sets survives the row, nested models included."""
    written = IsolatedRestoreNodeState.from_wire(
        {
            **_state().to_wire(),
            "completedResourceMappingIds": ["map-1"],
            "verification": {
                "status": "failed",
                "results": [
                    {
                        "resourceMappingId": "map-1",
                        "resourceType": "volume",
                        "status": "failed",
                        "checks": [{"code": "content-sha256", "status": "failed", "message": "x"}],
                        "checkedAt": 4,
                    }
                ],
                "startedAt": 3,
                "completedAt": 4,
            },
            "cleanup": {
                "resources": [
                    {
                        "resourceMappingId": "map-1",
                        "resourceType": "volume",
                        "status": "failed",
                        "attempts": 2,
                        "updatedAt": 5,
                        "errorCode": "corestore-unavailable",
                        "errorMessage": "503",
                    }
                ],
                "stagingArchive": {
                    "stagingArchiveId": "staging-1",
                    "status": "pending",
                    "attempts": 0,
                },
            },
            "preparedAt": 2,
            "lastErrorCode": "verification-failed",
            "lastErrorMessage": "map-1: content-sha256",
        }
    )
    stored = await store.mutate(KEY, expected_revision=0, op=Op.PREPARE, state=written, plan=plan())
    expected = written.model_copy(
        update={"revision": 1, "status": "preparing", "updated_at": stored.updated_at}
    )
    assert stored.state == expected
    assert (await store.get(KEY)) == stored


async def test_the_row_owns_key_revision_status_and_updated_at(
    store: RevisionStore, clock: ManualClock
) -> None:
    """Stale values for store-owned fields in the given state are replaced from the row."""
    given = _state(revision=99, status="ready", updated_at=1)
    stored = await store.mutate(KEY, expected_revision=0, op=Op.PREPARE, state=given, plan=plan())
    assert stored.state.to_wire() == {
        **_state().to_wire(),
        "restoreId": "restore-1",
        "clusterId": "cluster-1",
        "targetNodeName": "node-1",
        "revision": 1,
        "status": "preparing",
        "updatedAt": stored.updated_at,
    }
    assert stored.updated_at == epoch_ms(clock)
    clock.advance(2.5)
    later = await store.mutate(KEY, expected_revision=1, op=Op.PREPARE_SUCCEEDED, state=given)
    assert later.updated_at == stored.updated_at + 2500


async def test_a_state_naming_another_key_is_refused(store: RevisionStore) -> None:
    """A state whose restoreId differs from the key it is stored under is a bug."""
    with pytest.raises(InvalidState):
        await store.mutate(
            KEY,
            expected_revision=0,
            op=Op.PREPARE,
            state=_state(restore_id="restore-2"),
            plan=plan(),
        )
    assert await store.get(KEY) is None


async def test_a_malformed_digest_is_refused(store: RevisionStore) -> None:
    """Only a request_digest() value is stored as digest."""
    with pytest.raises(InvalidState):
        await store.mutate(
            KEY,
            expected_revision=0,
            op=Op.PREPARE,
            state=_state(),
            plan=plan(),
            request_digest="xyz",
        )


async def test_the_same_restore_on_another_node_is_another_state(
    prepared_store: RevisionStore,
) -> None:
    """The key is the exact cluster/node/restore triple."""
    other = RestoreKey("cluster-1", "node-2", "restore-1")
    assert await prepared_store.get(other) is None
    created = await prepared_store.mutate(
        other, expected_revision=0, op=Op.PREPARE, state=node_state(other), plan=plan()
    )
    assert created.revision == 1


async def test_list_unfinished_returns_exactly_the_in_flight_states(
    prepared_store: RevisionStore,
) -> None:
    """Only preparing/restoring/verifying/cleaning states need resuming after a restart."""
    preparing = RestoreKey("cluster-1", "node-1", "restore-2")
    await prepared_store.mutate(
        preparing, expected_revision=0, op=Op.PREPARE, state=node_state(preparing), plan=plan()
    )
    cleaning = RestoreKey("cluster-1", "node-1", "restore-3")
    state = node_state(cleaning)
    await prepared_store.mutate(
        cleaning, expected_revision=0, op=Op.PREPARE, state=state, plan=plan()
    )
    await prepared_store.mutate(cleaning, expected_revision=1, op=Op.PREPARE_FAILED, state=state)
    await prepared_store.mutate(cleaning, expected_revision=2, op=Op.CLEANUP, state=state)
    unfinished = await prepared_store.list_unfinished()
    assert [(s.key, s.status) for s in unfinished] == [
        (preparing, "preparing"),
        (cleaning, "cleaning"),
    ]


async def _attempt(store: RevisionStore, expected: int, n: int) -> StoredState | RevisionConflict:
    try:
        return await store.mutate(
            KEY, expected_revision=expected, op=Op.STAGE, state=_state(last_error_message=str(n))
        )
    except RevisionConflict as conflict:
        return conflict


def _assert_one_winner(results: list[StoredState | RevisionConflict]) -> StoredState:
    winners = [r for r in results if isinstance(r, StoredState)]
    losers = [r for r in results if isinstance(r, RevisionConflict)]
    assert len(winners) == 1
    assert len(losers) == len(results) - 1
    assert all(c.data == {"currentRevision": 3, "status": "staging"} for c in losers)
    return winners[0]


async def test_a_hundred_concurrent_mutations_have_exactly_one_winner(
    prepared_store: RevisionStore,
) -> None:
    """100 mutations at the same expected revision: one wins, 99 get revision-conflict."""
    results = await asyncio.gather(*(_attempt(prepared_store, 2, n) for n in range(100)))
    winner = _assert_one_winner(list(results))
    assert await prepared_store.get(KEY) == winner


async def test_two_stores_on_one_file_have_exactly_one_winner(
    prepared_store: RevisionStore, state_dir: Path
) -> None:
    """The CAS lives in SQL: a second connection on the same file cannot win too."""
    async with await RevisionStore.open(state_dir) as second:
        attempts = [_attempt(s, 2, n) for n in range(50) for s in (prepared_store, second)]
        winner = _assert_one_winner(list(await asyncio.gather(*attempts)))
        assert await second.get(KEY) == winner
        assert await prepared_store.get(KEY) == winner


async def test_a_locked_database_raises_store_error_chained_to_sqlite(
    prepared_store: RevisionStore, state_dir: Path
) -> None:
    """SQLite failures become StoreError with the sqlite3 exception as cause."""
    async with await RevisionStore.open(state_dir, busy_timeout=0.05) as impatient:
        blocker = sqlite3.connect(prepared_store.path, isolation_level=None)
        try:
            blocker.execute("BEGIN IMMEDIATE")
            with pytest.raises(StoreError) as raised:
                await impatient.mutate(KEY, expected_revision=2, op=Op.STAGE, state=_state())
        finally:
            blocker.close()
    assert isinstance(raised.value.__cause__, sqlite3.OperationalError)
    assert raised.value.retryable


async def test_a_closed_store_raises_store_error(state_dir: Path) -> None:
    """Calls after aclose() fail as StoreError, not as an aiosqlite internals error."""
    closed = await RevisionStore.open(state_dir)
    await closed.aclose()
    await closed.aclose()
    with pytest.raises(StoreError):
        await closed.get(KEY)


async def test_a_row_that_is_no_node_state_reads_as_store_error(
    prepared_store: RevisionStore,
) -> None:
    """A damaged state JSON fails as StoreError naming the field, without quoting the value."""
    await prepared_store.aclose()  # the store is the file's only writer while it is open
    raw = sqlite3.connect(prepared_store.path, isolation_level=None)
    try:
        raw.execute(
            "UPDATE restore_state SET state_json = "
            "json_set(state_json, '$.preparedAt', 'leak-7f3c')"
        )
    finally:
        raw.close()
    async with await RevisionStore.open(prepared_store.path.parent) as reopened:
        with pytest.raises(StoreError, match="preparedAt") as raised:
            await reopened.get(KEY)
    assert "leak-7f3c" not in str(raised.value)
