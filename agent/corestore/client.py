"""`CorestoreClient`: the agent's only HTTP caller of a node's Corestore control API.

One `aiohttp.ClientSession` per client (one client per node endpoint; `CorestoreClients` keeps
them). Every call: built from `routes.py`'s table (`builders.py`, `service_builders.py`),
bounded by a connect timeout and a per-attempt total timeout, retried with backoff only when
its route is idempotent, and mapped at this edge:

    507, or a 5xx with `storage-full`           -> CorestoreFull (its disk is full; not resent;
                                                   the observer hears `corestore_full`)
    connection error, timeout, 5xx, 408, 429   -> CorestoreUnavailable (retryable)
    422 chunk/object-digest-mismatch, or an
        acknowledgement of other bytes          -> IntegrityError (resend)
    401, or 403 without a grant code            -> the credential is refreshed once and the
                                                   call sent once more with a fresher one;
                                                   refused again, or none fresher ->
                                                   CorestoreCredentialRejected
    any other 4xx                               -> CorestoreRefused (Corestore's text sanitised)
    404 with Corestore's not-found code on a
        delete                                  -> DeleteOutcome.ALREADY_ABSENT (cleaned)

The HTTP edge (session, timeouts, the resends of `agent.retry`, transport errors) is
`transport.py`; `edge.py` decides what the answers mean, `service_client.py` holds the relay's
routes and this module the isolated restore's. Each client holds its node's
`NodeCredential` (`credentials.py`): it asks for the credential before every authenticated call
and refreshes it once when Corestore refuses it. The bearer credential and the restore grant
never reach a log line or an exception text, and no frame that raises holds them revealed or
Corestore's raw answer text as a local variable (see `transport.py`).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from agent.clock import SYSTEM_CLOCK, Clock
from agent.corestore import builders
from agent.corestore.credentials import CredentialSource, NodeCredential
from agent.corestore.models import (
    ChunkAccepted,
    DeleteOutcome,
    Health,
    ObjectCommitted,
    ObjectProgress,
    PreparedRestore,
    ResourceStatus,
    VerificationAnswer,
)
from agent.corestore.routes import SupportsToWire
from agent.corestore.service_client import ServiceRoutes
from agent.corestore.transport import CorestoreTimeouts
from agent.errors import (
    CorestoreUnavailable,
    IntegrityError,
    ShuttingDown,
)
from agent.observe import NULL_OBSERVER, CorestoreObserver
from agent.retry import RetryPolicy
from agent.secret import Secret

__all__ = ["CorestoreClient", "CorestoreClients", "CorestoreTimeouts"]


class CorestoreClient(ServiceRoutes):
    """The Corestore control API of one node. Methods are safe to call concurrently."""

    def __repr__(self) -> str:
        return f"CorestoreClient({self._endpoint!r})"

    async def __aenter__(self) -> CorestoreClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # --- the routes -----------------------------------------------------------------------------

    async def health(self) -> Health:
        """`GET /health` (unauthenticated)."""
        return await self._ok(builders.build_health(), Health)

    async def prepare_restore(
        self,
        restore_id: str,
        *,
        scratch_namespace_id: str,
        staging_archive_id: str,
        resource_mappings: list[dict[str, Any] | SupportsToWire],
        archive_manifest: dict[str, Any] | SupportsToWire,
        grant: Secret,
    ) -> PreparedRestore:
        """Create the scratch namespace and staging archive; an identical replay answers the same
        (`created=False`), a different body for the same `restore_id` is refused (409)."""
        request = builders.build_prepare_restore(
            restore_id,
            scratch_namespace_id=scratch_namespace_id,
            staging_archive_id=staging_archive_id,
            resource_mappings=list(resource_mappings),
            archive_manifest=archive_manifest,
            grant=grant,
        )
        return await self._ok(request, PreparedRestore)

    async def put_chunk(
        self,
        staging_archive_id: str,
        path: str,
        offset: int,
        data: bytes | bytearray | memoryview,
        sha256: str,
        grant: Secret,
    ) -> ChunkAccepted:
        """Write one chunk (1 byte to 16 MiB) at `offset`; `sha256` is the chunk's digest.

        Idempotent: resending a counted chunk is answered as before. Raises `IntegrityError`
        when Corestore's digest of what it received differs (nothing is counted then)."""
        request = builders.build_put_chunk(staging_archive_id, path, offset, data, sha256, grant)
        accepted = await self._ok(request, ChunkAccepted)
        if (accepted.path, accepted.offset, accepted.length, accepted.sha256) != (
            path,
            offset,
            len(data),
            sha256,
        ):
            raise IntegrityError(f"Corestore acknowledged another chunk than {path} at {offset}")
        return accepted

    async def object_progress(
        self, staging_archive_id: str, path: str, grant: Secret
    ) -> ObjectProgress:
        """What Corestore verified of one object; resume staging at `verified_bytes`."""
        request = builders.build_object_progress(staging_archive_id, path, grant)
        return await self._ok(request, ObjectProgress)

    async def commit_object(
        self, staging_archive_id: str, path: str, size: int, sha256: str, grant: Secret
    ) -> ObjectCommitted:
        """Have Corestore re-hash the whole object and count it as written.

        Raises `IntegrityError` on a mismatch (Corestore has removed the partial object).
        NOT retried: after `CorestoreUnavailable`, ask `object_progress` — `committed` means
        done, `partial` with every byte means commit again, `absent` means stage again."""
        request = builders.build_commit_object(staging_archive_id, path, size, sha256, grant)
        committed = await self._ok(request, ObjectCommitted)
        if (committed.path, committed.size, committed.sha256) != (path, size, sha256):
            raise IntegrityError(f"Corestore committed {path} with another size or sha256")
        return committed

    async def delete_object(
        self, staging_archive_id: str, path: str, grant: Secret
    ) -> DeleteOutcome:
        """Remove one (partial or committed) staging object."""
        return await self._delete(builders.build_delete_object(staging_archive_id, path, grant))

    async def delete_staging_archive(self, staging_archive_id: str, grant: Secret) -> DeleteOutcome:
        """Remove the whole staging archive."""
        return await self._delete(builders.build_delete_staging_archive(staging_archive_id, grant))

    async def restore_resource(
        self, restore_id: str, mapping_id: str, grant: Secret
    ) -> ResourceStatus:
        """Start restoring one mapping into the scratch namespace (or learn it already ran).

        Asynchronous on Corestore: the answer is `running` (202) or `succeeded` (200); follow up
        with `resource_restore_status` or use `wait_resource_restored`. Idempotent: a running
        or finished restore is not started twice; a `failed` one is started again."""
        request = builders.build_restore_resource(restore_id, mapping_id, grant)
        return await self._ok(request, ResourceStatus)

    async def resource_restore_status(
        self, restore_id: str, mapping_id: str, grant: Secret
    ) -> ResourceStatus:
        """Where the restore of one mapping stands: absent, running, succeeded or failed."""
        request = builders.build_resource_status(restore_id, mapping_id, grant)
        return await self._ok(request, ResourceStatus)

    async def wait_resource_restored(
        self,
        restore_id: str,
        mapping_id: str,
        grant: Secret,
        *,
        poll_interval: float = 1.0,
        max_wait: float = 3600.0,
    ) -> ResourceStatus:
        """`restore_resource`, then poll every `poll_interval` s until it is no longer `running`;
        returns the final status (`succeeded` or `failed`, the caller decides).
        `CorestoreUnavailable` after `max_wait` seconds. Both are seconds of the client's
        `Clock`: the waits and their bound run in the same time."""
        try:
            async with self._clock.timeout(max_wait):
                status = await self.restore_resource(restore_id, mapping_id, grant)
                while status.state == "running":
                    await self._clock.sleep(poll_interval)
                    status = await self.resource_restore_status(restore_id, mapping_id, grant)
        except TimeoutError as exc:
            raise CorestoreUnavailable(
                f"Corestore at {self._endpoint} did not finish restoring resource mapping "
                f"{mapping_id} within {max_wait:g} s"
            ) from exc
        return status

    async def verify_resource(
        self, restore_id: str, mapping_id: str, grant: Secret
    ) -> VerificationAnswer:
        """Run Corestore's checks on one restored resource (`IIsolatedRestoreVerificationCheck`)."""
        request = builders.build_verify_resource(restore_id, mapping_id, grant)
        return await self._ok(request, VerificationAnswer)

    async def delete_resource(
        self, restore_id: str, mapping_id: str, grant: Secret
    ) -> DeleteOutcome:
        """Remove one restored scratch resource (a running restore of it is stopped first)."""
        return await self._delete(builders.build_delete_resource(restore_id, mapping_id, grant))

    async def delete_restore(self, restore_id: str, grant: Secret) -> DeleteOutcome:
        """Forget the prepared restore: the last step of a cleanup, once its scratch resources
        and its staging archive are gone (Corestore refuses it before: 409 `restore-not-empty`).
        """
        return await self._delete(builders.build_delete_restore(restore_id, grant))


class CorestoreClients:
    """One `CorestoreClient` per node and endpoint, each with that node's credential from
    `credentials`; the engine (and the relay) ask here, the app closes it."""

    def __init__(
        self,
        *,
        credentials: CredentialSource,
        timeouts: CorestoreTimeouts | None = None,
        retry: RetryPolicy | None = None,
        clock: Clock = SYSTEM_CLOCK,
        rng: Callable[[], float] = random.random,
        observer: CorestoreObserver = NULL_OBSERVER,
    ) -> None:
        self._credentials = credentials
        self._timeouts = timeouts
        self._retry = retry
        self._clock = clock
        self._rng = rng
        self._observer = observer
        self._clients: dict[tuple[str, str], CorestoreClient] = {}
        self._closed = False

    def __len__(self) -> int:
        return len(self._clients)

    def client_for(self, node_id: str, endpoint: str) -> CorestoreClient:
        """The client of node `node_id`, whose Corestore answers at `endpoint` (a validated
        origin). The same node and endpoint always get the same client; it sends the node's
        credential, asked from the source before every call (a node that moved gets a new
        client)."""
        if self._closed:
            raise ShuttingDown("the Corestore clients are closed")
        client = self._clients.get((node_id, endpoint))
        if client is None:
            client = CorestoreClient(
                endpoint,
                NodeCredential(self._credentials, node_id),
                timeouts=self._timeouts,
                retry=self._retry,
                clock=self._clock,
                rng=self._rng,
                observer=self._observer,
            )
            self._clients[(node_id, endpoint)] = client
        return client

    async def discard(self, node_id: str, endpoint: str) -> None:
        """Close and forget the client of `node_id` at `endpoint` (it left or moved)."""
        client = self._clients.pop((node_id, endpoint), None)
        if client is not None:
            await client.close()

    async def close(self) -> None:
        """Close every client; `client_for` raises `ShuttingDown` afterwards."""
        self._closed = True
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.close()
