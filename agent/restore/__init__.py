"""Isolated restore on a node: the pure core here, the async engine beside it.

- `machine`: the node-status transition table and `decide()` (pure).
- `replay`: request digests and the exact-replay rule for `expectedRevision` (pure).

The engine modules (staging, execute, cleanup) live next to these and use `agent.store` for
durable state; importing this package imports only the pure core.
"""

from agent.restore.machine import (
    IN_FLIGHT,
    NODE_STATUSES,
    TRANSITIONS,
    NodeStatus,
    Op,
    decide,
)
from agent.restore.replay import Verdict, check_expected_revision, request_digest

__all__ = [
    "IN_FLIGHT",
    "NODE_STATUSES",
    "TRANSITIONS",
    "NodeStatus",
    "Op",
    "Verdict",
    "check_expected_revision",
    "decide",
    "request_digest",
]
