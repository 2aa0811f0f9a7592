"""The node's Corestore control API, as the isolated restore relies on it (docs/corestore-api.md).

- `shapes`   scalar rules: ids, object paths, sha256, grant shape, the 16 MiB chunk cap (pure)
- `models`   request bodies and answers as frozen pydantic models (pure)
- `routes`   THE place that knows paths, headers and what each status means (pure)
- `builders`, `service_builders` the requests of each route, built from `routes` (pure)
- `sanitize` Corestore's error text made safe for an exception message (pure)
- `transport` the HTTP edge: one aiohttp session, timeouts, resends of idempotent routes only
             (by `agent.retry`'s policy, waiting on an `agent.clock.Clock`)
- `client`   `CorestoreClient` (typed calls, answers mapped to errors) and `CorestoreClients`
             (one client per node endpoint)
- `edge`, `service_client` what `CorestoreClient` builds on: every call's sending and
             judging, and the relay's service routes
- `credentials` the per-node credential seam (`CredentialSource`, `NodeCredential`): each
             client asks its node's bearer before every call and refreshes it once on a 401

Typical use by the engine:

    client = clients.client_for(node.node_id, node.corestore_endpoint)
    await client.prepare_restore(restore_id, scratch_namespace_id=..., staging_archive_id=...,
                                 resource_mappings=[...], archive_manifest=..., grant=grant)
    progress = await client.object_progress(archive_id, entry.path, grant)
    ...put_chunk(archive_id, entry.path, offset, data, sha256_of(data), grant) from
       progress.verified_bytes on, then commit_object(archive_id, path, size, sha256, grant)
    status = await client.wait_resource_restored(restore_id, mapping.id, grant, ...)
    verification = await client.verify_resource(restore_id, mapping.id, grant)
    await client.delete_resource(...); await client.delete_staging_archive(...)  # cleanup
"""

from agent.corestore.client import CorestoreClient, CorestoreClients, CorestoreTimeouts
from agent.corestore.models import (
    CheckAnswer,
    ChunkAccepted,
    DeleteOutcome,
    Health,
    ObjectCommitted,
    ObjectProgress,
    PreparedRestore,
    ResourceStatus,
    VerificationAnswer,
)
from agent.corestore.shapes import MAX_CHUNK_SIZE

__all__ = [
    "MAX_CHUNK_SIZE",
    "CheckAnswer",
    "ChunkAccepted",
    "CorestoreClient",
    "CorestoreClients",
    "CorestoreTimeouts",
    "DeleteOutcome",
    "Health",
    "ObjectCommitted",
    "ObjectProgress",
    "PreparedRestore",
    "ResourceStatus",
    "VerificationAnswer",
]
