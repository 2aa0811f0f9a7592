"""The hooks the parts call so the daemon can be watched: small typed protocols, no library.

Each part takes the narrow protocol it reports to, defaulting to `NULL_OBSERVER` (which does
nothing), so a part never knows what watches it and its tests need no metrics at all. The
composition root passes `agent.watch.metrics.Metrics`, the one implementation, which turns every
call into Prometheus samples. Nothing here imports an I/O or metrics library.

    part                           protocol            what it reports
    agent/session/client.py        SessionObserver     a session authenticated; one lost (cause)
    agent/session/peer.py          PeerObserver        a request answered (method, code, s);
                                                       stream bytes in and out; requests
                                                       seated per class; one deferred
                                                       (`retry`: its class was full)
    agent/store/ (the store)       StoreObserver       a mutation (op, outcome, s); a chunk
                                                       recorded (bytes staged); an object
                                                       written (bytes verified); a write the
                                                       disk refused (cause); writes again
    agent/store/retention.py       StoreObserver       records retention forgot (restores,
                                                       jobs); bytes it gave back to the disk;
                                                       a pass that failed
    agent/store/startup.py         StoreObserver       the one VACUUM of an older file
                                                       skipped or failed
    agent/corestore/transport.py   CorestoreObserver   one HTTP attempt (route, answer kind, s);
    agent/corestore/edge.py                            one resend of a route; a control
                                                       credential refused for good; a node's
                                                       Corestore full (or not any more)
    agent/startup/reconcile.py             ReconcileObserver   the state was salvaged or reset (how,
                                                       when); reconciliation with Corestore
                                                       pending or done; orphans taken over
    agent/watch/loopwatch.py             LoopObserver        one event-loop lag measurement
    agent/transfers/gate.py        TransferObserver    a node's moving and queued transfers
                                                       changed; how long one waited its turn
    agent/transfers/budget.py      BudgetObserver      the byte budget's drawn bytes and
                                                       waiters; how long a draw waited
    agent/transfers/memory.py                BudgetObserver      the allocator gave memory back
    agent/credentials/contest.py   RecipientObserver   Cloudly retired the agent's recipient;
                                                       another agent uses the same token (or
                                                       no longer)
    agent/relay/runner.py          RelayObserver       how a relay request was answered
                                                       (kind, answer: a new run, joined,
                                                       resumed, recorded, ...)

Hooks are called on the event loop, synchronously, and must not raise or block. `Tee`
(`agent/watch/tee.py`) hands every hook to several observers (the metrics and the status' own,
`agent.watch.statushooks.StatusHooks`).
"""

from __future__ import annotations

from typing import Final, Literal, Protocol

__all__ = [
    "NULL_OBSERVER",
    "BudgetObserver",
    "CorestoreObserver",
    "Direction",
    "LoopObserver",
    "NullObserver",
    "PeerObserver",
    "ReconcileObserver",
    "RelayObserver",
    "SessionObserver",
    "StoreObserver",
    "TransferObserver",
]

Direction = Literal["in", "out"]


class SessionObserver(Protocol):
    """What the Cloudly session reports."""

    def session_connected(self, *, reconnect: bool) -> None:
        """A connection was authenticated and serves requests (`reconnect`: not the first)."""

    def session_lost(self, *, cause: str, permanent: bool) -> None:
        """An attempt failed or a live session ended; `cause` is a short stable kebab-case
        word (`tls-verification`, `dns-not-found`, `token-refused`, `refused`, `closed`...)."""


class PeerObserver(Protocol):
    """What a peer reports about the requests it serves and the streams it carries."""

    def request_handled(self, *, method: str, code: str, seconds: float) -> None:
        """A request of `method` was answered: `code` is `ok` or the wire error code."""

    def requests_seated(self, *, request_class: str, count: int) -> None:
        """`count` requests of `request_class` (control, stream) hold a seat now."""

    def requests_deferred(self, *, request_class: str, count: int) -> None:
        """`count` more requests were answered `retry`: their class (or their node's share of
        it) was full."""

    def stream_bytes(self, *, direction: Direction, count: int) -> None:
        """`count` payload bytes of a VirtualStream were received (`in`) or sent (`out`)."""


class StoreObserver(Protocol):
    """What the revision store reports."""

    def store_mutation(self, *, op: str, outcome: str, seconds: float) -> None:
        """One `mutate()`: `outcome` is `ok` or the error code it raised."""

    def chunk_recorded(self, *, length: int) -> None:
        """Corestore accepted (and verified the digest of) a staged chunk of `length` bytes."""

    def object_written(self, *, size: int) -> None:
        """A staged object of `size` bytes proved complete (size, sha256 and commit)."""

    def retention_deleted(self, *, what: str, count: int) -> None:
        """Retention forgot `count` old finished records: `what` is `restore` (a node state
        with everything it owned) or `job` (a relay job)."""

    def retention_freed(self, *, count: int) -> None:
        """Retention gave `count` bytes of the database file back to the file system."""

    def retention_failed(self) -> None:
        """A retention pass failed (the store failed or closed); the next one tries again."""

    def vacuum_failed(self, *, reason: str) -> None:
        """The one `VACUUM` that switches an older database to giving pages back did not run:
        `reason` is `skipped` (no room for a copy) or `failed`."""

    def state_write_failed(self, *, cause: str) -> None:
        """The disk refused a write of the state (`cause`: `disk-full`, `read-only`,
        `io-error`): nothing was written."""

    def state_writable(self) -> None:
        """A write of the state committed after the disk had refused one."""


class CorestoreObserver(Protocol):
    """What the Corestore HTTP edge reports."""

    def corestore_answer(self, *, route: str, outcome: str, seconds: float) -> None:
        """One attempt of `route` ended: `outcome` is the answer kind (`ok`, `gone`,
        `integrity`, `refused`, `unavailable`) or `error` when no answer came."""

    def corestore_resend(self, *, route: str) -> None:
        """`route` is sent again because Corestore was unavailable."""

    def credential_rejected(self) -> None:
        """Corestore refused the node's control credential for good: also after it was fetched
        again, or with no other to try (`CorestoreCredentialRejected`)."""

    def corestore_unavailable(self, *, node: str, since: float | None) -> None:
        """`node`'s Corestore gives no usable answer since `since` (epoch seconds), or answers
        again (None)."""

    def corestore_full(self, *, node: str, full: bool) -> None:
        """The Corestore of `node` answered that its disk is full (`full`), or took a write
        again after it had (`not full`)."""


class ReconcileObserver(Protocol):
    """What the reconciliation after a salvaged or reset state reports."""

    def state_recovered(self, *, how: str, at: float) -> None:
        """The state was salvaged or reset (`how`) at `at` (epoch seconds) and this agent
        started on it."""

    def reconcile_pending(self, *, pending: bool) -> None:
        """Reconciliation with the nodes' Corestore is still due (`pending`) or done."""

    def orphans_adopted(self, *, what: str, count: int) -> None:
        """`count` resources Corestore held that the state did not know were taken into
        cleanup work: `restore` (an isolated restore's scratch and staging) or `import` (a
        closure import, aborted)."""


class LoopObserver(Protocol):
    """What the event-loop watch reports."""

    def loop_lag(self, *, seconds: float) -> None:
        """A timer meant to fire now fired `seconds` late."""


class TransferObserver(Protocol):
    """What the per-node transfer gate reports."""

    def transfers_changed(self, *, node: str, moving: int, queued: int) -> None:
        """`node` now has `moving` transfers under way and `queued` waiting their turn."""

    def transfer_waited(self, *, kind: str, seconds: float) -> None:
        """A transfer of `kind` starts moving after `seconds` in its node's queue (0: none)."""


class BudgetObserver(Protocol):
    """What the byte budget (and the memory trimmer beside it) reports."""

    def budget_changed(self, *, limit: int, held: int, waiting: int) -> None:
        """`held` of `limit` bytes are drawn; `waiting` draws wait for room."""

    def budget_waited(self, *, seconds: float) -> None:
        """A draw got its bytes after `seconds` (0: at once)."""

    def memory_trimmed(self, *, released: int) -> None:
        """The allocator was asked to give free memory back; RSS fell by `released` bytes."""


class RelayObserver(Protocol):
    """What the relay's job runner reports."""

    def relay_answered(self, *, kind: str, answer: str, reason: str) -> None:
        """A backup or restore request was answered by the request rule's `answer` (start,
        resume, retry, join, recorded, conflict, busy), for `reason`: what it met, or for a
        restore meeting its service's ended run, where that run's answer went."""


class NullObserver:
    """Every hook, doing nothing: the default of every part."""

    def session_connected(self, *, reconnect: bool) -> None:
        """Nothing."""

    def session_lost(self, *, cause: str, permanent: bool) -> None:
        """Nothing."""

    def request_handled(self, *, method: str, code: str, seconds: float) -> None:
        """Nothing."""

    def requests_seated(self, *, request_class: str, count: int) -> None:
        """Nothing."""

    def requests_deferred(self, *, request_class: str, count: int) -> None:
        """Nothing."""

    def stream_bytes(self, *, direction: Direction, count: int) -> None:
        """Nothing."""

    def store_mutation(self, *, op: str, outcome: str, seconds: float) -> None:
        """Nothing."""

    def chunk_recorded(self, *, length: int) -> None:
        """Nothing."""

    def object_written(self, *, size: int) -> None:
        """Nothing."""

    def retention_deleted(self, *, what: str, count: int) -> None:
        """Nothing."""

    def retention_freed(self, *, count: int) -> None:
        """Nothing."""

    def retention_failed(self) -> None:
        """Nothing."""

    def vacuum_failed(self, *, reason: str) -> None:
        """Nothing."""

    def corestore_answer(self, *, route: str, outcome: str, seconds: float) -> None:
        """Nothing."""

    def corestore_resend(self, *, route: str) -> None:
        """Nothing."""

    def credential_rejected(self) -> None:
        """Nothing."""

    def corestore_unavailable(self, *, node: str, since: float | None) -> None:
        """Nothing."""

    def corestore_full(self, *, node: str, full: bool) -> None:
        """Nothing."""

    def state_write_failed(self, *, cause: str) -> None:
        """Nothing."""

    def state_writable(self) -> None:
        """Nothing."""

    def state_recovered(self, *, how: str, at: float) -> None:
        """Nothing."""

    def reconcile_pending(self, *, pending: bool) -> None:
        """Nothing."""

    def orphans_adopted(self, *, what: str, count: int) -> None:
        """Nothing."""

    def recipient_retired(self) -> None:
        """Nothing."""

    def duplicate_agent(self, *, text: str | None) -> None:
        """Nothing."""

    def loop_lag(self, *, seconds: float) -> None:
        """Nothing."""

    def transfers_changed(self, *, node: str, moving: int, queued: int) -> None:
        """Nothing."""

    def transfer_waited(self, *, kind: str, seconds: float) -> None:
        """Nothing."""

    def budget_changed(self, *, limit: int, held: int, waiting: int) -> None:
        """Nothing."""

    def budget_waited(self, *, seconds: float) -> None:
        """Nothing."""

    def memory_trimmed(self, *, released: int) -> None:
        """Nothing."""

    def relay_answered(self, *, kind: str, answer: str, reason: str) -> None:
        """Nothing."""


NULL_OBSERVER: Final = NullObserver()
