"""The record of a salvaged or reset state: `<state>/state-recovery.json`.

`restore-agent state salvage` and `state reset` (`salvage.py`) write it when they put a new
database in place; the agent reads it at every start (`agent/startup/reconcile.py`): while
`reconciledAt` is unset it reconciles with each node's Corestore (what Corestore holds that the
state does not know is taken into cleanup work), noting each node done (`reconciledNodes`), then
sets `reconciledAt`. The file stays afterwards: `restore_agent_state_recovered_timestamp_seconds`
says when the state was salvaged or reset, and the alert on it asks an operator to look.

    {"how": "salvaged" | "reset", "at": <epoch s>, "kept": "<the damaged file's name>",
     "counts": {"<table>": {"recovered": N, "kept": N, "dropped": N}},
     "reconciledNodes": ["node-1", ...], "reconciledAt": <epoch s> | null}

Written atomically (`agent.durable.write_atomically`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final, Literal

from agent.durable import write_atomically

__all__ = ["RECOVERY_FILE", "RecoveryRecord", "read_recovery", "write_recovery"]

RECOVERY_FILE: Final = "state-recovery.json"
_MAX_BYTES: Final = 1024 * 1024

How = Literal["salvaged", "reset"]


@dataclass(frozen=True, slots=True)
class RecoveryRecord:
    """How and when the state was recovered, and how far reconciliation got."""

    how: How
    at: float
    kept: str
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    reconciled_nodes: tuple[str, ...] = ()
    reconciled_at: float | None = None

    @property
    def pending(self) -> bool:
        """Whether reconciliation with the nodes' Corestore is still due."""
        return self.reconciled_at is None

    def with_node(self, node_id: str) -> RecoveryRecord:
        """`node_id` reconciled."""
        if node_id in self.reconciled_nodes:
            return self
        return replace(self, reconciled_nodes=(*self.reconciled_nodes, node_id))

    def done(self, at: float) -> RecoveryRecord:
        """Every node reconciled at `at`."""
        return replace(self, reconciled_at=at)

    def to_json(self) -> dict[str, Any]:
        """The file's JSON."""
        return {
            "how": self.how,
            "at": self.at,
            "kept": self.kept,
            "counts": self.counts,
            "reconciledNodes": list(self.reconciled_nodes),
            "reconciledAt": self.reconciled_at,
        }

    @classmethod
    def from_json(cls, data: Any) -> RecoveryRecord:
        """The record in `data`; `ValueError` when it is not one."""
        if not isinstance(data, dict) or data.get("how") not in ("salvaged", "reset"):
            raise ValueError("not a state recovery record")
        at, done = data.get("at"), data.get("reconciledAt")
        nodes = data.get("reconciledNodes", [])
        done_ok = done is None or isinstance(done, int | float)
        if not isinstance(at, int | float) or not isinstance(nodes, list) or not done_ok:
            raise ValueError("not a state recovery record")
        counts = data.get("counts", {})
        return cls(
            how=data["how"],
            at=float(at),
            kept=str(data.get("kept", "")),
            counts=counts if isinstance(counts, dict) else {},
            reconciled_nodes=tuple(str(node) for node in nodes),
            reconciled_at=None if done is None else float(done),
        )


def read_recovery(directory: Path) -> RecoveryRecord | None:
    """The record in `directory`, or None (none there; an unreadable one is none too: the
    state it would describe is in use already)."""
    path = directory / RECOVERY_FILE
    try:
        if path.stat().st_size > _MAX_BYTES:
            return None
        return RecoveryRecord.from_json(json.loads(path.read_bytes()))
    except (OSError, ValueError):
        return None


def write_recovery(directory: Path, record: RecoveryRecord) -> None:
    """Write `record` atomically; `OSError` when the disk refuses."""
    data = json.dumps(record.to_json(), sort_keys=True).encode() + b"\n"
    write_atomically(directory / RECOVERY_FILE, data)
