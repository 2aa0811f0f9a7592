"""A process killed mid-mutation leaves a database that opens, checks clean and is not torn."""

from __future__ import annotations

import asyncio
import sqlite3
import sys
from pathlib import Path

import pytest

from agent.domain.restores import RestoreKey
from agent.store import DB_NAME, RevisionStore
from tests.processes import agent_environ

KEY = RestoreKey("cluster-1", "node-1", "restore-1")
REPO = Path(__file__).resolve().parents[2]
ROUNDS = 3
MUTATIONS_BEFORE_KILL = 120

# The child drives KEY to staging and then stages forever, printing each revision only after
# mutate() returned, i.e. after the commit. Each state records the revision it was built on, so
# a torn write (new revision, old content or the reverse) is visible; the plan, written once
# with the new state, must read back whole.
CHILD = """
import asyncio, sys
from pathlib import Path
from agent.domain.restore_machine import Op
from agent.store import RevisionStore
from agent.domain.restores import RestoreKey
from tests.store.states import node_state, plan

async def main() -> None:
    store = await RevisionStore.open(Path(sys.argv[1]))
    key = RestoreKey("cluster-1", "node-1", "restore-1")
    current = await store.get(key)
    revision = 0 if current is None else current.revision
    if revision == 0:
        await store.mutate(
            key, expected_revision=0, op=Op.PREPARE, state=node_state(key), plan=plan(base=0))
        revision = (await store.mutate(
            key, expected_revision=1, op=Op.PREPARE_SUCCEEDED, state=node_state(key))).revision
    while True:
        state = node_state(
            key, completed_resource_mapping_ids=[f"base-{revision}"], last_error_message="x" * 4000)
        stored = await store.mutate(key, expected_revision=revision, op=Op.STAGE, state=state)
        revision = stored.revision
        print(revision, flush=True)

asyncio.run(main())
"""


async def _run_and_kill(script: Path, state_dir: Path, start: int) -> int:
    """Run the child for MUTATIONS_BEFORE_KILL commits, SIGKILL it, return the last reported."""
    env = agent_environ()
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        str(script),
        str(state_dir),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    assert child.stdout is not None
    assert child.stderr is not None
    last = start
    async with asyncio.timeout(60):
        while last < start + MUTATIONS_BEFORE_KILL:
            line = await child.stdout.readline()
            assert line, (await child.stderr.read()).decode()
            last = int(line)
        child.kill()
        rest, _ = await child.communicate()
    for line in rest.split():
        last = int(line)
    assert child.returncode == -9
    return last


@pytest.mark.slow
async def test_sigkill_during_mutations_leaves_the_last_commit_or_the_one_after(
    tmp_path: Path,
) -> None:
    """After SIGKILL the database passes integrity_check and holds revision last or last + 1."""
    script = tmp_path / "child.py"
    script.write_text(CHILD, encoding="utf-8")
    state_dir = tmp_path / "state"
    last = 0
    for _ in range(ROUNDS):
        last = await _run_and_kill(script, state_dir, last)
        raw = sqlite3.connect(state_dir / DB_NAME)
        try:
            assert raw.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        finally:
            raw.close()
        async with await RevisionStore.open(state_dir) as store:
            stored = await store.get(KEY)
            plan = await store.plan(KEY)
        assert stored is not None
        assert stored.revision in (last, last + 1)
        assert stored.state.completed_resource_mapping_ids == [f"base-{stored.revision - 1}"]
        assert plan.archive_manifest.model_extra == {"base": 0}
        last = stored.revision
