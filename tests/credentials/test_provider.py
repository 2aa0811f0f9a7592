"""SealedCredentials: each node's bearer fetched lazily from Cloudly, opened under its binding,
held in memory only, fetched again once when refused, dropped when the node leaves."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
import structlog
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from agent.contracts.credentials import METHOD_GET_CREDENTIAL_MATERIAL, b64url
from agent.credentials.contest import RecipientWatch
from agent.credentials.enrollment import Enrollment
from agent.credentials.keys import ENROLLMENT_FILE, KeyStore
from agent.credentials.provider import SealedCredentials
from agent.errors import CredentialUnavailable, SealedMaterialRefused, SessionClosed
from agent.log import scrub_text
from agent.protocol.handlers import Route, Routes
from agent.secret import Secret
from tests.credentials._helpers import CLUSTER, cloudly_side, view_of

BEARERS = {"node-a": "bearer-a-SENTINEL-41c2", "node-b": "bearer-b-SENTINEL-9e07"}


def _wrapping(method: str, wrap: Any) -> Any:
    def edit(routes: Routes) -> Routes:
        return Routes(
            Route(r.method, r.request, wrap(r.handler)) if r.method == method else r for r in routes
        )

    return edit


async def test_a_nodes_credential_is_fetched_on_first_use_and_then_held(tmp_path: Path) -> None:
    """Nothing is fetched up front; the first ask enrolls and fetches; the second asks nothing."""
    async with cloudly_side(tmp_path, BEARERS) as cloudly:
        provider = cloudly.provider()
        assert (provider.held, cloudly.kinds()) == (frozenset(), [])
        first = await provider.credential("node-a")
        again = await provider.credential("node-a")
        assert cloudly.count("credential-sealed", node_id="node-a") == 1
        assert cloudly.count("recipient-enrolled") == 1
    assert first == again == Secret(BEARERS["node-a"])
    assert provider.held == frozenset({"node-a"})


async def test_two_nodes_get_their_own_bearers(tmp_path: Path) -> None:
    """Node A's and node B's materials open to their own, different bearers."""
    async with cloudly_side(tmp_path, BEARERS) as cloudly:
        provider = cloudly.provider()
        a, b = await provider.credential("node-a"), await provider.credential("node-b")
    assert (a.reveal(), b.reveal()) == (BEARERS["node-a"], BEARERS["node-b"])


async def test_concurrent_askers_cause_one_fetch(tmp_path: Path) -> None:
    """Ten tasks asking for the same node at once: one material request."""
    async with cloudly_side(tmp_path, BEARERS) as cloudly:
        provider = cloudly.provider()
        got = await asyncio.gather(*(provider.credential("node-a") for _ in range(10)))
        assert cloudly.count("credential-sealed") == 1
    assert {secret.reveal() for secret in got} == {BEARERS["node-a"]}


async def test_a_refused_bearer_is_fetched_again_once(tmp_path: Path) -> None:
    """invalidate(rejected) drops it; the next ask fetches the rotated one; invalidating a
    bearer that is no longer held drops nothing."""
    async with cloudly_side(tmp_path, BEARERS) as cloudly:
        provider = cloudly.provider()
        old = await provider.credential("node-a")
        cloudly.authority.set_bearer("node-a", "bearer-a-rotated-SENTINEL-77d0")
        provider.invalidate("node-a", old)
        new = await provider.credential("node-a")
        provider.invalidate("node-a", old)  # a late refusal of the old one
        assert await provider.credential("node-a") == new
        assert cloudly.count("credential-sealed", node_id="node-a") == 2
    assert new.reveal() == "bearer-a-rotated-SENTINEL-77d0"


async def test_an_unknown_recipient_is_enrolled_again_once(tmp_path: Path) -> None:
    """Cloudly forgot the recipient: the agent enrolls again (once) and asks again (once)."""
    async with cloudly_side(tmp_path, BEARERS) as cloudly:
        provider = cloudly.provider()
        await provider.credential("node-a")
        cloudly.authority.forget_recipients()
        bearer = await provider.credential("node-b")
        assert cloudly.count("recipient-enrolled") == 2
        assert cloudly.count("credential-refused", code="unknown-recipient") == 1
    assert bearer.reveal() == BEARERS["node-b"]


async def test_a_recipient_cloudly_keeps_forgetting_is_no_endless_loop(tmp_path: Path) -> None:
    """unknown-recipient again right after enrolling: CredentialUnavailable after two asks and
    two enrollments, nothing held."""

    def forgetful(handler: Any) -> Any:
        async def material(request: Any, ctx: Any) -> Any:
            authority.forget_recipients()
            return await handler(request, ctx)

        return material

    edit = _wrapping(METHOD_GET_CREDENTIAL_MATERIAL, forgetful)
    async with cloudly_side(tmp_path, BEARERS, edit=edit) as cloudly:
        authority = cloudly.authority
        provider = cloudly.provider()
        with pytest.raises(CredentialUnavailable) as caught:
            await provider.credential("node-a")
        assert cloudly.count("credential-refused") == 2
        assert cloudly.count("recipient-enrolled") == 2
    assert caught.value.data == {"cloudlyCode": "unknown-recipient"}
    assert str(caught.value).startswith("Cloudly refused node node-a's credential: recipient ")
    assert provider.held == frozenset()


async def test_material_bound_to_another_node_is_refused_and_nothing_held(
    tmp_path: Path,
) -> None:
    """Cloudly answers node A's ask with node B's material: it does not open; nothing held."""
    async with cloudly_side(tmp_path, BEARERS) as cloudly:
        cloudly.authority.seal_for_node["node-a"] = "node-b"
        provider = cloudly.provider()
        with pytest.raises(SealedMaterialRefused) as caught:
            await provider.credential("node-a")
    assert caught.value.code == "sealed-material-refused"
    assert provider.held == frozenset()


async def test_tampered_material_is_refused_and_nothing_held(tmp_path: Path) -> None:
    """One flipped ciphertext byte on the way: refused; nothing held; the next ask fetches."""
    tamper = {"on": True}

    def flip(handler: Any) -> Any:
        async def material(request: Any, ctx: Any) -> Any:
            answer = await handler(request, ctx)
            if not tamper["on"]:
                return answer
            raw = bytearray(answer.material.ciphertext_bytes())
            raw[0] ^= 1
            sealed = answer.material.model_copy(update={"ciphertext": b64url(bytes(raw))})
            return answer.model_copy(update={"material": sealed})

        return material

    async with cloudly_side(
        tmp_path, BEARERS, edit=_wrapping(METHOD_GET_CREDENTIAL_MATERIAL, flip)
    ) as cloudly:
        provider = cloudly.provider()
        with pytest.raises(SealedMaterialRefused):
            await provider.credential("node-a")
        assert provider.held == frozenset()
        tamper["on"] = False
        assert (await provider.credential("node-a")).reveal() == BEARERS["node-a"]


async def test_material_sealed_to_another_key_is_refused(tmp_path: Path) -> None:
    """Cloudly seals to a key that is not the agent's (a stale one): refused, nothing held."""
    async with cloudly_side(tmp_path, BEARERS) as cloudly:
        cloudly.authority.seal_to_key = X25519PrivateKey.generate().public_key().public_bytes_raw()
        provider = cloudly.provider()
        with pytest.raises(SealedMaterialRefused):
            await provider.credential("node-a")
    assert provider.held == frozenset()


async def test_a_node_that_left_the_cluster_loses_its_bearer(tmp_path: Path) -> None:
    """retain(view) drops the bearers of nodes the new view does not list; another cluster's
    view drops all."""
    async with cloudly_side(tmp_path, BEARERS) as cloudly:
        provider = cloudly.provider()
        await provider.credential("node-a")
        await provider.credential("node-b")
        with structlog.testing.capture_logs() as events:
            provider.retain(view_of(CLUSTER, "node-b"))
        assert provider.held == frozenset({"node-b"})
        provider.retain(view_of("cluster-2", "node-b"))
        assert provider.held == frozenset()
    assert [(e["event"], e["node_id"], e["reason"]) for e in events] == [
        ("corestore_credential_dropped", "node-a", "node left the cluster")
    ]


async def test_a_bearer_fetched_for_a_node_that_left_meanwhile_is_not_held(
    tmp_path: Path,
) -> None:
    """The node left while its material was on the way: the caller gets it, nothing is held."""

    def leave(handler: Any) -> Any:
        async def material(request: Any, ctx: Any) -> Any:
            cloudly.view = view_of(CLUSTER, "node-b")
            return await handler(request, ctx)

        return material

    async with cloudly_side(
        tmp_path, BEARERS, edit=_wrapping(METHOD_GET_CREDENTIAL_MATERIAL, leave)
    ) as cloudly:
        provider = cloudly.provider()
        assert (await provider.credential("node-a")).reveal() == BEARERS["node-a"]
        assert provider.held == frozenset()


async def test_without_a_cluster_document_nothing_is_asked(tmp_path: Path) -> None:
    """No cluster view yet: CredentialUnavailable (retryable), Cloudly not called."""
    async with cloudly_side(tmp_path, BEARERS) as cloudly:
        cloudly.view = None
        with pytest.raises(CredentialUnavailable, match="no cluster document") as caught:
            await cloudly.provider().credential("node-a")
        assert cloudly.kinds() == []
    assert caught.value.retryable


async def test_a_session_that_is_down_makes_the_credential_unavailable(tmp_path: Path) -> None:
    """Not connected: CredentialUnavailable chained from the session error."""

    class Down:
        async def call(
            self,
            method: str,
            request: Any,
            *,
            timeout: float,  # noqa: ASYNC109  # the Caller protocol's deadline
        ) -> dict[str, Any]:
            raise SessionClosed(None, "not connected to Cloudly")

    async with cloudly_side(tmp_path, BEARERS) as cloudly:
        await cloudly.enrollment.ensure(cloudly.peer, CLUSTER)
        provider = SealedCredentials(
            key=cloudly.keys.key,
            enrollment=cloudly.enrollment,
            caller=Down,
            cluster_view=lambda: cloudly.view,
        )
        with pytest.raises(CredentialUnavailable) as caught:
            await provider.credential("node-a")
    assert str(caught.value) == (
        "Cloudly could not be asked for node node-a's credential: "
        "session closed with code None: not connected to Cloudly"
    )
    assert isinstance(caught.value.__cause__, SessionClosed)


async def test_no_key_material_or_bearer_reaches_the_logs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Enrolling, fetching, refusing and dropping, logged at debug: neither the private key
    (raw, hex, base64url), the sealed material nor a bearer appears; the bearer is registered
    with the log redactor."""
    caplog.set_level(logging.DEBUG)
    sealed: list[str] = []

    def keep(handler: Any) -> Any:
        async def material(request: Any, ctx: Any) -> Any:
            answer = await handler(request, ctx)
            sealed.extend([answer.material.enc, answer.material.ciphertext])
            return answer

        return material

    edit = _wrapping(METHOD_GET_CREDENTIAL_MATERIAL, keep)
    with structlog.testing.capture_logs() as events:
        async with cloudly_side(tmp_path, BEARERS, edit=edit) as cloudly:
            provider = cloudly.provider()
            a = await provider.credential("node-a")
            provider.invalidate("node-a", a)
            await provider.credential("node-a")
            cloudly.authority.seal_for_node["node-b"] = "node-a"
            with pytest.raises(SealedMaterialRefused) as refused:
                await provider.credential("node-b")
            provider.retain(view_of(CLUSTER))
            private = cloudly.keys.key.private_key.private_bytes_raw()
    texts = [repr(event) for event in events] + [r.getMessage() for r in caplog.records]
    texts += [str(refused.value), repr(refused.value), repr(provider), repr(cloudly.keys.key)]
    texts.append((tmp_path / ENROLLMENT_FILE).read_text())
    canaries = [*BEARERS.values(), private.hex(), b64url(private), repr(private), *sealed]
    assert len(sealed) == 6
    assert [canary for canary in canaries if any(canary in text for text in texts)] == []
    assert scrub_text(f"x {BEARERS['node-a']} y") == "x ********** y"


class _Heard:
    """A fake RecipientObserver."""

    def __init__(self) -> None:
        self.retired = 0
        self.duplicate: list[str | None] = []

    def recipient_retired(self) -> None:
        self.retired += 1

    def duplicate_agent(self, *, text: str | None) -> None:
        self.duplicate.append(text)


async def test_a_check_finds_the_recipient_enrolled(tmp_path: Path) -> None:
    """check_recipient asks for one node's material with the current recipient: True."""
    heard = _Heard()
    async with cloudly_side(tmp_path, BEARERS) as cloudly:
        provider = cloudly.provider(watch=RecipientWatch(heard, clock=cloudly.clock))
        assert await provider.check_recipient() is True
        assert cloudly.count("credential-sealed", node_id="node-a") == 1
    assert heard.retired == 0


async def test_a_check_sees_a_recipient_another_agent_retired_and_enrolls_again(
    tmp_path: Path,
) -> None:
    """Another key enrolls for the cluster (a second agent with the token): the next check
    finds the recipient retired (False), tells the watch, and enrolls again."""
    heard = _Heard()
    async with cloudly_side(tmp_path / "a", BEARERS) as cloudly:
        provider = cloudly.provider(watch=RecipientWatch(heard, clock=cloudly.clock))
        assert await provider.check_recipient() is True
        other_keys = KeyStore.open(tmp_path / "b")
        try:
            other = Enrollment(other_keys, call_timeout=5.0, clock=cloudly.clock)
            first = await other.ensure(cloudly.peer, CLUSTER)
            assert await provider.check_recipient() is False
            assert await provider.check_recipient() is True
            await other.ensure(cloudly.peer, CLUSTER, replacing=first.recipient_id)
            assert await provider.check_recipient() is False
        finally:
            other_keys.close()
        assert cloudly.count("recipient-enrolled") == 5
    assert heard.retired == 2
    assert len(heard.duplicate) == 1
    assert heard.duplicate[0] is not None


async def test_a_check_holds_the_bearer_it_fetched(tmp_path: Path) -> None:
    """The check is a fetch: the node's bearer is held after it, and asking for it asks
    Cloudly nothing more."""
    async with cloudly_side(tmp_path, BEARERS) as cloudly:
        provider = cloudly.provider()
        assert await provider.check_recipient() is True
        assert provider.held == frozenset({"node-a"})
        assert await provider.credential("node-a") == Secret(BEARERS["node-a"])
        assert cloudly.count("credential-sealed") == 1


async def test_a_check_refreshes_the_held_bearer(tmp_path: Path) -> None:
    """A bearer Cloudly rotated since it was fetched is the one held after the next check."""
    async with cloudly_side(tmp_path, BEARERS) as cloudly:
        provider = cloudly.provider()
        await provider.credential("node-a")
        cloudly.authority.set_bearer("node-a", "bearer-a-rotated-SENTINEL-5b1e")
        assert await provider.check_recipient() is True
        assert await provider.credential("node-a") == Secret("bearer-a-rotated-SENTINEL-5b1e")
        assert cloudly.count("credential-sealed") == 2


async def test_an_asker_waiting_on_a_check_takes_the_bearer_it_fetched(tmp_path: Path) -> None:
    """The check fetches under the node's lock: an asker meanwhile causes no second fetch."""
    async with cloudly_side(tmp_path, BEARERS) as cloudly:
        provider = cloudly.provider()
        checked, bearer = await asyncio.gather(
            provider.check_recipient(), provider.credential("node-a")
        )
        assert cloudly.count("credential-sealed") == 1
    assert (checked, bearer) == (True, Secret(BEARERS["node-a"]))


async def test_a_check_that_met_a_retirement_holds_the_bearer_fetched_after_enrolling_again(
    tmp_path: Path,
) -> None:
    """False (a retirement), and the fetch went on as any fetch does: enrolled again, the
    bearer sealed to the new recipient is held."""
    async with cloudly_side(tmp_path / "a", BEARERS) as cloudly:
        provider = cloudly.provider(watch=RecipientWatch(_Heard(), clock=cloudly.clock))
        await provider.credential("node-a")
        other_keys = KeyStore.open(tmp_path / "b")
        try:
            await Enrollment(other_keys, call_timeout=5.0, clock=cloudly.clock).ensure(
                cloudly.peer, CLUSTER
            )
            assert await provider.check_recipient() is False
        finally:
            other_keys.close()
        assert provider.held == frozenset({"node-a"})
        assert cloudly.count("credential-sealed", node_id="node-a") == 2


async def test_a_check_answers_what_cloudly_said_not_whether_its_material_opened(
    tmp_path: Path,
) -> None:
    """Material sealed under another binding is refused and not held, but Cloudly sealed to
    the recipient: it is still enrolled (True)."""
    async with cloudly_side(tmp_path, BEARERS) as cloudly:
        cloudly.authority.seal_for_node["node-a"] = "node-b"
        provider = cloudly.provider()
        assert await provider.check_recipient() is True
        assert provider.held == frozenset()


async def test_a_checks_fetch_is_logged_at_debug(tmp_path: Path) -> None:
    """A check every few seconds is no journal line; a fetch for work is."""
    with structlog.testing.capture_logs() as events:
        async with cloudly_side(tmp_path, BEARERS) as cloudly:
            provider = cloudly.provider()
            await provider.check_recipient()
            await provider.credential("node-b")
    fetched = [e for e in events if e["event"] == "corestore_credential_fetched"]
    assert [(e["node_id"], e["log_level"]) for e in fetched] == [
        ("node-a", "debug"),
        ("node-b", "info"),
    ]


async def test_a_check_without_a_cluster_view_asks_nothing(tmp_path: Path) -> None:
    async with cloudly_side(tmp_path, BEARERS) as cloudly:
        cloudly.view = None
        assert await cloudly.provider().check_recipient() is None
        assert cloudly.kinds() == []
