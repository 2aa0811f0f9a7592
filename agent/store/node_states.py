"""`NodeStates`: the isolated-restore node states, their compare-and-swap revisions and the
memory `get()` answers from.

One row of `restore_state` per (cluster_id, node_name, restore_id); a missing row is revision
0. `mutate()` is one SQL statement, hence one transaction: `INSERT ... ON CONFLICT DO NOTHING`
from revision 0, otherwise `UPDATE ... SET revision = revision + 1, status = CASE status ... END
WHERE <key> AND revision = :expected AND status IN (<statuses the operation may leave>)`, both
built from the state machine's table (`transitions.py`). The compare-and-swap therefore lives
in SQL: two agents (or two stores) on one file cannot both win, and an illegal move cannot be
persisted even by a buggy caller. When the statement changes no row, the row is read once to
say why: the revision moved (`RevisionConflict`, with the current revision and status) or, the
revision being the expected one, the operation is illegal in that status
(`IllegalTransition`). Revisions only grow, so the revision being equal means nothing changed
in between.

The row holds the node state (`IsolatedRestoreNodeState`, the frozen contract model) as JSON
written and read only by `codec.py`. The engine's `PreparedPlan` is written once, with the state
it belongs to (the `prepare` that creates the row, in the same transaction: `_create`), and
never again; `plans.py` reads it back. A mutation that does not change the state (a stage)
passes no state: the row keeps its JSON and only the revision, status, digest and time move.

`get()` answers from memory when it can (`StateMemory`): the `CACHED_STATES` node states last
read or written. While the agent runs its store is the file's only writer (`agent.lock`,
`statedir.py`), and every write of a state row goes through `mutate()` (which keeps the row it
returns) or `upkeep.py`'s forgetting (which drops them all), so what it keeps is what the file
holds. Measured under sixteen stages at once (docs/benchmarks.md, "One byte budget"): the reader
connection's hop to its thread and back was 2 ms at the median and 27 ms at the 99th
percentile, most of a status call's time in the agent.

The key condition (`KEY_WHERE`), the state row's columns (`STATE_COLUMNS`) and a restore's
absence (`not_found`) are the other facets' too: every row of a restore hangs from its state.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Final

import aiosqlite

from agent.contracts.isolatedrestore import IsolatedRestoreNodeState
from agent.domain.restore_machine import IN_FLIGHT, RESTORE_TABLE, Op
from agent.domain.restores import PreparedPlan, RestoreKey, StoredState
from agent.errors import (
    AgentError,
    IllegalTransition,
    InvalidState,
    RestoreNotFound,
    RevisionConflict,
    StoreError,
)
from agent.store.codec import EncodedPlan, encode_plan, encode_state, is_sha256, to_stored
from agent.store.database import Database
from agent.store.transitions import status_moves

__all__ = [
    "CACHED_STATES",
    "KEY_WHERE",
    "STATE_COLUMNS",
    "NodeStates",
    "StateMemory",
    "not_found",
]

CACHED_STATES: Final = 1024
"""How many node states `get()` keeps in memory (a few KiB each: the small state row)."""

KEY_WHERE: Final = (
    "cluster_id = :cluster_id AND node_name = :node_name AND restore_id = :restore_id"
)
STATE_COLUMNS: Final = (
    "cluster_id, node_name, restore_id, revision, status, state_json, mutation_digest, updated_at"
)
_INSERT: Final = f"""
INSERT INTO restore_state ({STATE_COLUMNS})
VALUES (:cluster_id, :node_name, :restore_id, 1, :to_status, :state_json, :digest, :now)
ON CONFLICT (cluster_id, node_name, restore_id) DO NOTHING
RETURNING {STATE_COLUMNS}
"""  # noqa: S608  # placeholders only; column names are constants
_INSERT_PLAN: Final = """
INSERT INTO restore_plan (cluster_id, node_name, restore_id, mappings_json, manifest_json,
                          mapping_count, object_count, manifest_bytes)
VALUES (:cluster_id, :node_name, :restore_id, :mappings_json, :manifest_json,
        :mapping_count, :object_count, :manifest_bytes)
"""
_INSERT_OBJECT: Final = """
INSERT INTO manifest_object (cluster_id, node_name, restore_id, object_path, size, sha256)
VALUES (?, ?, ?, ?, ?, ?)
"""


def _update_statement(op: Op) -> tuple[str, dict[str, str]] | None:
    """The CAS `UPDATE` for `op`, its status CASE and IN list built from the table."""
    moves = status_moves(RESTORE_TABLE, op)
    if moves is None:
        return None
    sql = f"""
UPDATE restore_state
SET revision = revision + 1,
    status = {moves.case},
    state_json = COALESCE(:state_json, state_json),
    mutation_digest = COALESCE(:digest, mutation_digest),
    updated_at = :now
WHERE {KEY_WHERE} AND revision = :expected AND status IN ({moves.allowed})
RETURNING {STATE_COLUMNS}
"""  # noqa: S608  # placeholders only; the shape comes from the transition table
    return sql, moves.params


_UPDATES: Final = {op: statement for op in Op if (statement := _update_statement(op)) is not None}


def not_found(key: RestoreKey) -> RestoreNotFound:
    """The error of a call about a restore the store holds no state of."""
    return RestoreNotFound(
        f"no isolated-restore state for restore {key.restore_id} on node {key.node_name} of "
        f"cluster {key.cluster_id}"
    )


class StateMemory:
    """The node states last read or written (the `CACHED_STATES` most recently used), and
    whether a read may be kept: not when a write of state rows happened meanwhile."""

    def __init__(self) -> None:
        self._states: OrderedDict[RestoreKey, StoredState] = OrderedDict()
        # Counts the writes of state rows: a read that saw one happen meanwhile is not kept
        # (it may be older than what the write left).
        self._writes = 0

    def kept(self, key: RestoreKey) -> StoredState | None:
        """The state of `key` in memory (now the most recently used), or None."""
        kept = self._states.get(key)
        if kept is not None:
            self._states.move_to_end(key)
        return kept

    @property
    def writes(self) -> int:
        """A mark to take before a read: `keep_read` keeps it only if no write began since."""
        return self._writes

    def keep_read(self, key: RestoreKey, stored: StoredState, *, writes: int) -> None:
        """Keep what a read found, unless a write of state rows began since `writes` was
        taken (the read may be older than what the write left)."""
        if writes == self._writes:
            self._keep(key, stored)

    @contextmanager
    def writing(self, key: RestoreKey | None) -> Iterator[Callable[[StoredState], StoredState]]:
        """Around a write of state rows (`key`'s, or any: None): once it ends, what is kept
        for them is the row the write returned (`keep`) or nothing, and a read that began
        before the end is not kept (it may be older than what the write left). A write that
        fails, or is cancelled after SQLite committed it, leaves nothing behind to answer
        from."""
        kept: list[StoredState] = []

        def keep(stored: StoredState) -> StoredState:
            kept.append(stored)
            return stored

        self._writes += 1
        try:
            yield keep
        finally:
            self._writes += 1
            if key is None:
                self._states.clear()
            elif kept:
                self._keep(key, kept[-1])
            else:
                self._states.pop(key, None)

    def _keep(self, key: RestoreKey, stored: StoredState) -> None:
        self._states[key] = stored
        self._states.move_to_end(key)
        while len(self._states) > CACHED_STATES:
            self._states.popitem(last=False)


class NodeStates:
    """The node states: read (from memory when it can), moved by compare-and-swap, listed
    while in flight."""

    def __init__(self, database: Database, memory: StateMemory) -> None:
        self._database = database
        self._memory = memory

    async def get(self, key: RestoreKey) -> StoredState | None:
        """The state stored under `key`, or None (revision 0): from memory when the store read
        or wrote it lately, else read on the reader connection, waiting for no write."""
        if not self._database.is_open:
            raise StoreError("the revision store is closed")
        kept = self._memory.kept(key)
        if kept is not None:
            return kept
        writes = self._memory.writes
        async with self._database.reading() as db:
            rows = await db.execute_fetchall(
                f"SELECT {STATE_COLUMNS} FROM restore_state WHERE {KEY_WHERE}",  # noqa: S608
                key.as_params(),
            )
        stored = next((to_stored(row) for row in rows), None)
        if stored is not None:
            self._memory.keep_read(key, stored, writes=writes)
        return stored

    def kept(self, key: RestoreKey) -> StoredState | None:
        """The state of `key` as `get()` would answer it from memory, without waiting; None
        when it is not in memory (`get()` reads it) or the store is closed."""
        return self._memory.kept(key) if self._database.is_open else None

    async def mutate(
        self,
        key: RestoreKey,
        *,
        expected_revision: int,
        op: Op,
        state: IsolatedRestoreNodeState | None = None,
        plan: PreparedPlan | None = None,
        request_digest: str | None = None,
    ) -> StoredState:
        """Apply `op` at `expected_revision`: one transaction, revision + 1, or nothing at all.

        `state` is the whole node state, or None to keep the stored one as it is (a stage moves
        only the revision and status); the store owns `restoreId`, `clusterId`,
        `targetNodeName` (must match `key`), `revision`, `status` (the table decides it from
        `op`) and `updatedAt`, whatever `state` says. `plan` is the engine's `PreparedPlan`,
        given exactly when the state is created (revision 0, with its state) and never after:
        it is fixed at prepare. `request_digest` is given for a Cloudly request and None for the
        engine's own progress, which keeps the digest of the request it follows.

        Raises `RevisionConflict` (revision not current), `IllegalTransition` (revision current,
        `op` illegal in its status), `InvalidState` (a bug: a secret, a foreign key, no state or
        plan for a new state, a plan for an existing one), `StoreError` (SQLite failed).
        """
        if isinstance(expected_revision, bool) or not isinstance(expected_revision, int):
            raise InvalidState("expected_revision must be an int")
        if request_digest is not None and not is_sha256(request_digest):
            raise InvalidState("request_digest must be 64 lower-case hex characters")
        creates = expected_revision == 0 and RESTORE_TABLE.sources(op).get(None) is not None
        if creates and (plan is None or state is None):
            raise InvalidState("a new node state needs its state and its plan")
        if not creates and plan is not None:
            raise InvalidState("the plan is written with the state it belongs to, and never after")
        params: dict[str, Any] = {
            **key.as_params(),
            "expected": expected_revision,
            "state_json": None if state is None else encode_state(key, state),
            "digest": request_digest,
            "now": self._database.now_ms(),
        }
        # A plan holds the whole manifest (10,000 objects take ~40 ms to check and encode):
        # off the loop, once per restore.
        encoded = None if plan is None else await asyncio.to_thread(encode_plan, plan)
        started = self._database.clock.monotonic()
        try:
            stored = await self._mutate(op, key, params, expected_revision, encoded)
        except AgentError as exc:
            self._observe_mutation(op, exc.code, started)
            raise
        self._observe_mutation(op, "ok", started)
        return stored

    async def list_unfinished(self) -> list[StoredState]:
        """States in an in-flight status (`restore_machine.IN_FLIGHT`), oldest change first."""
        marks = ", ".join("?" for _ in IN_FLIGHT)
        async with self._database.connection() as db:
            rows = await db.execute_fetchall(
                f"SELECT {STATE_COLUMNS} FROM restore_state WHERE status IN ({marks}) "  # noqa: S608
                "ORDER BY updated_at, cluster_id, node_name, restore_id",
                sorted(IN_FLIGHT),
            )
        return [to_stored(row) for row in rows]

    def _observe_mutation(self, op: Op, outcome: str, started: float) -> None:
        seconds = self._database.clock.monotonic() - started
        self._database.observer.store_mutation(op=op.value, outcome=outcome, seconds=seconds)

    async def _mutate(
        self,
        op: Op,
        key: RestoreKey,
        params: dict[str, Any],
        expected_revision: int,
        plan: EncodedPlan | None,
    ) -> StoredState:
        update = _UPDATES.get(op)
        with self._memory.writing(key) as keep:
            async with self._database.connection(write=True) as db:
                rows: Iterable[sqlite3.Row] = ()
                insert_to = RESTORE_TABLE.sources(op).get(None)
                if expected_revision == 0 and insert_to is not None and plan is not None:
                    rows = await _create(db, key, {**params, "to_status": insert_to}, plan)
                elif expected_revision > 0 and update is not None:
                    sql, status_params = update
                    rows = await db.execute_fetchall(sql, {**params, **status_params})
                for row in rows:
                    return keep(to_stored(row))
                current = await db.execute_fetchall(
                    f"SELECT revision, status FROM restore_state WHERE {KEY_WHERE}",  # noqa: S608
                    key.as_params(),
                )
        revision, status = next(iter(current), (0, None))
        if revision != expected_revision:
            raise RevisionConflict(expected=expected_revision, current=revision, status=status)
        raise IllegalTransition(operation=op.value, status=status, current=revision)


async def _create(
    db: aiosqlite.Connection, key: RestoreKey, params: dict[str, Any], plan: EncodedPlan
) -> list[sqlite3.Row]:
    """The new state row with its plan and manifest rows, in one transaction; no row when the
    key exists already (nothing is written then)."""
    await db.execute_fetchall("BEGIN IMMEDIATE")
    try:
        rows = list(await db.execute_fetchall(_INSERT, params))
        if rows:
            await db.execute_fetchall(
                _INSERT_PLAN,
                {
                    **key.as_params(),
                    "mappings_json": plan.mappings_json,
                    "manifest_json": plan.manifest_json,
                    "mapping_count": plan.mapping_count,
                    "object_count": plan.object_count,
                    "manifest_bytes": plan.manifest_bytes,
                },
            )
            routing = (key.cluster_id, key.node_name, key.restore_id)
            cursor = await db.executemany(_INSERT_OBJECT, [(*routing, *o) for o in plan.objects])
            await cursor.close()
        await db.execute_fetchall("COMMIT")
    except BaseException:
        await db.rollback()
        raise
    return rows
