"""`SealedCredentials`: each node's Corestore bearer, fetched from Cloudly sealed to our key.

The agent's default `CredentialSource` (`agent.corestore.credentials`):

- `credential(node_id)`: the bearer held for the node, else fetched: the current enrollment
  (`Enrollment.ensure`), `getCorestoreControlCredentialMaterial {nodeId, recipientId}`, opened
  with HPKE under the binding of the session's cluster, that node and that recipient
  (`binding.credential_info`). One fetch per node at a time; concurrent askers wait for it.
- `invalidate(node_id, rejected)`: Corestore refused `rejected`; it is dropped if it is still
  the one held, so the next `credential()` fetches again (the client asks once per call).
- `retain(view)`: a node that left the cluster document loses its bearer at once.

Cloudly answering `unknown-recipient` makes the agent enroll again (once) and ask again (once);
a second `unknown-recipient` is `CredentialUnavailable`. Each such answer is a retirement of the
agent's recipient, told to the `RecipientWatch` (agent/credentials/contest.py: another agent
with the same token retires it again and again); `check_recipient()`, run periodically while
connected, fetches one node's credential so a retirement is seen even when no work asks: a
fetch like `credential()`'s, under the node's lock, whose bearer is held (its request is not
wasted: it refreshes that node's bearer).
Material that does not open, or opens to no usable bearer, is `SealedMaterialRefused`; nothing
is held then. The bearer lives in memory only, as a `Secret` registered with the log redactor;
it is never written anywhere.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import structlog

from agent.contracts.cluster import ClusterView
from agent.contracts.credentials import (
    METHOD_GET_CREDENTIAL_MATERIAL,
    UNKNOWN_RECIPIENT,
    GetCredentialMaterialRequest,
    GetCredentialMaterialResponse,
)
from agent.corestore.sanitize import sanitize_code
from agent.credentials.binding import credential_info, open_credential
from agent.credentials.contest import RecipientWatch
from agent.credentials.enrollment import Enrollment, read_answer
from agent.credentials.keys import EnrollmentRecord, RecipientKey
from agent.errors import (
    CallFailed,
    CredentialError,
    CredentialUnavailable,
    EnrollmentFailed,
    SessionError,
)
from agent.log import register_secret, scrub_text
from agent.protocol.handlers import Caller
from agent.secret import Secret

__all__ = ["SealedCredentials"]

_log = structlog.get_logger("agent.credentials.provider")

_METHOD: Final = METHOD_GET_CREDENTIAL_MATERIAL


@dataclass(slots=True)
class _Fetch:
    """What one fetch met, which the periodic check answers by."""

    checking: bool = False
    """The periodic check's fetch (`check_recipient`)."""
    retired: bool = False
    """Cloudly said it does not know the agent's recipient (whatever came after)."""
    answered: bool = False
    """Cloudly sealed material to the agent's current recipient."""


class SealedCredentials:
    """Per-node Corestore credentials from Cloudly (a `CredentialSource`)."""

    def __init__(
        self,
        *,
        key: RecipientKey,
        enrollment: Enrollment,
        caller: Callable[[], Caller],
        cluster_view: Callable[[], ClusterView | None],
        call_timeout: float = 30.0,
        watch: RecipientWatch | None = None,
    ) -> None:
        """`caller()` is the session to ask (read when a credential is fetched);
        `cluster_view()` the session's current cluster view; `watch` hears of each retirement
        of the agent's recipient and each periodic check that found it enrolled."""
        self._key = key
        self._enrollment = enrollment
        self._caller = caller
        self._cluster_view = cluster_view
        self._call_timeout = call_timeout
        self._watch = watch
        self._held: dict[str, Secret] = {}
        self._held_for: str | None = None  # the cluster the held bearers are bound to
        self._fetching: dict[str, asyncio.Lock] = {}

    def __repr__(self) -> str:
        return f"SealedCredentials(nodes held={sorted(self._held)})"

    @property
    def held(self) -> frozenset[str]:
        """The nodes whose credential is held now."""
        return frozenset(self._held)

    async def credential(self, node_id: str) -> Secret:
        """The bearer for `node_id`'s Corestore (fetched from Cloudly if none is held)."""
        held = self._held.get(node_id)
        if held is not None:
            return held
        async with self._lock(node_id):
            held = self._held.get(node_id)
            if held is not None:
                return held
            return await self._fetch_and_hold(node_id, _Fetch())

    def _lock(self, node_id: str) -> asyncio.Lock:
        """One fetch per node at a time: the askers (and the check) that wait take its bearer."""
        return self._fetching.setdefault(node_id, asyncio.Lock())

    async def _fetch_and_hold(self, node_id: str, met: _Fetch) -> Secret:
        """A bearer fetched for `node_id` (under its lock), held in place of any held one."""
        cluster_id, bearer = await self._fetch(node_id, met)
        view = self._cluster_view()
        # Held only while the node is still in the cluster the material was bound to.
        if view is not None and view.cluster_id == cluster_id and node_id in view.nodes:
            if self._held_for != cluster_id:
                self._held.clear()
                self._held_for = cluster_id
            self._held[node_id] = bearer
        return bearer

    def invalidate(self, node_id: str, rejected: Secret) -> None:
        """Drop the held bearer of `node_id` if it is `rejected` (another task may have fetched
        a fresh one already: that one stays)."""
        if self._held.get(node_id) == rejected:
            del self._held[node_id]
            _log.info("corestore_credential_refused", node_id=node_id, action="fetch again")

    def retain(self, view: ClusterView) -> None:
        """Forget the bearers of nodes `view` does not list (all of them if `view` is another
        cluster's): called with every cluster view the session publishes."""
        other_cluster = view.cluster_id != self._held_for
        for node_id in list(self._held):
            if other_cluster or node_id not in view.nodes:
                del self._held[node_id]
                reason = "cluster changed" if other_cluster else "node left the cluster"
                _log.info("corestore_credential_dropped", node_id=node_id, reason=reason)
        for node_id, lock in list(self._fetching.items()):
            if node_id not in view.nodes and not lock.locked():
                del self._fetching[node_id]

    async def _fetch(self, node_id: str, met: _Fetch) -> tuple[str, Secret]:
        view = self._cluster_view()
        if view is None:
            raise CredentialUnavailable(
                f"no cluster document is loaded yet to fetch node {node_id}'s credential"
            )
        cluster_id = view.cluster_id
        record = await self._enrolled(cluster_id)
        try:
            reply = await self._ask(node_id, record)
        except CallFailed as exc:
            if exc.error_data.get("code") != UNKNOWN_RECIPIENT:
                raise self._unavailable(node_id, exc) from exc
            _log.warning(
                "recipient_unknown_to_cloudly", recipient_id=record.recipient_id, node_id=node_id
            )
            met.retired = True
            if self._watch is not None:
                self._watch.retired(record.recipient_id)
            record = await self._enrolled(cluster_id, replacing=record.recipient_id)
            try:
                reply = await self._ask(node_id, record)
            except CallFailed as again:
                raise self._unavailable(node_id, again) from again
        met.answered = True
        try:
            answer = read_answer(_METHOD, reply, GetCredentialMaterialResponse)
        except ValueError as exc:
            raise CredentialUnavailable(str(exc)) from None
        info = credential_info(cluster_id, node_id, record.recipient_id)
        bearer = open_credential(answer.material, self._key.private_key, info)
        register_secret(bearer)
        # A periodic check's fetch is routine: not a line in the journal every few seconds.
        (_log.debug if met.checking else _log.info)(
            "corestore_credential_fetched",
            node_id=node_id,
            recipient_id=record.recipient_id,
            aead_id=answer.material.aead_id,
        )
        return cluster_id, bearer

    async def check_recipient(self) -> bool | None:
        """Whether Cloudly still seals to the agent's recipient: a fetch of the credential of
        the cluster view's first node, under that node's lock, whose bearer is held as any
        fetch's is (the check refreshes it; askers waiting on the lock take it). False when
        Cloudly said it retired the recipient (the fetch enrolled again), True when it sealed
        to it, None when it could not be asked (no view, no node, not enrolled, no answer,
        another refusal)."""
        view = self._cluster_view()
        if view is None or not view.nodes:
            return None
        node_id = min(view.nodes)
        met = _Fetch(checking=True)
        async with self._lock(node_id):
            # What Cloudly said is the answer, not whether its material opened.
            with contextlib.suppress(CredentialError):
                await self._fetch_and_hold(node_id, met)
        if met.retired:
            return False
        if not met.answered:
            return None
        if self._watch is not None:
            self._watch.confirmed()
        return True

    async def _enrolled(self, cluster_id: str, *, replacing: str | None = None) -> EnrollmentRecord:
        try:
            return await self._enrollment.ensure(self._caller(), cluster_id, replacing=replacing)
        except (EnrollmentFailed, SessionError) as exc:
            raise CredentialUnavailable(
                f"the agent's recipient is not enrolled with Cloudly: {exc}"
            ) from exc

    async def _ask(self, node_id: str, record: EnrollmentRecord) -> dict[str, Any]:
        body = GetCredentialMaterialRequest(node_id=node_id, recipient_id=record.recipient_id)
        try:
            return await self._caller().call(_METHOD, body.to_wire(), timeout=self._call_timeout)
        except CallFailed:
            raise
        except SessionError as exc:  # not connected, no answer in time
            raise CredentialUnavailable(
                f"Cloudly could not be asked for node {node_id}'s credential: {exc}"
            ) from exc

    def _unavailable(self, node_id: str, exc: CallFailed) -> CredentialUnavailable:
        code = exc.error_data.get("code")
        return CredentialUnavailable(
            f"Cloudly refused node {node_id}'s credential: {scrub_text(exc.text)}",
            cloudlyCode=sanitize_code(code if isinstance(code, str) else None),
        )
