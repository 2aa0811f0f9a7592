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
`transport.py`; this module decides what the answers mean. Each client holds its node's
`NodeCredential` (`credentials.py`): it asks for the credential before every authenticated call
and refreshes it once when Corestore refuses it. The bearer credential and the restore grant
never reach a log line or an exception text, and no frame that raises holds them revealed or
Corestore's raw answer text as a local variable (see `transport.py`).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel

from agent.clock import SYSTEM_CLOCK, Clock
from agent.contracts.backup import ArchiveRetentionPolicy
from agent.contracts.relay import DatabaseClosureDescriptor, ReplicationOption
from agent.corestore import builders, routes, service_builders
from agent.corestore.credentials import CredentialSource, NodeCredential
from agent.corestore.models import (
    ChunkAccepted,
    DeleteOutcome,
    Health,
    ObjectCommitted,
    ObjectProgress,
    PreparedRestore,
    ResourceStatus,
    RestoreListing,
    VerificationAnswer,
)
from agent.corestore.routes import AnswerKind, RouteRequest, SupportsToWire
from agent.corestore.sanitize import sanitize_code, sanitize_text
from agent.corestore.service_models import (
    ArchiveListing,
    ArchivePruned,
    ClosureChunkAccepted,
    ClosureImportCommitted,
    ClosureImportListing,
    ClosureImportStatus,
    ServiceBackupRecord,
    ServiceRestored,
)
from agent.corestore.transport import CorestoreTimeouts, HttpTransport, Reply, check_credential
from agent.errors import (
    CorestoreCredentialRejected,
    CorestoreFull,
    CorestoreRefused,
    CorestoreUnavailable,
    IntegrityError,
    ShuttingDown,
)
from agent.observe import NULL_OBSERVER, CorestoreObserver
from agent.retry import RetryPolicy
from agent.secret import Secret

__all__ = ["CorestoreClient", "CorestoreClients", "CorestoreTimeouts"]

_M = TypeVar("_M", bound=BaseModel)


class CorestoreClient:
    """The Corestore control API of one node. Methods are safe to call concurrently."""

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

    def __repr__(self) -> str:
        return f"CorestoreClient({self._endpoint!r})"

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

    # --- the relay's service routes (bearer only) -------------------------------------------

    async def service_backup(
        self,
        service_id: str,
        backup_id: str,
        *,
        service: dict[str, Any],
        tags: dict[str, str] | None = None,
        replication: ReplicationOption | None = None,
    ) -> ServiceBackupRecord:
        """Back the service's resources up; the same body again answers the same record."""
        request = service_builders.build_service_backup(
            service_id, backup_id, service=service, tags=tags, replication=replication
        )
        return await self._ok(request, ServiceBackupRecord)

    async def backup_record(self, service_id: str, backup_id: str) -> ServiceBackupRecord:
        """Corestore's record of one backup of the service on this node."""
        return await self._ok(
            service_builders.build_backup_record(service_id, backup_id), ServiceBackupRecord
        )

    async def service_restore(
        self,
        service_id: str,
        restore_key: str,
        backup_id: str,
        snapshot_ids: list[str],
        *,
        clear: bool,
    ) -> ServiceRestored:
        """Restore exactly these snapshots of the backup from the node's archive, once for
        `restore_key`: the same key again answers the restore it made, restoring nothing."""
        request = service_builders.build_service_restore(
            service_id, restore_key, backup_id, snapshot_ids, clear=clear
        )
        return await self._ok(request, ServiceRestored)

    async def service_restore_status(
        self, service_id: str, restore_key: str
    ) -> ServiceRestored | None:
        """The restore applied under `restore_key`, or None when none was."""
        request = service_builders.build_service_restore_status(service_id, restore_key)
        return await self._ok_or_none(request, ServiceRestored)

    async def archive_list(self) -> ArchiveListing | None:
        """What the node's archive holds; None when the node has no archive."""
        return await self._ok_or_none(service_builders.build_archive_list(), ArchiveListing)

    async def archive_prune(
        self, retention: ArchiveRetentionPolicy, *, dry_run: bool
    ) -> ArchivePruned | None:
        """Prune the node's archive (`dry_run`: only say what would go); None: no archive."""
        request = service_builders.build_archive_prune(retention, dry_run=dry_run)
        return await self._ok_or_none(request, ArchivePruned)

    async def closure_descriptor(
        self, service_id: str, backup_id: str
    ) -> DatabaseClosureDescriptor:
        """The descriptor of the backup's database closure: `{size, sha256, receipt, ...}`."""
        request = service_builders.build_closure_descriptor(service_id, backup_id)
        return await self._ok(request, DatabaseClosureDescriptor)

    async def read_closure(
        self, service_id: str, backup_id: str, offset: int, length: int
    ) -> bytes:
        """At most `length` bytes of the closure from `offset` (Corestore's bytes as sent: the
        caller checks how many came and what they hash to)."""
        request = service_builders.build_closure_read(service_id, backup_id, offset, length)
        reply, credential = await self._send(request)
        if self._judge(request, reply, credential) is not AnswerKind.OK:
            raise self._refused(request, reply, credential)
        return reply.body

    async def open_closure_import(
        self,
        import_id: str,
        *,
        service_id: str,
        backup_id: str,
        descriptor: DatabaseClosureDescriptor,
    ) -> ClosureImportStatus:
        """Open an import for exactly the bytes `descriptor` names (Corestore checks the
        receipt); an identical replay answers the import as it stands."""
        request = service_builders.build_closure_import(
            import_id, service_id=service_id, backup_id=backup_id, descriptor=descriptor
        )
        return await self._ok(request, ClosureImportStatus)

    async def put_closure_chunk(
        self, import_id: str, offset: int, data: bytes | bytearray | memoryview, sha256: str
    ) -> ClosureChunkAccepted:
        """Write one verified chunk of an import; `IntegrityError` if Corestore acknowledges
        other bytes than these."""
        request = service_builders.build_closure_import_chunk(import_id, offset, data, sha256)
        answer = await self._ok(request, ClosureChunkAccepted)
        if (answer.offset, answer.length, answer.sha256) != (offset, len(data), sha256):
            raise IntegrityError(
                f"Corestore acknowledged other bytes than the closure chunk at offset {offset}"
            )
        return answer

    async def commit_closure_import(
        self, import_id: str, size: int, sha256: str
    ) -> ClosureImportCommitted:
        """Re-hash the import and replace the service's database with it; `IntegrityError`
        (the import is removed, the database unchanged) on a mismatch."""
        request = service_builders.build_closure_import_commit(import_id, size, sha256)
        answer = await self._ok(request, ClosureImportCommitted)
        if (answer.size, answer.sha256) != (size, sha256):
            raise IntegrityError("Corestore committed other bytes than the closure's")
        return answer

    async def closure_import_status(self, import_id: str) -> ClosureImportStatus | None:
        """The import as it stands (`open`, or `committed`: applied once, never again), or None
        when Corestore holds none under `import_id`."""
        request = service_builders.build_closure_import_status(import_id)
        return await self._ok_or_none(request, ClosureImportStatus)

    async def abort_closure_import(self, import_id: str) -> DeleteOutcome:
        """Drop an import (its bytes never touched the database)."""
        return await self._delete(service_builders.build_closure_import_abort(import_id))

    # --- reconciliation (bearer only): what the node holds, one page at a time ------------------

    async def list_restores(self, after: str | None = None) -> RestoreListing:
        """One page of the prepared restores the node holds, by restoreId after `after`."""
        return await self._ok(service_builders.build_restore_list(after), RestoreListing)

    async def list_closure_imports(self, after: str | None = None) -> ClosureImportListing:
        """One page of the closure imports the node holds, by importId after `after`."""
        return await self._ok(
            service_builders.build_closure_import_list(after), ClosureImportListing
        )

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
