"""The isolated-restore node state machine, as data.

One table, `RESTORE_TABLE` (an `agent.table.TransitionTable`), says which operation may
move a node state from which status to which status (`None` is "no state exists yet", revision
0). `RESTORE_TABLE.decide()` either answers the next status or raises `IllegalTransition`; it is
pure and changes nothing, so the engine asks it before doing any work and the store asks it
again (as SQL built from the same table) inside the compare-and-swap that persists the move.

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
    failed           resume-prepare      preparing       guard: the failure is retryable
    failed           resume-execute      restoring       guard: the failure is retryable
    prepared         cleanup             cleaning
    staging          cleanup             cleaning
    ready            cleanup             cleaning
    failed           cleanup             cleaning
    cleanup-failed   cleanup             cleaning        cleanup-failed is retryable
    cleaning         progress            cleaning        per-resource cleanup progress
    cleaning         cleanup-succeeded   cleaned         terminal
    cleaning         cleanup-failed      cleanup-failed
    (absent)         adopt               cleanup-failed  what Corestore holds of a restore a
                                                         salvaged or reset state forgot

`prepare`, `stage`, `execute` and `cleanup` are Cloudly's requests; the others are the engine's
own progress writes, and `adopt` is reconciliation's (`agent/startup/reconcile.py`): after the
state was salvaged or reset, a restore Corestore still holds that the state does not know becomes a
`cleanup-failed` state, which Cloudly's next cleanup cleans like any other. Every one of them
is a mutation and advances the revision by one.

What resumes a `failed` restore: Cloudly's exact replay of the request whose work failed (the
state's request digest is still that request's: the engine's progress writes keep it). When
the failure is one that may pass (`lastErrorCode` is the code of a retryable Corestore or
transfer error: `corestore-unavailable`, `credential-unavailable`,
`corestore-credential-rejected`, `integrity-mismatch`, `transfer-interrupted`, ...), an exact
replay of prepare moves it back to `preparing` (`resume-prepare`) and one of execute to
`restoring` (`resume-execute`), and the work runs again from where it stopped (restored
mappings and verification results are kept). A failure that will not pass (`corestore-refused`,
`restore-failed`: Corestore's own verdict on a resource, `verification-failed`) is answered as
it stands, and only a cleanup leaves it.

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
fact only the engine knows (the manifest), passed to `RESTORE_TABLE.decide(..., guard=...)`.
"""

from __future__ import annotations

import enum
from typing import Final

from agent.contracts.isolatedrestore import NODE_STATUSES, NodeStatus
from agent.table import TransitionTable

__all__ = [
    "FORGETTABLE",
    "IN_FLIGHT",
    "NODE_STATUSES",
    "RESTORE_TABLE",
    "TERMINAL",
    "NodeStatus",
    "Op",
]


class Op(enum.StrEnum):
    """Everything that may move a node state: Cloudly's requests and the engine's progress."""

    PREPARE = "prepare"
    PREPARE_SUCCEEDED = "prepare-succeeded"
    PREPARE_FAILED = "prepare-failed"
    RESUME_PREPARE = "resume-prepare"
    RESUME_EXECUTE = "resume-execute"
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
    ADOPT = "adopt"


_CLEANABLE: Final[tuple[NodeStatus, ...]] = (
    "prepared",
    "staging",
    "ready",
    "failed",
    "cleanup-failed",
)

RESTORE_TABLE: Final = TransitionTable[NodeStatus, Op](
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
        ("failed", Op.RESUME_PREPARE): "preparing",
        ("failed", Op.RESUME_EXECUTE): "restoring",
        **{(status, Op.CLEANUP): "cleaning" for status in _CLEANABLE},
        ("cleaning", Op.PROGRESS): "cleaning",
        ("cleaning", Op.CLEANUP_SUCCEEDED): "cleaned",
        ("cleaning", Op.CLEANUP_FAILED): "cleanup-failed",
        (None, Op.ADOPT): "cleanup-failed",
    },
    guards={
        ("prepared", Op.EXECUTE): "staging complete",
        ("staging", Op.EXECUTE): "staging complete",
        ("failed", Op.RESUME_PREPARE): "the failure is retryable",
        ("failed", Op.RESUME_EXECUTE): "the failure is retryable",
    },
    column="operation",
)
"""(status or None for absent, operation) -> next status; anything missing is illegal. The
two `execute`s are legal only once every manifest object is written; the two resumes only when
the failure may pass (`lastErrorCode` retryable)."""

IN_FLIGHT: Final[frozenset[NodeStatus]] = frozenset(
    {"preparing", "restoring", "verifying", "cleaning"}
)
"""Statuses only the engine leaves; after a restart they wait for Cloudly to repeat the request."""

TERMINAL: Final = RESTORE_TABLE.terminal(NODE_STATUSES)
"""Statuses no operation leaves (`cleaned`)."""

FORGETTABLE: Final[frozenset[NodeStatus]] = TERMINAL
"""The statuses retention may forget once old enough: the terminal ones only (`cleaned`).
`failed` and `cleanup-failed` are left by `cleanup` and may still hold scratch resources and a
staging archive on Corestore that only a cleanup removes (seed 000: a failed restore "must
proceed through cleanup before its source-backup hold can be released"; cleanup-failed "remains
retryable"): forgetting them would turn Cloudly's next cleanup into `restore-not-found` and
leak what they hold. An in-flight or idle state is Cloudly's to finish or expire."""
