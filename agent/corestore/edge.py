"""`CorestoreEdge`: what every call of a node's Corestore goes through, whatever its route.

One node's endpoint, credential, observer and `HttpTransport`; a request is sent (the
credential asked before, refreshed once and sent once more when Corestore refuses it), told to
the observer when Corestore says its disk is full (or no longer), and its answer judged: parsed
into its model, a delete's outcome, or the error it means (`client.py` has the table). The
route methods build on it: `service_client.py`'s `ServiceRoutes`, then `client.py`'s
`CorestoreClient`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import TypeVar

from pydantic import BaseModel

from agent.clock import SYSTEM_CLOCK, Clock
from agent.corestore import routes
from agent.corestore.credentials import NodeCredential
from agent.corestore.models import (
    DeleteOutcome,
)
from agent.corestore.routes import AnswerKind, RouteRequest
from agent.corestore.sanitize import sanitize_code, sanitize_text
from agent.corestore.transport import CorestoreTimeouts, HttpTransport, Reply, check_credential
from agent.errors import (
    CorestoreCredentialRejected,
    CorestoreFull,
    CorestoreRefused,
    IntegrityError,
)
from agent.observe import NULL_OBSERVER, CorestoreObserver
from agent.retry import RetryPolicy
from agent.secret import Secret

__all__ = ["CorestoreEdge"]


_M = TypeVar("_M", bound=BaseModel)


class CorestoreEdge:
    """The sending and judging of one node's calls; `CorestoreClient` adds the routes."""

    def __init__(
        self,
        endpoint: str,
        credential: Secret | NodeCredential,
        *,
        timeouts: CorestoreTimeouts | None = None,
        retry: RetryPolicy | None = None,
        clock: Clock = SYSTEM_CLOCK,
        rng: Callable[[], float] = random.random,
        observer: CorestoreObserver = NULL_OBSERVER,
    ) -> None:
        """`credential` is the node's (a fixed `Secret` is checked at once); `retry` bounds the
        sends of one idempotent call while Corestore is unavailable (`agent.retry`'s default
        policy if None); its waits are `clock.sleep`s of a full-jitter delay drawn with `rng`
        (a U(0, 1) source). `observer` hears each HTTP attempt."""
        self._endpoint = endpoint
        self._clock = clock
        self._observer = observer
        if isinstance(credential, Secret):
            credential = NodeCredential.fixed(check_credential(credential))
        self._credential = credential
        # How logs and the observer name this node (its endpoint for a credential of no node).
        self._node = credential.node_id or endpoint
        self._full = False  # the last write answer said the disk is full
        self._transport = HttpTransport(
            endpoint,
            timeouts=timeouts or CorestoreTimeouts(),
            retry=retry or RetryPolicy(),
            clock=clock,
            rng=rng,
            observer=observer,
            node=self._node,
        )

    @property
    def endpoint(self) -> str:
        """The node's Corestore origin, as given."""
        return self._endpoint

    @property
    def unavailable_since(self) -> float | None:
        """Since when (epoch seconds) this node's Corestore gave no usable answer; None while
        it answers."""
        return self._transport.unavailable_since

    @property
    def credential(self) -> NodeCredential:
        """Where the bearer sent on every authenticated call comes from."""
        return self._credential

    async def close(self) -> None:
        """Close the HTTP session; later calls raise `ShuttingDown`."""
        await self._transport.close()

    # --- the edge -------------------------------------------------------------------------------
    # Frames that raise hold no revealed secret and no raw answer text as a local variable:
    # traceback renderers that show locals (structlog's default) would print them.

    async def _send(self, request: RouteRequest) -> tuple[Reply, Secret | None]:
        """`_exchange`, telling the observer when Corestore says its disk is full and when a
        write it took says it is no longer."""
        try:
            reply, credential = await self._exchange(request)
        except CorestoreFull:
            self._storage_full(full=True)
            raise
        if self._full and request.spec.method != "GET" and 200 <= reply.status < 300:
            self._storage_full(full=False)
        return reply, credential

    def _storage_full(self, *, full: bool) -> None:
        self._full = full
        self._observer.corestore_full(node=self._node, full=full)

    async def _exchange(self, request: RouteRequest) -> tuple[Reply, Secret | None]:
        """Send `request`; when Corestore refuses the credential, refresh it once and send once
        more. Returns the answer and the credential it was sent with."""
        if not request.spec.authenticated:
            return await self._transport.send(request, None), None
        credential = await self._credential.current()
        reply = await self._transport.send(request, credential)
        if not self._refuses_credential(request, reply):
            return reply, credential
        fresh = await self._credential.refresh(credential)
        refetched = fresh != credential
        if refetched:
            credential = fresh
            reply = await self._transport.send(request, credential)
            if not self._refuses_credential(request, reply):
                return reply, credential
        refused = self._refused(request, reply, credential)
        node = self._credential.node_id
        self._observer.credential_rejected()
        raise CorestoreCredentialRejected(
            f"Corestore at {self._endpoint} refused the control credential"
            + (f" of node {node}" if node else "")
            + f" on {request.spec.name} with {reply.status} {refused.data['corestoreCode']}, "
            + ("also after fetching it again" if refetched else "and there is no other to try"),
            **refused.data,
        )

    def _refuses_credential(self, request: RouteRequest, reply: Reply) -> bool:
        return routes.is_credential_refusal(request.spec, reply.status, reply.error_code())

    async def _ok(self, request: RouteRequest, model: type[_M]) -> _M:
        reply, credential = await self._send(request)
        return self._parsed(request, reply, credential, model)

    def _parsed(
        self, request: RouteRequest, reply: Reply, credential: Secret | None, model: type[_M]
    ) -> _M:
        if self._judge(request, reply, credential) is not AnswerKind.OK:
            raise self._refused(request, reply, credential)
        try:
            return routes.parse_answer(model, reply.body)
        except ValueError as exc:
            # Not chained: pydantic's text quotes the answer, which is foreign text.
            where = _first_error_location(exc)
            raise CorestoreRefused(
                f"Corestore answered {request.spec.name} with a body of another shape ({where})",
                httpStatus=reply.status,
            ) from None

    async def _ok_or_none(self, request: RouteRequest, model: type[_M]) -> _M | None:
        reply, credential = await self._send(request)
        if self._judge(request, reply, credential) is AnswerKind.GONE:
            return None
        return self._parsed(request, reply, credential, model)

    async def _delete(self, request: RouteRequest) -> DeleteOutcome:
        reply, credential = await self._send(request)
        kind = self._judge(request, reply, credential)
        if kind is AnswerKind.GONE:
            return DeleteOutcome.ALREADY_ABSENT
        if kind is not AnswerKind.OK:
            raise self._refused(request, reply, credential)
        return DeleteOutcome.DELETED

    def _judge(self, request: RouteRequest, reply: Reply, credential: Secret | None) -> AnswerKind:
        kind = reply.kind  # classified once, by the transport
        if kind is AnswerKind.INTEGRITY:
            refused = self._refused(request, reply, credential)
            raise IntegrityError(str(refused), **refused.data) from refused
        return kind

    def _refused(
        self, request: RouteRequest, reply: Reply, credential: Secret | None
    ) -> CorestoreRefused:
        error = reply.error
        code = sanitize_code(error[0] if error else None)
        secrets = [secret for secret in (credential, request.grant) if secret is not None]
        text = sanitize_text(error[1], secrets) if error else "no error body"
        return CorestoreRefused(
            f"Corestore refused {request.spec.name} with {reply.status} {code}: {text}",
            httpStatus=reply.status,
            corestoreCode=code,
        )


def _first_error_location(exc: ValueError) -> str:
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return "unreadable JSON"
    first = errors(include_url=False, include_input=False)[0]
    return ".".join(str(part) for part in first["loc"]) or "body"
