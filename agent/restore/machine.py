"""The isolated-restore node state machine, as data.

One table, `TRANSITIONS`, says which operation may move a node state from which status to which
status (`None` is "no state exists yet", revision 0). `decide()` reads the table and either
answers the next status or raises `IllegalTransition`; it is pure and changes nothing, so the
engine asks it before doing any work and the store asks it again (as SQL built from the same
table) inside the compare-and-swap that persists the move.

    from status      operation           to status       note
    ---------------  ------------------  --------------  ------------------------------------
    (absent)         prepare             preparing       written before Corestore is asked
    preparing        prepare-succeeded   prepared
    preparing        prepare-failed      failed          Corestore refused
    prepared         stage               staging
    staging          stage               staging         further objects, or a resend
    prepared         execute             restoring       guard: staging complete (empty manifest)
    staging          execute             restoring       guard: staging complete
    restoring        progress            restoring       completed resource mappings
    restoring        restore-succeeded   verifying
    restoring        restore-failed      failed
    verifying        progress            verifying       verification results so far
    verifying        verify-passed       ready
    verifying        verify-failed       failed
    prepared         cleanup             cleaning
    staging          cleanup             cleaning
    ready            cleanup             cleaning
    failed           cleanup             cleaning
    cleanup-failed   cleanup             cleaning        cleanup-failed is retryable
    cleaning         progress            cleaning        per-resource cleanup progress
    cleaning         cleanup-succeeded   cleaned         terminal
    cleaning         cleanup-failed      cleanup-failed

`prepare`, `stage`, `execute` and `cleanup` are Cloudly's requests; the others are the engine's
own progress writes. Every one of them is a mutation and advances the revision by one.

What `preparing` means: the prepare request's own transient phase. The engine persists
`preparing` (revision 1, the prepare's answer) *before* it asks Corestore to prepare, as a
write-ahead intent: if the agent dies while Corestore works, the row still says a prepare was
attempted, so the scratch resources Corestore may have made are reachable by cleanup instead of
leaking. When Corestore answers, the engine's task writes `prepared` (or `failed`, with
`lastErrorCode`). A restart that finds
`preparing` cannot finish the call on its own (the grant was never persisted): the state stays
visible as it is, and the work resumes when Cloudly repeats the request with a fresh grant (an
exact replay, see `replay.py`). The same holds for `restoring`/`verifying` and `cleaning`:
`IN_FLIGHT` names these statuses.

The execute guard: `execute` needs every manifest object written. From `prepared` that is true
only for an empty manifest (any object would have moved the state to `staging`); from `staging`
it is true once the last object is written. The table says where `execute` goes; the guard is a
fact only the engine knows (the manifest), passed to `decide(..., staging_complete=...)`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from agent.contracts.isolatedrestore import NODE_STATUSES, NodeStatus
from agent.errors import IllegalTransition

__all__ = [
    "GUARDED_BY_STAGING_COMPLETE",
    "IN_FLIGHT",
    "NODE_STATUSES",
    "TERMINAL",
    "TRANSITIONS",
    "NodeStatus",
    "Op",
    "decide",
    "render_table",
    "sources",
    "target",
]


class Op(enum.StrEnum):
    """Everything that may move a node state: Cloudly's requests and the engine's progress."""

    PREPARE = "prepare"
    PREPARE_SUCCEEDED = "prepare-succeeded"
    PREPARE_FAILED = "prepare-failed"
    STAGE = "stage"
    EXECUTE = "execute"
    PROGRESS = "progress"
    RESTORE_SUCCEEDED = "restore-succeeded"
    RESTORE_FAILED = "restore-failed"
    VERIFY_PASSED = "verify-passed"
    VERIFY_FAILED = "verify-failed"
    CLEANUP = "cleanup"
    CLEANUP_SUCCEEDED = "cleanup-succeeded"
    CLEANUP_FAILED = "cleanup-failed"


_CLEANABLE: Final[tuple[NodeStatus, ...]] = (
    "prepared",
    "staging",
    "ready",
    "failed",
    "cleanup-failed",
)

TRANSITIONS: Final[Mapping[tuple[NodeStatus | None, Op], NodeStatus]] = MappingProxyType(
    {
        (None, Op.PREPARE): "preparing",
        ("preparing", Op.PREPARE_SUCCEEDED): "prepared",
        ("preparing", Op.PREPARE_FAILED): "failed",
        ("prepared", Op.STAGE): "staging",
        ("staging", Op.STAGE): "staging",
        ("prepared", Op.EXECUTE): "restoring",
        ("staging", Op.EXECUTE): "restoring",
        ("restoring", Op.PROGRESS): "restoring",
        ("restoring", Op.RESTORE_SUCCEEDED): "verifying",
        ("restoring", Op.RESTORE_FAILED): "failed",
        ("verifying", Op.PROGRESS): "verifying",
        ("verifying", Op.VERIFY_PASSED): "ready",
        ("verifying", Op.VERIFY_FAILED): "failed",
        **{(status, Op.CLEANUP): "cleaning" for status in _CLEANABLE},
        ("cleaning", Op.PROGRESS): "cleaning",
        ("cleaning", Op.CLEANUP_SUCCEEDED): "cleaned",
        ("cleaning", Op.CLEANUP_FAILED): "cleanup-failed",
    }
)
"""(status or None for absent, operation) -> next status. Anything missing is illegal."""

GUARDED_BY_STAGING_COMPLETE: Final[frozenset[tuple[NodeStatus | None, Op]]] = frozenset(
    {("prepared", Op.EXECUTE), ("staging", Op.EXECUTE)}
)
"""Moves that are legal only once every manifest object is written."""

IN_FLIGHT: Final[frozenset[NodeStatus]] = frozenset(
    {"preparing", "restoring", "verifying", "cleaning"}
)
"""Statuses only the engine leaves; after a restart they wait for Cloudly to repeat the request."""

TERMINAL: Final[frozenset[NodeStatus]] = frozenset(
    status for status in NODE_STATUSES if not any(key[0] == status for key in TRANSITIONS)
)
"""Statuses no operation leaves (`cleaned`)."""


def target(status: NodeStatus | None, op: Op, *, revision: int) -> NodeStatus:
    """The table's answer for `op` in `status`, ignoring guards; `IllegalTransition` if none."""
    try:
        return TRANSITIONS[(status, op)]
    except KeyError:
        raise IllegalTransition(operation=op.value, status=status, current=revision) from None


def decide(
    status: NodeStatus | None,
    op: Op,
    *,
    revision: int,
    staging_complete: bool = False,
) -> NodeStatus:
    """The status `op` moves a state in `status` to, or `IllegalTransition` (nothing changes).

    `revision` is the state's current revision (0 when absent); it only travels in the error.
    `staging_complete` is the engine's fact that every manifest object is written; it matters
    only for the moves in `GUARDED_BY_STAGING_COMPLETE`.
    """
    next_status = target(status, op, revision=revision)
    if (status, op) in GUARDED_BY_STAGING_COMPLETE and not staging_complete:
        raise IllegalTransition(operation=op.value, status=status, current=revision)
    return next_status


def sources(op: Op) -> dict[NodeStatus | None, NodeStatus]:
    """Every status `op` may leave, with where it goes (the store builds its SQL from this)."""
    return {status: to for (status, candidate), to in TRANSITIONS.items() if candidate is op}


def render_table() -> str:
    """The table as Markdown rows, in table order (docs/isolated-restore.md embeds this)."""
    lines = ["| from | operation | to |", "|---|---|---|"]
    for (status, op), to in TRANSITIONS.items():
        guard = " (staging complete)" if (status, op) in GUARDED_BY_STAGING_COMPLETE else ""
        lines.append(f"| {status or '(absent)'} | `{op.value}`{guard} | {to} |")
    return "\n".join(lines)
