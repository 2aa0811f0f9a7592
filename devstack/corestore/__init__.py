"""A reference Corestore control API: exactly the routes the agent relies on, bytes on disk.

    handle = await start(data_dir=tmp_path, bearer="token")   # 127.0.0.1, a free port
    client = CorestoreClient(handle.url, Secret("token"))
    handle.faults.fail_next(RouteName.PUT_CHUNK, status=503, times=2)
    handle.bearer.set(Secret("rotated"))   # from the next request on, only this one is accepted
    ...
    await handle.stop()

Standalone (for the demo and crash tests; the bearer is read from a file, never argv):

    python -m devstack.corestore --data-dir D --port P --bearer-file F [--discard]

prints one JSON line `{"url": "http://127.0.0.1:P"}` once it listens, and stops on SIGTERM or
SIGINT. What it checks and what it does not (it does not verify the grant's signature) is in
docs/corestore-api.md. Modules: `storage` (prepared restores, staging objects; `ledger` the
chunk rules it applies), `scratch`
(restored resources), `services` (service data, the node archive, database closures; its HTTP
handlers in `service_routes`), `server` (HTTP, auth, faults), `faults` (switchable faults).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from agent.secret import Secret
from devstack.corestore.faults import FaultRule, Faults
from devstack.corestore.scratch import Scratch
from devstack.corestore.server import Bearer, Jobs, create_app
from devstack.corestore.services import Services
from devstack.corestore.storage import Storage

__all__ = ["Bearer", "CorestoreHandle", "FaultRule", "Faults", "start"]


@dataclass(slots=True)
class CorestoreHandle:
    """A running reference Corestore."""

    url: str  # the canonical origin, e.g. http://127.0.0.1:41234
    data_dir: Path
    faults: Faults
    bearer: Bearer  # the accepted control credential; `bearer.set()` rotates it
    _runner: web.AppRunner

    @property
    def services(self) -> Services:
        """The service data, archive and closure imports on this Corestore's disk."""
        return Services(self.data_dir)

    async def stop(self) -> None:
        """Stop listening, cancel running restores, close open connections."""
        await self._runner.cleanup()

    async def __aenter__(self) -> CorestoreHandle:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()


async def start(
    *,
    data_dir: Path | str,
    bearer: str | Secret,
    host: str = "127.0.0.1",
    port: int = 0,
    faults: Faults | None = None,
    discard: bool = False,
) -> CorestoreHandle:
    """Start a reference Corestore on `host:port` (0: a free port) storing under `data_dir`
    (`discard`: staging chunks are verified and thrown away, for benchmarks)."""
    root = Path(data_dir)
    await asyncio.to_thread(root.mkdir, parents=True, exist_ok=True)
    faults = faults if faults is not None else Faults()
    storage = Storage(root, discard=discard)
    scratch = Scratch(storage)
    accepted = Bearer(bearer if isinstance(bearer, Secret) else Secret(bearer))
    app = create_app(storage, scratch, Jobs(scratch, faults), faults, accepted)
    # No access log: it is the one aiohttp logger that could be configured to print headers.
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=5.0)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except BaseException:
        await runner.cleanup()
        raise
    bound_port = runner.addresses[0][1]
    shown_host = f"[{host}]" if ":" in host else host
    return CorestoreHandle(f"http://{shown_host}:{bound_port}", root, faults, accepted, runner)
