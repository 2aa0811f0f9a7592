"""The sealed credential path end to end: the real agent (`agent.entry.app.run`, its websocket
session),
the stand-in Cloudly with its credential authority, two reference Corestores with their own
bearers. A fresh state directory enrolls, fetches each node's bearer sealed to its key, stages and
restores on both nodes; a rotated bearer is fetched again once; no secret leaks anywhere.
"""

from __future__ import annotations

import asyncio
import io
import logging
import stat
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import structlog
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from agent.config import Config, load_config
from agent.contracts.credentials import b64url
from agent.corestore.routes import RouteName
from agent.credentials.keys import ENROLLMENT_FILE, KEY_FILE
from agent.entry import app
from agent.entry.cli import main as cli_main
from agent.errors import CallFailed
from agent.secret import Secret
from agent.store import DB_NAME
from agent.watch.status import AgentStatus, SessionState, StatusSnapshot
from devstack.cloudly import StandInCloudly, cluster_document
from devstack.corestore import CorestoreHandle, start
from devstack.credentials import CredentialAuthority
from devstack.driver import (
    MappingSpec,
    ObjectSpec,
    RestoreDriver,
    RestorePlan,
    stand_in_settings,
)

KiB, MiB = 1024, 1024 * 1024
TOKEN = "e2e-sealed-machine-token-SENTINEL-5b0c"
CLUSTER, NODE_A, NODE_B = "cluster-sealed", "node-a", "node-b"
BEARER_A = "e2e-bearer-node-a-SENTINEL-19fe"
BEARER_B = "e2e-bearer-node-b-SENTINEL-c7d2"
ROTATED_A = "e2e-bearer-node-a-rotated-SENTINEL-48aa"
VOLUME = "snap-vol/volume.img"


class HookedCounter(Counter[RouteName]):
    """A reference Corestore's hit counter that runs `hooks[(route, n)]` when hit `n` is counted
    (before the request is authenticated, so the hook decides what that very request meets)."""

    def __init__(self) -> None:
        super().__init__()
        self.hooks: dict[tuple[RouteName, int], Callable[[], object]] = {}

    def __setitem__(self, key: RouteName, value: int) -> None:
        super().__setitem__(key, value)
        hook = self.hooks.pop((key, value), None)
        if hook is not None:
            hook()


@dataclass
class Sealed:
    """Two nodes' Corestores, a stand-in Cloudly sealing their bearers, the agent's config."""

    tmp: Path
    corestores: dict[str, CorestoreHandle]
    hits: dict[str, HookedCounter]
    authority: CredentialAuthority
    cloudly: StandInCloudly
    state_dir: Path
    drivers: list[RestoreDriver] = field(default_factory=list)

    def config(self) -> Config:
        """A production-shaped config: it names no credential source, so it is sealed."""
        token = self.tmp / "machine-token"
        token.write_text(TOKEN + "\n")
        token.chmod(0o600)
        path = self.tmp / "agent.toml"
        path.write_text(
            f'[cloudly]\nurl = "{self.cloudly.url}"\ntoken_file = "{token}"\n'
            "backoff_base_s = 0.05\nbackoff_cap_s = 0.2\n"
            "[corestore]\nchunk_size = 65536\nretries = 1\nrestore_poll_interval_s = 0.05\n"
            f'[state]\ndirectory = "{self.state_dir}"\n'
            "[shutdown]\ndrain_timeout_s = 2.0\nclose_timeout_s = 2.0\n"
            '[health]\nlisten = "127.0.0.1:0"\n'
        )
        return load_config(path)

    @asynccontextmanager
    async def agent(self, *, connected: bool = True) -> AsyncIterator[AgentStatus]:
        """The real agent in-process, connected (at once with `connected=False`); stopped in
        order on exit."""
        status, stop = AgentStatus(), asyncio.Event()
        async with asyncio.TaskGroup() as group:
            group.create_task(app.run(self.config(), stop=stop, status=status))
            try:
                if connected:
                    async with asyncio.timeout(15):
                        await status.wait_until(_is_connected)
                yield status
            finally:
                stop.set()

    def driver(self, node: str, **options: Any) -> RestoreDriver:
        """A restore on `node`: a database dump and a 1 MiB volume image."""
        objects = (
            ObjectSpec("snap-db/dump.bson", 100 * KiB + 7, f"dump {node}".encode()),
            ObjectSpec(VOLUME, MiB, f"volume {node}".encode()),
        )
        mappings = (
            MappingSpec("map-db", "database", "snap-db", "app", "mongodb"),
            MappingSpec("map-volume", "volume", "snap-vol", "uploads"),
        )
        plan = RestorePlan(CLUSTER, node, mappings, objects, restore_id=f"restore-{node}")
        driver = RestoreDriver(
            self.cloudly, plan, piece_size=64 * KiB, poll_interval=0.02, **options
        )
        self.drivers.append(driver)
        return driver

    def sealed(self, node: str) -> int:
        """How often Cloudly sealed `node`'s bearer."""
        return sum(
            1
            for event in self.cloudly.events
            if event.kind == "credential-sealed" and event.detail["node_id"] == node
        )

    def secrets(self) -> dict[str, str]:
        """Every secret of the run, by name: bearers, the private key (three spellings), each
        sealed text, the machine token, JWTs and grants."""
        private = (self.state_dir / KEY_FILE).read_bytes()
        named = {
            "bearer a": BEARER_A,
            "bearer b": BEARER_B,
            "rotated bearer a": ROTATED_A,
            "machine token": TOKEN,
            "private key hex": private.hex(),
            "private key base64url": b64url(private),
            "private key repr": repr(private)[2:-1],
        }
        named |= {f"sealed #{n}": text for n, text in enumerate(self.authority.sealed_texts)}
        named |= {f"jwt #{n}": jwt for n, jwt in enumerate(self.cloudly.issued_jwts)}
        for driver in self.drivers:
            named |= {f"grant {grant[-12:]}": grant for grant in driver.issued_grants}
        return named

    def leaked(self, data: str | bytes) -> list[str]:
        """The names of the secrets that occur in `data` (never their values)."""
        text = data.decode("latin-1") if isinstance(data, bytes) else data
        return sorted(name for name, value in self.secrets().items() if value in text)

    def database_bytes(self) -> bytes:
        """The state database and its -wal/-shm files, concatenated."""
        files = sorted(self.state_dir.glob(f"{DB_NAME}*"))
        assert files, "expected the agent's state database"
        return b"".join(path.read_bytes() for path in files)


def _is_connected(snapshot: StatusSnapshot) -> bool:
    return snapshot.state is SessionState.CONNECTED


@pytest.fixture
async def sealed(tmp_path: Path) -> AsyncIterator[Sealed]:
    """Two nodes with their own bearers; a stand-in Cloudly that seals them; a fresh state dir."""
    corestores: dict[str, CorestoreHandle] = {}
    hits: dict[str, HookedCounter] = {}
    for node, bearer in ((NODE_A, BEARER_A), (NODE_B, BEARER_B)):
        handle = await start(data_dir=tmp_path / f"corestore-{node}", bearer=bearer)
        hits[node] = handle.faults.hits = HookedCounter()
        corestores[node] = handle
    authority = CredentialAuthority(CLUSTER, {NODE_A: BEARER_A, NODE_B: BEARER_B})
    document = cluster_document(CLUSTER, {node: handle.url for node, handle in corestores.items()})
    cloudly = StandInCloudly(
        token=TOKEN, cluster=document, peer_settings=stand_in_settings(), credentials=authority
    )
    await cloudly.start()
    try:
        yield Sealed(tmp_path, corestores, hits, authority, cloudly, tmp_path / "state")
    finally:
        await cloudly.stop()
        for handle in corestores.values():
            await handle.stop()


async def _restore(driver: RestoreDriver, *, staged: bool = False) -> dict[str, Any]:
    """prepare (unless staged) -> stage all -> execute -> ready -> cleanup -> cleaned."""
    if not staged:
        assert (await driver.prepare())["status"] == "prepared"
    await driver.stage_all()
    await driver.execute()
    ready = await driver.wait_until({"ready", "failed"})
    assert ready["status"] == "ready", ready.get("lastErrorCode")
    await driver.cleanup()
    return await driver.wait_until({"cleaned", "cleanup-failed"})


async def test_nothing_is_served_before_the_enrollment_completed(sealed: Sealed) -> None:
    """Cloudly is slow to answer `completeSecretRecipientEnrollment`: meanwhile the agent's
    session is up but not connected, a status and a prepare are answered `not-ready`
    (retryable) and reach no Corestore. Once enrolled, the agent logs `cloudly_connected`, and
    from then on it serves."""
    sealed.authority.hold_completions()
    driver = sealed.driver(NODE_A, resend_not_ready=False)
    with structlog.testing.capture_logs() as logs:
        async with sealed.agent(connected=False) as status:
            await sealed.cloudly.wait_for("enrollment-completion-held")
            refused = [await _refused(driver.status()), await _refused(driver.prepare())]
            state_while_enrolling = status.snapshot().state
            hits_while_enrolling = sum(sealed.hits[NODE_A].values())
            sealed.authority.release_completions()
            async with asyncio.timeout(15):
                await status.wait_until(_is_connected)
            served = await driver.status()
            prepared = await driver.prepare()
    assert [(r["code"], r["retryable"]) for r in refused] == [("not-ready", True)] * 2
    assert (state_while_enrolling, hits_while_enrolling) == (SessionState.AUTHENTICATING, 0)
    assert (served, prepared["status"]) == (None, "prepared")
    events = [entry["event"] for entry in logs]
    first_refusal = events.index("request_refused")
    assert first_refusal < events.index("recipient_enrolled") < events.index("cloudly_connected")


async def _refused(call: Any) -> dict[str, Any]:
    with pytest.raises(CallFailed) as refused:
        await call
    return refused.value.error_data


async def test_a_fresh_agent_enrolls_and_restores_on_two_nodes_with_their_own_bearers(
    sealed: Sealed,
) -> None:
    """Fresh state directory: the key is made and enrolled on connect; each node's bearer is
    fetched when that node is first used, once; both restores reach `cleaned`."""
    async with sealed.agent():
        assert sealed.cloudly.count("recipient-enrolled") == 1
        assert (sealed.sealed(NODE_A), sealed.sealed(NODE_B)) == (0, 0)
        driver_a, driver_b = sealed.driver(NODE_A), sealed.driver(NODE_B)
        assert (await driver_a.prepare())["status"] == "prepared"
        assert (sealed.sealed(NODE_A), sealed.sealed(NODE_B)) == (1, 0)
        cleaned = await asyncio.gather(_restore(driver_a, staged=True), _restore(driver_b))
    assert [state["status"] for state in cleaned] == ["cleaned", "cleaned"]
    assert (sealed.sealed(NODE_A), sealed.sealed(NODE_B)) == (1, 1)
    key = sealed.state_dir / KEY_FILE
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert len(key.read_bytes()) == 32
    [recipient] = sealed.authority.recipients
    assert sealed.authority.recipient_key(recipient) == _public_of(sealed)


def _public_of(sealed: Sealed) -> bytes:
    private = X25519PrivateKey.from_private_bytes((sealed.state_dir / KEY_FILE).read_bytes())
    return private.public_key().public_bytes_raw()


async def test_a_rotated_bearer_is_fetched_again_once_and_the_stage_continues(
    sealed: Sealed,
) -> None:
    """Mid-stage, node A's Corestore and Cloudly rotate its bearer: Corestore answers 401, the
    agent fetches the new bearer once and the same stage finishes; node B is untouched."""
    async with sealed.agent():
        driver_a = sealed.driver(NODE_A)
        await driver_a.prepare()
        put_chunks = sealed.hits[NODE_A][RouteName.PUT_CHUNK]

        def rotate() -> None:
            sealed.corestores[NODE_A].bearer.set(Secret(ROTATED_A))
            sealed.authority.set_bearer(NODE_A, ROTATED_A)

        sealed.hits[NODE_A].hooks[(RouteName.PUT_CHUNK, put_chunks + 5)] = rotate
        staged = await driver_a.stage(VOLUME)
        assert staged["status"] == "staging"
        assert sealed.sealed(NODE_A) == 2
        assert sealed.corestores[NODE_A].bearer.rotations == 1
        cleaned = await _restore(driver_a, staged=True)
        await _restore(sealed.driver(NODE_B))
    assert cleaned["status"] == "cleaned"
    assert (sealed.sealed(NODE_A), sealed.sealed(NODE_B)) == (2, 1)


async def test_a_bearer_refused_after_the_refetch_is_a_named_error_and_recovers(
    sealed: Sealed,
) -> None:
    """Corestore rotates, Cloudly does not yet: the stage is refused `corestore-credential-
    rejected` after exactly one refetch, which brought back the refused bearer, so the call is
    not sent again; once Cloudly has the new bearer, the resend works."""
    async with sealed.agent():
        driver = sealed.driver(NODE_A)
        await driver.prepare()
        sealed.corestores[NODE_A].bearer.set(Secret(ROTATED_A))
        progress_reads = sealed.hits[NODE_A][RouteName.OBJECT_PROGRESS]
        with pytest.raises(CallFailed) as refused:
            await driver.stage(VOLUME)
        assert sealed.hits[NODE_A][RouteName.OBJECT_PROGRESS] - progress_reads == 1
        assert sealed.sealed(NODE_A) == 2
        sealed.authority.set_bearer(NODE_A, ROTATED_A)
        assert (await driver.stage(VOLUME))["status"] == "staging"
        assert sealed.sealed(NODE_A) == 3
    data = refused.value.error_data
    assert (data["code"], data["retryable"], data["httpStatus"]) == (
        "corestore-credential-rejected",
        True,
        401,
    )


async def test_material_bound_to_another_node_settles_the_prepare_as_failed(
    sealed: Sealed,
) -> None:
    """Cloudly answers node B's request with material bound to node A: it does not open, the
    prepare settles `failed` with `sealed-material-refused`, and Corestore B is never called."""
    sealed.authority.seal_for_node[NODE_B] = NODE_A
    async with sealed.agent():
        failed = await sealed.driver(NODE_B).prepare()
    assert (failed["status"], failed["lastErrorCode"]) == ("failed", "sealed-material-refused")
    assert sealed.hits[NODE_B][RouteName.PREPARE_RESTORE] == 0


async def test_a_restart_reuses_the_key_and_rotate_key_enrolls_a_new_one(
    sealed: Sealed, capsys: pytest.CaptureFixture[str]
) -> None:
    """The second start finds the key and the enrollment: no new enrollment. `rotate-key` is
    refused while the agent runs; after it, the next start enrolls the new key, and Cloudly
    retires the old recipient."""
    async with sealed.agent():
        first_key = (sealed.state_dir / KEY_FILE).read_bytes()
        first_record = (sealed.state_dir / ENROLLMENT_FILE).read_text()
        assert cli_main(["rotate-key", "--config", str(sealed.tmp / "agent.toml")]) == 75
        refused = capsys.readouterr().err
        assert "a restore-agent runs on this state directory: stop it first" in refused
    async with sealed.agent():
        assert (sealed.state_dir / KEY_FILE).read_bytes() == first_key
        assert (sealed.state_dir / ENROLLMENT_FILE).read_text() == first_record
    assert sealed.cloudly.count("recipient-enrolled") == 1
    assert cli_main(["rotate-key", "--config", str(sealed.tmp / "agent.toml")]) == 0
    assert "recipient key rotated: public key " in capsys.readouterr().out
    assert not (sealed.state_dir / ENROLLMENT_FILE).exists()
    async with sealed.agent():
        await _restore(sealed.driver(NODE_A))
    assert sealed.cloudly.count("recipient-enrolled") == 2
    assert (sealed.state_dir / KEY_FILE).read_bytes() != first_key
    [recipient] = sealed.authority.recipients
    assert sealed.authority.recipient_key(recipient) == _public_of(sealed)


async def test_no_key_material_or_bearer_reaches_logs_the_database_or_error_texts(
    sealed: Sealed, captured_logs: io.StringIO, caplog: pytest.LogCaptureFixture
) -> None:
    """Enrollment, fetches, a rotation, a refusal and a wrong binding, logged at debug: the
    private key, every sealed text and every bearer are absent from the JSON log, from the
    standard library's records, from SQLite (-wal and -shm included) and from every error text."""
    caplog.set_level(logging.DEBUG)
    errors: list[str] = []
    sealed.authority.seal_for_node[NODE_B] = NODE_A
    async with sealed.agent() as status:
        driver = sealed.driver(NODE_A)
        await driver.prepare()
        sealed.corestores[NODE_A].bearer.set(Secret(ROTATED_A))
        with pytest.raises(CallFailed) as refused:
            await driver.stage(VOLUME)
        errors += [str(refused.value), repr(refused.value.error_data)]
        sealed.authority.set_bearer(NODE_A, ROTATED_A)
        await _restore(driver, staged=True)
        failed = await sealed.driver(NODE_B).prepare()
        errors += [failed["lastErrorMessage"], str(status.snapshot().to_dict())]
        assert (sealed.state_dir / f"{DB_NAME}-wal").exists(), "expected a WAL to search"
        running_db = sealed.database_bytes()
    assert failed["lastErrorCode"] == "sealed-material-refused"
    # challenge, node A, its refetch (refused by Corestore), its refetch, node B: 5 seals
    assert len(sealed.authority.sealed_texts) == 10
    assert sealed.leaked(f"<{ROTATED_A}>") == ["rotated bearer a"], "the detector detects"
    logs = captured_logs.getvalue()
    assert '"event": "corestore_credential_fetched"' in logs
    assert sealed.leaked(logs) == []
    assert sealed.leaked("\n".join(record.getMessage() for record in caplog.records)) == []
    assert sealed.leaked(running_db + sealed.database_bytes()) == []
    assert sealed.leaked("\n".join(errors)) == []
