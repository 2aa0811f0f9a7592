"""No grant ever reaches the state database."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent.contracts.backup import BackupArchiveManifest
from agent.domain.replay import request_digest
from agent.domain.restore_machine import Op
from agent.domain.restores import PreparedPlan
from agent.errors import InvalidState
from agent.secret import Secret
from agent.store import RevisionStore
from tests.store.states import KEY, node_state, plan

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


def _plan_with_manifest(manifest: BackupArchiveManifest) -> PreparedPlan:
    """A plan whose manifest is `manifest` as given (extras and all, not re-validated)."""
    return plan().model_copy(update={"archive_manifest": manifest})


async def test_a_prepare_request_goes_through_the_store_without_its_grant(
    state_dir: Path,
) -> None:
    """Digest, state and plan of a request are stored; its grant is not."""
    request = _prepare_request()
    async with await RevisionStore.open(state_dir) as store:
        await store.mutate(
            KEY,
            expected_revision=0,
            op=Op.PREPARE,
            state=node_state(scratch_namespace_id=VISIBLE),
            plan=plan(),
            request_digest=request_digest("coreflowPrepareIsolatedRestore", request),
        )
        on_disk = _database_bytes(state_dir)
    assert VISIBLE.encode() in on_disk
    assert GRANT.encode() not in on_disk
    assert b"GRANT-PAYLOAD" not in on_disk


async def test_a_plan_carrying_a_grant_field_is_refused(store: RevisionStore) -> None:
    """A restoreGrant key in a pass-through document (the manifest's extras) is refused."""
    with pytest.raises(InvalidState, match="restore grant"):
        await store.mutate(
            KEY,
            expected_revision=0,
            op=Op.PREPARE,
            state=node_state(),
            plan=plan(echo={"restoreGrant": GRANT}),
        )
    assert await store.get(KEY) is None


async def test_a_plan_holding_a_secret_is_refused(store: RevisionStore) -> None:
    """A Secret value is refused, not persisted as its mask."""
    manifest = BackupArchiveManifest.model_validate({"objects": [], "g": [Secret(GRANT)]})
    with pytest.raises(InvalidState, match="secret"):
        await store.mutate(
            KEY,
            expected_revision=0,
            op=Op.PREPARE,
            state=node_state(),
            plan=_plan_with_manifest(manifest),
        )
    assert await store.get(KEY) is None


async def test_a_state_holding_a_secret_is_refused(prepared_store: RevisionStore) -> None:
    """A Secret smuggled into a state (model_copy does not validate) is refused; nothing moves."""
    before = await prepared_store.get(KEY)
    leaking = node_state().model_copy(update={"last_error_message": Secret(GRANT)})
    with pytest.raises(InvalidState, match="secret"):
        await prepared_store.mutate(KEY, expected_revision=2, op=Op.STAGE, state=leaking)
    assert await prepared_store.get(KEY) == before


async def test_a_refused_grant_leaves_no_trace_in_the_file(state_dir: Path) -> None:
    """Even a refused attempt writes none of the grant's bytes."""
    async with await RevisionStore.open(state_dir) as store:
        with pytest.raises(InvalidState):
            await store.mutate(
                KEY,
                expected_revision=0,
                op=Op.PREPARE,
                state=node_state(),
                plan=plan(request=_prepare_request()),
            )
        on_disk = _database_bytes(state_dir)
    assert GRANT.encode() not in on_disk
