"""The demo's second part: a service backup whose database closure goes to the stand-in
Cloudly, and its restore into a fresh database, byte-identical, with progress.

As Cloudly would, it calls `backupClusterService` (the agent has the reference Corestore back
the service up and streams the database closure to the stand-in), drops the service's database
(a fresh node), calls `restoreClusterService` (the agent fetches the closure from the stand-in
and imports it), and checks that the database holds exactly the original bytes (sha256).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from typing import Any, Final

from devstack.cloudly import StandInCloudly
from devstack.corestore import CorestoreHandle
from devstack.corestore.storage import sha256_file

__all__ = ["SERVICE_ID", "backup_and_restore"]

SERVICE_ID: Final = "svc-demo"
Emit = Callable[..., None]
_MiB: Final = 1024 * 1024


class RelayDemoFailed(Exception):
    """The backup/restore part of the demo could not finish."""


def _pieces(size: int) -> Any:
    for offset in range(0, size, 8 * _MiB):
        yield hashlib.shake_256(b"demo database %d" % offset).digest(min(8 * _MiB, size - offset))


class _Progress:
    """One line per second (and one at the end) while closure bytes move."""

    def __init__(self, emit: Emit) -> None:
        self._emit, self._shown = emit, 0.0
        self._started: dict[str, tuple[float, int]] = {}

    def __call__(self, direction: str, done: int, total: int) -> None:
        now = time.monotonic()
        started, first = self._started.setdefault(direction, (now, done))
        if done < total and now - self._shown < 1.0:
            return
        self._shown = now
        # A rate over a few milliseconds (a window filled at once) says nothing: leave it out.
        elapsed = now - started
        rate = f" ({(done - first) / elapsed / 1e6:.1f} MB/s)" if elapsed >= 0.2 else ""
        self._emit(
            "closure-progress",
            f"  closure    {direction:<8} {done / _MiB:8.1f} of {total / _MiB:.1f} MiB{rate}",
            direction=direction,
            bytes=done,
            total=total,
        )


async def backup_and_restore(
    cloudly: StandInCloudly,
    corestore: CorestoreHandle,
    node: str,
    size: int,
    emit: Emit,
    *,
    backup_id: str = "backup-demo",
) -> dict[str, Any]:
    """Back the demo service up and restore it; what was moved and checked (a fresh
    `backup_id` each time: the agent answers a repeated one from its job record)."""
    services = corestore.services
    services.write_database(SERVICE_ID, _pieces(size))
    services.write_file(SERVICE_ID, "objectstorage", "media/logo.png", b"demo bucket object")
    expected = sha256_file(services.database_path(SERVICE_ID))
    service = {"id": SERVICE_ID, "data": {"name": "demo service"}}
    emit(
        "service",
        f"service {SERVICE_ID}: a {size / _MiB:.1f} MiB database and a bucket",
        service_id=SERVICE_ID,
        bytes=size,
    )
    cloudly.closure_progress = _Progress(emit)
    started = time.monotonic()
    backup = await cloudly.call_agent(
        "backupClusterService",
        {"nodeId": node, "backupId": backup_id, "service": service},
        timeout=600,
    )
    held = cloudly.closures.get((backup_id, SERVICE_ID))
    if held is None or (held.size, held.sha256) != expected:
        raise RelayDemoFailed("the stand-in Cloudly does not hold the exact database closure")
    types = [snapshot["type"] for snapshot in backup["snapshots"]]
    emit(
        "backed-up",
        f"  backup     -> {', '.join(types)} in {time.monotonic() - started:.1f} s;"
        f" Cloudly holds the closure (sha256 {held.sha256[:12]}...)",
        snapshots=types,
        sha256=held.sha256,
    )
    services.database_path(SERVICE_ID).unlink()
    emit("fresh", "  database   dropped: the restore starts from a fresh database")
    started = time.monotonic()
    restored = await cloudly.call_agent(
        "restoreClusterService",
        {
            "nodeId": node,
            "backupId": backup_id,
            "service": service,
            "snapshots": backup["snapshots"],
        },
        timeout=600,
    )
    if sha256_file(services.database_path(SERVICE_ID)) != expected:
        raise RelayDemoFailed("the restored database differs from the backed-up one")
    emit(
        "restored",
        f"  restore    -> {', '.join(s['type'] for s in restored['restored'])} in"
        f" {time.monotonic() - started:.1f} s; the database is byte-identical (sha256)",
        restored=[s["type"] for s in restored["restored"]],
        sha256=expected[1],
    )
    cloudly.closure_progress = None
    return {"closure_bytes": size, "closure_sha256": expected[1]}
