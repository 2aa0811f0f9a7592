"""No grant ever reaches the state database."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent.errors import InvalidState
from agent.restore.machine import Op
from agent.restore.replay import request_digest
from agent.secret import Secret
from agent.store import RestoreKey, RevisionStore

KEY = RestoreKey("cluster-1", "node-1", "restore-1")
GRANT = "eyJhbGciOiJSUzI1NiJ9.GRANT-PAYLOAD-7f3c9e1b.SIGNATURE-2d4a8b6c"
VISIBLE = "scratch-namespace-5e9d"  # a value that must reach the file, so the search can fail


def _prepare_request() -> dict[str, Any]:
    return {
        "restoreGrant": GRANT,
        "clusterId": KEY.cluster_id,
        "targetNodeName": KEY.node_name,
        "restoreId": KEY.restore_id,
        "expectedRevision": 0,
        "scratchNamespaceId": VISIBLE,
        "archiveManifest": {"objects": []},
    }


def _database_bytes(directory: Path) -> bytes:
    return b"".join(path.read_bytes() for path in sorted(directory.iterdir()))


async def test_a_prepare_request_goes_through_the_store_without_its_grant(
    state_dir: Path,
) -> None:
    """Digest, state and private fields of a request are stored; its grant is not."""
    request = _prepare_request()
    body = {k: v for k, v in request.items() if k != "restoreGrant"}
    async with await RevisionStore.open(state_dir) as store:
        await store.mutate(
            KEY,
            expected_revision=0,
            op=Op.PREPARE,
            state={"scratchNamespaceId": VISIBLE},
            private={"request": body},
            request_digest=request_digest("coreflowPrepareIsolatedRestore", request),
        )
        on_disk = _database_bytes(state_dir)
    assert VISIBLE.encode() in on_disk
    assert GRANT.encode() not in on_disk
    assert b"GRANT-PAYLOAD" not in on_disk


async def test_a_state_carrying_a_grant_field_is_refused(store: RevisionStore) -> None:
    """A restoreGrant key at any depth is refused before anything is written."""
    with pytest.raises(InvalidState):
        await store.mutate(
            KEY, expected_revision=0, op=Op.PREPARE, state={"echo": {"restoreGrant": GRANT}}
        )
    assert await store.get(KEY) is None


async def test_private_fields_carrying_a_secret_are_refused(store: RevisionStore) -> None:
    """A Secret value is refused, not persisted as its mask."""
    with pytest.raises(InvalidState):
        await store.mutate(
            KEY, expected_revision=0, op=Op.PREPARE, state={}, private={"g": [Secret(GRANT)]}
        )
    assert await store.get(KEY) is None


async def test_a_refused_grant_leaves_no_trace_in_the_file(state_dir: Path) -> None:
    """Even a refused attempt writes none of the grant's bytes."""
    async with await RevisionStore.open(state_dir) as store:
        with pytest.raises(InvalidState):
            await store.mutate(
                KEY, expected_revision=0, op=Op.PREPARE, state={}, private=_prepare_request()
            )
        on_disk = _database_bytes(state_dir)
    assert GRANT.encode() not in on_disk
