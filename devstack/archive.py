"""What one isolated restore names: deterministic archive objects, mappings, the plan, grants.

    plan = demo_plan(big_size=64 * MiB)       # or RestorePlan(cluster, node, mappings, objects)
    spec = plan.object("snap-vol/volume.img")
    for piece in spec.pieces(256 * 1024): ...  # the object's bytes, never whole in memory

Archive objects are deterministic pseudo-random bytes that never sit in memory whole: block
`k` (1 MiB, the last one shorter) is `shake_256(seed + k as 8 big-endian bytes).digest(1 MiB)`,
so any object is reproducible from `(size, seed)` and streamed in pieces of any size. Its
sha256 is computed in one streaming pass (`compute_sha256`) before a manifest needs it.

Mappings follow the reference Corestore's snapshot layout (docs/corestore-api.md): a mapping's
snapshot is the manifest objects under `<source.snapshotId>/`. `fake_grant()` makes a fresh
compact-JWS-shaped grant, recognisable by `GRANT_MARK` so a test can search logs and databases
for it. Pure: no I/O. `devstack.driver` re-exports every name here.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final, Literal

__all__ = [
    "BLOCK_SIZE",
    "GRANT_MARK",
    "MappingSpec",
    "MiB",
    "ObjectSpec",
    "RestorePlan",
    "demo_plan",
    "fake_grant",
]

MiB: Final = 1024 * 1024
BLOCK_SIZE: Final = MiB


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


_GRANT_HEADER: Final = _b64url(b'{"alg":"RS256","typ":"JWT","kid":"stand-in"}')
GRANT_MARK: Final = "U1RBTkRJTkdSQU5U"  # base64url of "STANDINGRANT": in every fake grant


def fake_grant() -> str:
    """A fresh compact-JWS-shaped grant (unsigned; the reference Corestore checks only shape)."""
    nonce, signature = secrets.token_bytes(12), secrets.token_bytes(32)
    return f"{_GRANT_HEADER}.{GRANT_MARK}{_b64url(nonce)}.{_b64url(signature)}"


# --- what is restored --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ObjectSpec:
    """One archive object: `size` deterministic bytes from `seed` (or `sha256` given upfront)."""

    path: str
    size: int
    seed: bytes
    sha256: str | None = None

    def blocks(self) -> Iterator[bytes]:
        """The content in `BLOCK_SIZE` blocks (the last one shorter)."""
        for index, start in enumerate(range(0, self.size, BLOCK_SIZE)):
            length = min(BLOCK_SIZE, self.size - start)
            yield hashlib.shake_256(self.seed + index.to_bytes(8, "big")).digest(length)

    def pieces(self, piece_size: int, *, corrupt_at: int | None = None) -> Iterator[bytes]:
        """The content re-cut into `piece_size` pieces; `corrupt_at` flips that byte's low bit."""
        if piece_size < 1:
            raise ValueError("piece_size must be at least 1")
        pending, offset = bytearray(), 0
        for block in self.blocks():
            if corrupt_at is not None and offset <= corrupt_at < offset + len(block):
                mutable = bytearray(block)
                mutable[corrupt_at - offset] ^= 1
                block = bytes(mutable)
            offset += len(block)
            pending += block
            while len(pending) >= piece_size:
                yield bytes(pending[:piece_size])
                del pending[:piece_size]
        if pending:
            yield bytes(pending)

    def read(self) -> bytes:
        """The whole content (for small objects only)."""
        return b"".join(self.blocks())

    def compute_sha256(self) -> str:
        """sha256 of the content, computed in one streaming pass."""
        digest = hashlib.sha256()
        for block in self.blocks():
            digest.update(block)
        return digest.hexdigest()

    def entry(self) -> dict[str, Any]:
        """The manifest entry `{path, size, sha256}` (the digest must be known)."""
        if self.sha256 is None:
            raise ValueError(f"the sha256 of {self.path} is not computed yet")
        return {"path": self.path, "size": self.size, "sha256": self.sha256}


@dataclass(frozen=True, slots=True)
class MappingSpec:
    """One resource mapping: `type` restores the snapshot `snapshot_id` into `target`."""

    id: str
    type: Literal["database", "objectstorage", "volume"]
    snapshot_id: str
    name: str  # the database, bucket or volume name
    resource_name: str = "resource"

    def to_wire(self) -> dict[str, Any]:
        """The `TIsolatedRestoreResourceMapping` Cloudly sends."""
        if self.type == "database":
            source = {"resourceName": self.resource_name, "databaseName": self.name}
            target: dict[str, Any] = {
                "resourceName": f"{self.resource_name}-scratch",
                "databaseName": self.name,
            }
        elif self.type == "objectstorage":
            source = {"resourceName": self.resource_name, "bucketName": self.name}
            target = {"resourceName": f"{self.resource_name}-scratch", "bucketName": self.name}
        else:
            source = {"volumeName": self.name, "mountPath": f"/data/{self.name}"}
            target = {"volumeName": f"{self.name}-scratch", "mountPath": f"/data/{self.name}"}
        return {
            "id": self.id,
            "type": self.type,
            "source": {"snapshotId": self.snapshot_id, **source},
            "target": target,
        }


@dataclass(frozen=True, slots=True)
class RestorePlan:
    """Everything one isolated restore names: routing key, ids, mappings and objects."""

    cluster_id: str
    node: str
    mappings: tuple[MappingSpec, ...]
    objects: tuple[ObjectSpec, ...]
    restore_id: str = "restore-1"
    source_backup_id: str = "backup-1"
    source_service_id: str = "service-1"
    scratch_namespace_id: str = "scratch-ns-1"
    staging_archive_id: str = "staging-archive-1"

    def __post_init__(self) -> None:
        for mapping in self.mappings:
            prefix = mapping.snapshot_id + "/"
            if not any(spec.path.startswith(prefix) for spec in self.objects):
                raise ValueError(f"mapping {mapping.id}: no object under {prefix}")

    def object(self, path: str) -> ObjectSpec:
        """The object at `path`."""
        return next(spec for spec in self.objects if spec.path == path)


def demo_plan(
    cluster_id: str = "cluster-1", node: str = "node-1", *, big_size: int = 64 * MiB
) -> RestorePlan:
    """A database dump, a bucket of small files and one `big_size` volume image."""
    objects = [
        ObjectSpec("snap-db/dump.bson", 6 * MiB + 12_345, b"database dump"),
        ObjectSpec("snap-db/meta/indexes.json", 2_048, b"database indexes"),
        *(
            ObjectSpec(f"snap-os/media/photo-{n:02d}.jpg", 150_000 + 40_000 * n, b"photo %d" % n)
            for n in range(6)
        ),
        ObjectSpec("snap-vol/volume.img", big_size, b"volume image"),
    ]
    mappings = (
        MappingSpec("map-db", "database", "snap-db", "app", "mongodb"),
        MappingSpec("map-media", "objectstorage", "snap-os", "media", "s3"),
        MappingSpec("map-volume", "volume", "snap-vol", "uploads"),
    )
    return RestorePlan(cluster_id, node, mappings, tuple(objects))
