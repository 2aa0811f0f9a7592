"""Minimal valid node states and plans for the store tests (a helper module, not fixtures).

The store takes the frozen contract model, so its tests write real states: `node_state()` is
the smallest valid `IsolatedRestoreNodeState` for a key, `plan()` the smallest `PreparedPlan`.
"""

from __future__ import annotations

from typing import Any

from agent.contracts.backup import BackupArchiveManifest
from agent.contracts.isolatedrestore import (
    IsolatedRestoreNodeState,
    IsolatedRestoreVerification,
)
from agent.domain.restores import PreparedPlan, RestoreKey

__all__ = ["KEY", "node_state", "plan"]

KEY = RestoreKey("cluster-1", "node-1", "restore-1")


def node_state(key: RestoreKey = KEY, **changes: Any) -> IsolatedRestoreNodeState:
    """A state of `key` just prepared, with `changes` (model field names) applied."""
    state = IsolatedRestoreNodeState(
        restore_id=key.restore_id,
        cluster_id=key.cluster_id,
        target_node_name=key.node_name,
        source_backup_id="backup-1",
        source_service_id="service-1",
        scratch_namespace_id="scratch-1",
        staging_archive_id="staging-1",
        revision=0,
        status="preparing",
        completed_resource_mapping_ids=[],
        verification=IsolatedRestoreVerification(status="pending", results=[]),
        updated_at=0,
    )
    return state.model_copy(update=changes)


def plan(**manifest_extras: Any) -> PreparedPlan:
    """A plan with one mapping and an empty manifest carrying `manifest_extras`."""
    return PreparedPlan.from_wire(
        {
            "resourceMappings": [
                {
                    "id": "map-1",
                    "type": "volume",
                    "source": {"snapshotId": "snap-1", "volumeName": "v", "mountPath": "/data"},
                    "target": {"volumeName": "v2", "mountPath": "/data"},
                }
            ],
            "archiveManifest": BackupArchiveManifest.from_wire(
                {"objects": [], **manifest_extras}
            ).to_wire(),
        }
    )
