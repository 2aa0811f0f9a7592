"""Gentle to nodes: a per-node limit on concurrent transfers and an optional per-node byte rate.

A transfer is every byte path between Cloudly and one node's Corestore through the agent (an
isolated-restore stage, a database-closure export or import). `limits`: `NodeLimits`, who moves
and who waits (FIFO per node) and the token bucket of each node's rate, as data with `now`
passed in (pure); `gate`: `TransferGate`, its asyncio face, shared by the engine and the relay
(`slot()`, the paced `Transfer` streams, `view()` for the health endpoint); `budget`: the one
byte budget every transfer draws from (`ByteBudget`, a `Holding` per moving transfer).

The bytes in transit live here too: `chunking` (the one re-chunker and the one hashing policy of
staging and both closure directions), `progress` (when a transfer's progress line is due) and
`memory` (memory comes back once the byte budget is idle: the `Trimmer`).
"""

from agent.transfers.gate import Transfer, TransferGate
from agent.transfers.limits import NodeLimits, TransferKind, TransferView

__all__ = ["NodeLimits", "Transfer", "TransferGate", "TransferKind", "TransferView"]
