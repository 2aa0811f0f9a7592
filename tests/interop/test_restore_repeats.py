"""Restores repeated by Cloudly's real stack: typedrequest 3.3.0 over Node's `ws`, against the
whole agent (its relay, job runner and state database) and the reference Corestore.

Cloudly's code sends its next request in the turn the previous answer resolves (the stand-in's
`fire-chain`: the next call goes out inside the previous one's `.then`). The agent writes each
answer with the ping that would confirm it right behind it; the splitting proxy between them
writes Node one frame at a time, so Cloudly's next request is on the wire before `ws` has even
read that ping. Both ways `ws` delivers events are tried (`allowSynchronousEvents` true: every
frame of a read at once; false: a turn of the event loop after each frame).

The closure is a real backup's: the agent backs the service up first (`backupClusterService`),
the stand-in keeps the closure it drained with the descriptor the agent sent, and serves those
bytes when the agent asks for them (`restoreServiceDatabaseClosure`, served as a newer Cloudly
would: typedrequest 3.3.0 cannot serve a stream in a response). So "the database equals the
backup" is the reference Corestore's file after a real import.

- A restore Cloudly sends after it read the last restore's answer is a new restore: it runs,
  every time (the service wrote new bytes in between, and they are replaced by the backup).
- A restore that failed is never answered from its record when Cloudly repeats it knowing the
  failure: it runs. Nor when its answer was lost: the repeat on the next connection runs it.
- A restore whose answer was lost (the connection cut before Cloudly read it, or the agent
  SIGKILLed right after writing it) is answered from the record when Cloudly repeats it on the
  next connection: the closure is imported once, and what the service wrote since is kept.

`INTEROP_RESTORE_ROUNDS` (default 20) sets the number of immediate re-restores; each test
prints how many of them ran. `INTEROP_LOST_ANSWER_TRIALS` (default 1) repeats each lost-answer
test that many times (`-k lost` with 30 is the figure docs quote).
"""

from __future__ import annotations

import hashlib
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from devstack.corestore import CorestoreHandle, start
from tests.interop.conftest import NODE_ID, NodeCloudly, Spawn, request_of
from tests.interop.relaystack import BEARER, RelayAgent, call
from tests.interop.splitproxy import SplittingProxy

pytestmark = pytest.mark.interop

SERVICE_ID, BACKUP_ID = "svc-app", "bk-1"
SERVICE = {"id": SERVICE_ID, "data": {"name": "app"}}
RESTORE = "restoreClusterService"
BACKED_UP = hashlib.shake_256(b"the database when it was backed up").digest(200 * 1024 + 17)
BACKED_UP_SHA = hashlib.sha256(BACKED_UP).hexdigest()
WRITTEN_SINCE = b"what the service wrote after the restore"
ROUNDS = int(os.environ.get("INTEROP_RESTORE_ROUNDS", "20"))
TRIALS = int(os.environ.get("INTEROP_LOST_ANSWER_TRIALS", "1"))
CHAIN_TIMEOUT_S = 30 + 5 * ROUNDS
WAIT_MS = 30000


@pytest.fixture
async def corestore(tmp_path: Path) -> AsyncIterator[CorestoreHandle]:
    handle = await start(data_dir=tmp_path / "corestore", bearer=BEARER)
    try:
        yield handle
    finally:
        await handle.stop()


@pytest.fixture
def synchronous_events() -> str:
    """`ws`'s `allowSynchronousEvents` in the stand-in (a test may parametrize it)."""
    return "true"


@pytest.fixture
async def relay_cloudly(
    spawn_cloudly: Spawn, corestore: CorestoreHandle, synchronous_events: str
) -> NodeCloudly:
    """The stand-in Cloudly: its node points at the reference Corestore; closures served."""
    return await spawn_cloudly(
        args=[
            "--corestore-endpoint",
            corestore.url,
            "--synchronous-events",
            synchronous_events,
            "--serve-closures",
        ]
    )


@pytest.fixture
async def proxy(relay_cloudly: NodeCloudly) -> AsyncIterator[SplittingProxy]:
    """Between the agent and the stand-in: the agent's frames go to Node one per write."""
    splitting = SplittingProxy(relay_cloudly.port)
    await splitting.start()
    try:
        yield splitting
    finally:
        await splitting.close()


@pytest.fixture
async def relay_agent(tmp_path: Path, proxy: SplittingProxy) -> AsyncIterator[RelayAgent]:
    """The whole agent's configuration, connecting through the proxy; processes reaped."""
    agent = RelayAgent(tmp_path / "agent", proxy.url)
    try:
        yield agent
    finally:
        await agent.reap()


def _database(corestore: CorestoreHandle) -> Path:
    path: Path = corestore.services.database_path(SERVICE_ID)
    return path


async def _backed_up(cloudly: NodeCloudly, corestore: CorestoreHandle) -> dict[str, Any]:
    """Back the service up through the agent; the restore request of its database."""
    corestore.services.write_database(SERVICE_ID, [BACKED_UP])
    backup = {"nodeId": NODE_ID, "backupId": BACKUP_ID, "service": SERVICE}
    reply = await call(cloudly, "backupClusterService", backup)
    assert reply["ok"], reply
    events = await cloudly.wait_for("streams", 1, timeoutMs=WAIT_MS)
    [held] = events["heldClosures"]
    assert (held["bytes"], held["sha256"]) == (len(BACKED_UP), BACKED_UP_SHA)
    snapshots = reply["response"]["snapshots"]
    assert [s["type"] for s in snapshots] == ["database"]
    return {**backup, "snapshots": snapshots, "resourceTypes": ["database"]}


def _served(events: dict[str, Any]) -> int:
    """Closure streams the stand-in served to their closing bit."""
    return sum(1 for s in events["closureServes"] if s["status"] == "served")


def _answer(result: dict[str, Any]) -> tuple[Any, Any, Any]:
    """A call's outcome as (ok, the error's code, the response): a failure reads by name."""
    return result.get("ok"), (result.get("errorData") or {}).get("code"), result.get("response")


def _fetched(events: dict[str, Any]) -> int:
    """`restoreServiceDatabaseClosure` calls the agent made."""
    return len(request_of(events, "restoreServiceDatabaseClosure"))


@pytest.mark.parametrize("synchronous_events", ["true", "false"], ids=["sync", "deferred"])
async def test_a_backup_restored_again_in_the_turn_its_restore_answered_is_restored_every_round(
    relay_cloudly: NodeCloudly,
    relay_agent: RelayAgent,
    corestore: CorestoreHandle,
    synchronous_events: str,
) -> None:
    """ROUNDS times: the service writes new bytes into its database, and in the same turn the
    last restore's answer resolved Cloudly restores the same backup again. Each restore fetches
    the closure once and leaves the database equal to the backup."""
    database = _database(corestore)
    async with relay_agent.running():
        restore = await _backed_up(relay_cloudly, corestore)
        first = {"method": RESTORE, "request": restore}
        rounds = [
            {
                "method": RESTORE,
                "request": restore,
                "write": {"path": str(database), "seed": f"written in round {n}", "bytes": 4096},
            }
            for n in range(1, ROUNDS + 1)
        ]
        reply = await relay_cloudly.command(
            "fire-chain",
            calls=[first, *rounds],
            observe=str(database),
            timeoutMs=WAIT_MS,
            timeout=CHAIN_TIMEOUT_S,
        )
        events = await relay_cloudly.events()
    results = reply["results"]
    ran = sum(1 for r in results[1:] if r.get("observed") == BACKED_UP_SHA)
    summary = (
        f"allowSynchronousEvents={synchronous_events}: {ran} of {ROUNDS} immediate "
        f"re-restores ran; {_fetched(events)} closure fetches, {_served(events)} served, "
        f"{corestore.services.applied_imports(SERVICE_ID)} imports for {ROUNDS + 1} restores"
    )
    print(f"restore rounds: {summary}")  # the before/after figure (pytest -s)
    assert len(results) == ROUNDS + 1, summary
    assert [_answer(r) for r in results] == [(True, None, {"restored": restore["snapshots"]})] * (
        ROUNDS + 1
    ), summary
    assert len({r["conn"] for r in results}) == 1, "every restore went on one live connection"
    assert [r["observed"] for r in results] == [BACKED_UP_SHA] * (ROUNDS + 1), summary
    assert (_fetched(events), _served(events)) == (ROUNDS + 1, ROUNDS + 1), summary
    assert corestore.services.applied_imports(SERVICE_ID) == ROUNDS + 1, summary
    assert database.read_bytes() == BACKED_UP


@pytest.mark.parametrize("synchronous_events", ["true", "false"], ids=["sync", "deferred"])
async def test_a_restore_that_failed_unserved_runs_when_repeated_at_once_with_the_closure_served(
    relay_cloudly: NodeCloudly, relay_agent: RelayAgent, corestore: CorestoreHandle
) -> None:
    """The closure cannot be served (3.3.0's own answer): the restore fails
    `stream-not-served`, nothing imported. Cloudly, now serving it, sends the identical request
    in the turn that failure resolved: it runs, fetches the closure and restores the backup."""
    database = _database(corestore)
    async with relay_agent.running():
        restore = await _backed_up(relay_cloudly, corestore)
        written = {"path": str(database), "seed": "written before the restore", "bytes": 4096}
        reply = await relay_cloudly.command(
            "fire-chain",
            calls=[
                {"method": RESTORE, "request": restore, "serveClosures": False, "write": written},
                {"method": RESTORE, "request": restore, "serveClosures": True},
            ],
            observe=str(database),
            timeoutMs=WAIT_MS,
            timeout=CHAIN_TIMEOUT_S,
        )
        events = await relay_cloudly.events()
    failed, repeated = reply["results"]
    assert _answer(failed) == (False, "stream-not-served", None)
    assert failed["observed"] == failed["wrote"], "the failed restore imported nothing"
    assert repeated["conn"] == failed["conn"]
    assert _answer(repeated) == (True, None, {"restored": restore["snapshots"]})
    assert repeated["observed"] == BACKED_UP_SHA
    assert (_fetched(events), _served(events)) == (2, 1)
    assert corestore.services.applied_imports(SERVICE_ID) == 1


@pytest.mark.parametrize("trial", range(TRIALS))
async def test_a_lost_restore_answer_is_answered_from_the_record_on_the_next_connection(
    relay_cloudly: NodeCloudly,
    relay_agent: RelayAgent,
    proxy: SplittingProxy,
    corestore: CorestoreHandle,
    trial: int,
) -> None:
    """The connection is cut right after the agent wrote its answer (Cloudly never read it, no
    pong confirmed it). The identical request on the next connection gets the recorded answer:
    the closure was fetched and imported once, and what the service wrote since is kept."""
    del trial
    async with relay_agent.running():
        restore = await _backed_up(relay_cloudly, corestore)
        cut = proxy.lose_next_answer(RESTORE)
        lost = await relay_cloudly.command("fire", method=RESTORE, request=restore)
        assert cut.done.is_set(), lost
        assert lost.get("exception") == "connection closed before the reply arrived", lost
        corestore.services.write_database(SERVICE_ID, [WRITTEN_SINCE])
        await relay_cloudly.wait_for("tags", 2, timeoutMs=WAIT_MS)  # connected again
        repeat = await call(relay_cloudly, RESTORE, restore)
        events = await relay_cloudly.events()
    _assert_answered_from_the_record(lost, repeat, restore, events, corestore)


async def test_a_failed_restore_whose_answer_was_lost_runs_when_repeated_on_the_next_connection(
    relay_cloudly: NodeCloudly,
    relay_agent: RelayAgent,
    proxy: SplittingProxy,
    corestore: CorestoreHandle,
) -> None:
    """The restore fails `stream-not-served` and that answer is lost with its connection. A
    failed run is never answered from its record: the identical request on the next connection
    (Cloudly now serving the closure) runs it again, and the database is the backup's."""
    async with relay_agent.running():
        restore = await _backed_up(relay_cloudly, corestore)
        corestore.services.write_database(SERVICE_ID, [WRITTEN_SINCE])
        await relay_cloudly.command("serve-closures", on=False)
        cut = proxy.lose_next_answer(RESTORE)
        lost = await relay_cloudly.command("fire", method=RESTORE, request=restore)
        assert cut.done.is_set(), lost
        assert lost.get("exception") == "connection closed before the reply arrived", lost
        assert _database(corestore).read_bytes() == WRITTEN_SINCE, "the failed run imported"
        await relay_cloudly.command("serve-closures", on=True)
        await relay_cloudly.wait_for("tags", 2, timeoutMs=WAIT_MS)
        repeat = await call(relay_cloudly, RESTORE, restore)
        events = await relay_cloudly.events()
    assert repeat["conn"] != lost["conn"]
    assert _answer(repeat) == (True, None, {"restored": restore["snapshots"]})
    assert (_fetched(events), _served(events)) == (2, 1)
    assert corestore.services.applied_imports(SERVICE_ID) == 1
    assert _database(corestore).read_bytes() == BACKED_UP


@pytest.mark.slow
@pytest.mark.parametrize("trial", range(TRIALS))
async def test_a_restore_answer_lost_to_a_kill_9_is_answered_from_the_record_after_restart(
    relay_cloudly: NodeCloudly,
    relay_agent: RelayAgent,
    proxy: SplittingProxy,
    corestore: CorestoreHandle,
    trial: int,
) -> None:
    """The agent process is SIGKILLed the moment its answer was written (never read by Cloudly)
    and started again on its state directory. The identical request gets the recorded answer:
    the closure was fetched and imported once, and what the service wrote since is kept."""
    del trial
    first = await relay_agent.spawn()
    await relay_cloudly.wait_for("tags", 1, timeoutMs=WAIT_MS)
    restore = await _backed_up(relay_cloudly, corestore)
    cut = proxy.lose_next_answer(RESTORE, then=first.kill)
    lost = await relay_cloudly.command("fire", method=RESTORE, request=restore)
    assert cut.done.is_set(), lost
    assert await first.process.wait() == -signal.SIGKILL
    assert lost.get("exception") == "connection closed before the reply arrived", lost
    corestore.services.write_database(SERVICE_ID, [WRITTEN_SINCE])
    second = await relay_agent.spawn()
    await relay_cloudly.wait_for("tags", 2, timeoutMs=WAIT_MS)
    repeat = await call(relay_cloudly, RESTORE, restore)
    events = await relay_cloudly.events()
    assert await second.stop() == 0
    _assert_answered_from_the_record(lost, repeat, restore, events, corestore)


def _assert_answered_from_the_record(
    lost: dict[str, Any],
    repeat: dict[str, Any],
    restore: dict[str, Any],
    events: dict[str, Any],
    corestore: CorestoreHandle,
) -> None:
    assert repeat["conn"] != lost["conn"], "the repeat came on the next connection"
    assert _answer(repeat) == (True, None, {"restored": restore["snapshots"]})
    assert (_fetched(events), _served(events)) == (1, 1), "the closure was fetched once"
    assert corestore.services.applied_imports(SERVICE_ID) == 1, "imported once"
    assert _database(corestore).read_bytes() == WRITTEN_SINCE, "nothing imported over it"
