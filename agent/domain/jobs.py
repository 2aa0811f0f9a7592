"""A relay job's durable facts as values: its key and its stored row (pure).

`JobKey` is the exact key of one relay job: (cluster, node, kind, backupId, serviceId, run).
`run` is 0 for a backup (one backupId is one backup); a restore's runs are numbered 1, 2, ...
per service on its node, and the store numbers the next one when a restore starts (its key is
given with `run` 0). `StoredJob` is one row as the store returns it: its status (the job
machine's, `agent.domain.job_machine`), the digest of the request that made it, the
recorded outcome (`agent.domain.outcomes`), a restore run's plan, and whether its answer was
delivered.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TypeAlias

from agent.domain.job_machine import JOB_KINDS, JobKind, JobStatus
from agent.domain.outcomes import JobResult, RunPlan
from agent.errors import InvalidState

__all__ = ["JobKey", "JobScope", "StoredJob"]


JobScope: TypeAlias = "tuple[str, str, str, str, str]"
"""What one job at a time may hold (`JobKey.scope`)."""


@dataclass(frozen=True, slots=True)
class JobKey:
    """The exact key of one relay job."""

    cluster_id: str
    node_id: str
    kind: JobKind
    backup_id: str
    service_id: str
    run: int = 0
    """0 for a backup; a restore's run number (0 only for the key `start` numbers)."""

    def __post_init__(self) -> None:
        for name in ("cluster_id", "node_id", "backup_id", "service_id"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise InvalidState(f"JobKey.{name} must be a non-empty string")
        if self.kind not in JOB_KINDS:
            raise InvalidState(f"JobKey.kind must be one of {JOB_KINDS}")
        if type(self.run) is not int or self.run < 0 or (self.kind == "backup" and self.run):
            raise InvalidState("JobKey.run must be 0 for a backup, a whole number for a restore")

    @property
    def scope(self) -> JobScope:
        """What one job at a time may hold: a backup's exact key, a restore's service on its
        node (whichever backup it restores)."""
        backup = self.backup_id if self.kind == "backup" else ""
        return (self.cluster_id, self.node_id, self.kind, self.service_id, backup)

    def numbered(self, run: int) -> JobKey:
        """This key with run number `run`."""
        return replace(self, run=run)

    def as_params(self) -> dict[str, str | int]:
        """The key's fields by name (the store's SQL parameters)."""
        return {
            "cluster_id": self.cluster_id,
            "node_id": self.node_id,
            "kind": self.kind,
            "backup_id": self.backup_id,
            "service_id": self.service_id,
            "run": self.run,
        }


@dataclass(frozen=True, slots=True)
class StoredJob:
    """One relay job as persisted."""

    key: JobKey
    revision: int
    status: JobStatus
    request_digest: str
    result: JobResult | None
    """The recorded outcome (None while running)."""
    attempts: int
    created_at: int
    updated_at: int
    plan: RunPlan | None = None
    """A restore run's plan: its effects under their keys, its outcome once all applied."""
    delivered_at: int | None = None
    """When its answer was known delivered to Cloudly (the ping rule; None: not known)."""
