"""The stand-ins the unit's agent works against inside the machine: a reference Corestore and a
stand-in Cloudly (with its credential authority, so the agent gets its Corestore bearer sealed to
its own key, as in production), both on 127.0.0.1.

The machine shares the host's network, so both listen on ports the kernel picks (port 0); the
ports, the machine token and the bearer are saved (`stack.json`, mode 0600) so that after the
machine's reboot the stand-ins come back where the agent's configuration points.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devstack.cloudly import StandInCloudly, cluster_document
from devstack.corestore import CorestoreHandle, start
from devstack.credentials import CredentialAuthority
from devstack.driver import stand_in_settings

__all__ = ["CLUSTER", "NODE", "Stack"]

CLUSTER, NODE = "cluster-1", "node-1"  # what devstack.archive.demo_plan() restores into


@dataclass(slots=True)
class Stack:
    """A running stand-in Cloudly and reference Corestore."""

    workdir: Path
    token: str
    bearer: str
    corestore: CorestoreHandle
    cloudly: StandInCloudly

    @classmethod
    async def start(cls, workdir: Path, *, saved: bool = False) -> Stack:
        """Start both (on the ports `stack.json` names when `saved`)."""
        state: dict[str, Any] = {}
        if saved:
            state = json.loads((workdir / "stack.json").read_text())
        token = state.get("token") or f"mt-{secrets.token_urlsafe(24)}"
        bearer = state.get("bearer") or f"cs-{secrets.token_urlsafe(24)}"
        corestore = await start(
            data_dir=workdir / "corestore", bearer=bearer, port=state.get("corestore_port", 0)
        )
        # Base64 chunks: any form is accepted on receipt, and this one keeps the stages short.
        cloudly = StandInCloudly(
            token=token,
            cluster=cluster_document(CLUSTER, {NODE: corestore.url}),
            peer_settings=stand_in_settings("base64"),
            credentials=CredentialAuthority(CLUSTER, {NODE: bearer}),
            closures_dir=workdir / "closures",
            port=state.get("cloudly_port", 0),
        )
        try:
            await cloudly.start()
        except BaseException:
            await corestore.stop()
            raise
        stack = cls(workdir, token, bearer, corestore, cloudly)
        stack._save()
        return stack

    def _save(self) -> None:
        path = self.workdir / "stack.json"
        state = {
            "token": self.token,
            "bearer": self.bearer,
            "cloudly_port": self.cloudly.port,
            "corestore_port": int(self.corestore.url.rpartition(":")[2]),
        }
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            json.dump(state, handle)

    async def stop(self) -> None:
        """Stop both."""
        try:
            await self.cloudly.stop()
        finally:
            await self.corestore.stop()
