"""The hooks the parts call so the daemon can be watched: small typed protocols, no library.

Each part takes the narrow protocol it reports to, defaulting to `NULL_OBSERVER` (which does
nothing), so a part never knows what watches it and its tests need no metrics at all. The
composition root passes `agent.metrics.Metrics`, the one implementation, which turns every
call into Prometheus samples. Nothing here imports an I/O or metrics library.

    part                           protocol            what it reports
    agent/session/client.py        SessionObserver     a session authenticated; one lost (cause)
    agent/session/peer.py          PeerObserver        a request answered (method, code, s);
                                                       stream bytes in and out
    agent/store/store.py           StoreObserver       a mutation (op, outcome, s); a chunk
                                                       recorded (bytes staged); an object
                                                       written (bytes verified)
    agent/store/retention.py       StoreObserver       records retention forgot (restores,
                                                       jobs); bytes it gave back to the disk
    agent/corestore/transport.py   CorestoreObserver   one HTTP attempt (route, answer kind, s);
    agent/corestore/client.py                          one resend of a route; a control
                                                       credential refused for good
    agent/loopwatch.py             LoopObserver        one event-loop lag measurement
    agent/transfers/gate.py        TransferObserver    a node's moving and queued transfers
                                                       changed; how long one waited its turn

Hooks are called on the event loop, synchronously, and must not raise or block.
"""

from __future__ import annotations

from typing import Final, Literal, Protocol

__all__ = [
    "NULL_OBSERVER",
    "CorestoreObserver",
    "Direction",
    "LoopObserver",
    "NullObserver",
    "PeerObserver",
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


class NullObserver:
    """Every hook, doing nothing: the default of every part."""

    def session_connected(self, *, reconnect: bool) -> None:
        """Nothing."""

    def session_lost(self, *, cause: str, permanent: bool) -> None:
        """Nothing."""

    def request_handled(self, *, method: str, code: str, seconds: float) -> None:
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

    def corestore_answer(self, *, route: str, outcome: str, seconds: float) -> None:
        """Nothing."""

    def corestore_resend(self, *, route: str) -> None:
        """Nothing."""

    def credential_rejected(self) -> None:
        """Nothing."""

    def corestore_unavailable(self, *, node: str, since: float | None) -> None:
        """Nothing."""

    def loop_lag(self, *, seconds: float) -> None:
        """Nothing."""

    def transfers_changed(self, *, node: str, moving: int, queued: int) -> None:
        """Nothing."""

    def transfer_waited(self, *, kind: str, seconds: float) -> None:
        """Nothing."""


NULL_OBSERVER: Final = NullObserver()
