"""`RestoreDriver`: Cloudly's side of one isolated restore, driven through a `StandInCloudly`.

    plan = demo_plan(big_size=64 * MiB)             # or RestorePlan(...) with your own objects
    driver = RestoreDriver(cloudly, plan, on_progress=print)
    await driver.prepare()                          # answered `preparing`; returns once the
                                                    # agent settled it (`prepared` or `failed`)
    for spec in plan.objects:                       # each call returns the node state dict
        await driver.stage(spec)                    # a real VirtualStream Cloudly -> agent
    await driver.execute()
    await driver.wait_until({"ready", "failed"})
    await driver.cleanup()
    await driver.wait_until({"cleaned", "cleanup-failed"})

The plan and its objects are `devstack.archive`'s (deterministic bytes streamed in
pieces, never whole in memory; re-exported here). Every call carries a fresh fake compact JWS
grant (`fake_grant()`: recognisable by `GRANT_MARK`, kept in `issued_grants` so a test can
search logs and databases for them). Refusals raise `CallFailed` (`.error_data`). Object
digests are computed in a worker thread before `prepare` needs the manifest.

Every call is sent again while the agent answers `not-ready` (it serves only once its session
is set up; `resend_not_ready=False` shows the refusal instead). Retries (`retries=N`): a
retryable refusal (`error.data.retryable`) is re-sent after `retry_delay`; a session failure
(`SessionClosed`, `CallTimeout`) first waits until the agent reconnected and read its cluster
document. Each attempt is the same request with a fresh grant
(and, for a stage, a fresh stream) at the same `expectedRevision`: the agent's exact-replay rule
makes that safe when the lost attempt did succeed. The chunk form is the stand-in's
(`StreamSettings.chunk_form`, see `stand_in_settings()`); the piece size is the driver's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal

from agent.clock import SYSTEM_CLOCK, Clock
from agent.contracts.isolatedrestore import (
    METHOD_CLEANUP,
    METHOD_EXECUTE,
    METHOD_GET_STATUS,
    METHOD_PREPARE,
    METHOD_STAGE,
)
from agent.errors import CallFailed, CallTimeout, NotReady, SessionClosed, StreamBroken
from agent.protocol.connection import ConnectionSettings, StreamSettings
from agent.protocol.handlers import ByteSink
from devstack.archive import (
    BLOCK_SIZE,
    GRANT_MARK,
    MappingSpec,
    MiB,
    ObjectSpec,
    RestorePlan,
    demo_plan,
    fake_grant,
)
from devstack.cloudly import StandInCloudly

__all__ = [
    "BLOCK_SIZE",
    "GRANT_MARK",
    "MappingSpec",
    "MiB",
    "ObjectSpec",
    "Progress",
    "RestoreDriver",
    "RestorePlan",
    "Retrying",
    "StageProgress",
    "StateSeen",
    "demo_plan",
    "fake_grant",
    "stand_in_settings",
]


def stand_in_settings(chunk_form: Literal["buffer", "base64"] = "buffer") -> ConnectionSettings:
    """Peer settings for a `StandInCloudly` sending stream chunks in `chunk_form`."""
    return ConnectionSettings(streams=StreamSettings(chunk_form=chunk_form))


# --- progress ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StageProgress:
    """Bytes of `path` handed to the stream `seconds` after the stage call began: after every
    piece, and once more (`answered`) when the agent answered the call."""

    path: str
    sent_bytes: int
    total_bytes: int
    seconds: float
    answered: bool = False


@dataclass(frozen=True, slots=True)
class StateSeen:
    """An answer carried a state whose status or revision differs from the last one seen."""

    method: str
    status: str
    revision: int
    state: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Retrying:
    """An attempt failed and will be repeated (`reason`: the error code or exception name)."""

    method: str
    attempt: int
    reason: str


Progress = StageProgress | StateSeen | Retrying

_SESSION_ERRORS: Final = (SessionClosed, CallTimeout, StreamBroken)


# --- the driver --------------------------------------------------------------------------------


@dataclass
class RestoreDriver:
    """Drives one isolated restore of `plan` through `cloudly` (see the module docstring)."""

    cloudly: StandInCloudly
    plan: RestorePlan
    piece_size: int = 256 * 1024
    call_timeout: float = 120.0
    poll_interval: float = 0.05
    retries: int = 0
    retry_delay: float = 0.05
    reconnect_timeout: float = 30.0
    clock: Clock = SYSTEM_CLOCK  # waits between polls and retries; times the stage progress
    # An agent that just connected may still be enrolling and answers `not-ready`: send again.
    resend_not_ready: bool = True
    on_progress: Callable[[Progress], None] | None = None
    revision: int = 0
    state: dict[str, Any] | None = None
    issued_grants: list[str] = field(default_factory=list)
    # The plan's objects by path, for the plan they were indexed from (a stage finds its
    # object at once, whatever the manifest's size).
    _index: tuple[RestorePlan, dict[str, ObjectSpec]] | None = field(
        default=None, init=False, repr=False
    )

    # --- the five requests ----------------------------------------------------------------

    async def compute_digests(self) -> None:
        """Fill in every object's sha256 (one streaming pass each, in a worker thread)."""
        specs = []
        for spec in self.plan.objects:
            if spec.sha256 is None:
                spec = replace(spec, sha256=await asyncio.to_thread(spec.compute_sha256))
            specs.append(spec)
        self.plan = replace(self.plan, objects=tuple(specs))

    async def prepare(
        self, *, expected_revision: int | None = None, settle: bool = True
    ) -> dict[str, Any]:
        """`coreflowPrepareIsolatedRestore` with the plan's mappings and manifest.

        The agent answers `preparing` (the next revision) and asks Corestore in the background;
        with `settle` (the default) this polls the status, as after execute and cleanup, until
        the state is `prepared` or `failed`, and returns that state. `settle=False` returns the
        answer itself."""
        await self.compute_digests()
        plan = self.plan
        fields = {
            "sourceBackupId": plan.source_backup_id,
            "sourceServiceId": plan.source_service_id,
            "scratchNamespaceId": plan.scratch_namespace_id,
            "stagingArchiveId": plan.staging_archive_id,
            "resourceMappings": [mapping.to_wire() for mapping in plan.mappings],
            "archiveManifest": {"objects": [spec.entry() for spec in plan.objects]},
        }
        answer = await self._mutation(METHOD_PREPARE, expected_revision, fields)
        if not settle:
            return answer
        return await self.wait_until({"prepared", "failed"})

    async def stage(
        self,
        obj: ObjectSpec | str,
        *,
        expected_revision: int | None = None,
        piece_size: int | None = None,
        corrupt_at: int | None = None,
        stall_after: int | None = None,
    ) -> dict[str, Any]:
        """`stageIsolatedRestoreArchive`: the object's bytes on a fresh VirtualStream (with
        `stall_after`, the writer stops after that many bytes and keeps the stream open, as a
        Cloudly that hangs mid-object: its keep-alives go on until the call is answered)."""
        path = obj if isinstance(obj, str) else obj.path
        if self._spec(path).sha256 is None:
            await self.compute_digests()
        spec = self._spec(path)
        expected = self.revision if expected_revision is None else expected_revision

        async def attempt() -> dict[str, Any]:
            body = {**self._base(), "expectedRevision": expected, "object": spec.entry()}
            pieces = spec.pieces(piece_size or self.piece_size, corrupt_at=corrupt_at)
            return await self._stream_call(body, spec, pieces, stall_after)

        return self._seen(METHOD_STAGE, (await self._with_retries(METHOD_STAGE, attempt))["state"])

    async def stage_all(self) -> dict[str, Any]:
        """Stage every object of the plan in order; the last state."""
        state: dict[str, Any] = {}
        for spec in self.plan.objects:
            state = await self.stage(spec)
        return state

    async def execute(self, *, expected_revision: int | None = None) -> dict[str, Any]:
        """`coreflowExecuteIsolatedRestore` (the agent answers `restoring` at once)."""
        return await self._mutation(METHOD_EXECUTE, expected_revision, {})

    async def cleanup(self, *, expected_revision: int | None = None) -> dict[str, Any]:
        """`coreflowCleanupIsolatedRestore` (the agent answers `cleaning` at once)."""
        return await self._mutation(METHOD_CLEANUP, expected_revision, {})

    async def status(self) -> dict[str, Any] | None:
        """`coreflowGetIsolatedRestoreStatus`: the state, or None when the agent has none."""

        async def attempt() -> dict[str, Any]:
            return await self._call(METHOD_GET_STATUS, self._base())

        answer = await self._with_retries(METHOD_GET_STATUS, attempt)
        if not answer.get("found"):
            return None
        return self._seen(METHOD_GET_STATUS, answer["state"])

    async def wait_until(
        self,
        statuses: Collection[str],
        *,
        timeout: float = 120.0,  # noqa: ASYNC109  # an overall deadline for many polls
    ) -> dict[str, Any]:
        """Poll the status every `poll_interval` until it is one of `statuses`."""
        async with asyncio.timeout(timeout):
            while True:
                state = await self.status()
                if state is not None and state["status"] in statuses:
                    return state
                await self.clock.sleep(self.poll_interval)

    def _spec(self, path: str) -> ObjectSpec:
        """The plan's object at `path`."""
        if self._index is None or self._index[0] is not self.plan:
            self._index = (self.plan, {spec.path: spec for spec in self.plan.objects})
        return self._index[1][path]

    # --- calls ----------------------------------------------------------------------------

    def _base(self) -> dict[str, Any]:
        grant = fake_grant()
        self.issued_grants.append(grant)
        return {
            "restoreGrant": grant,
            "clusterId": self.plan.cluster_id,
            "targetNodeName": self.plan.node,
            "restoreId": self.plan.restore_id,
        }

    async def _mutation(
        self, method: str, expected_revision: int | None, fields: Mapping[str, Any]
    ) -> dict[str, Any]:
        expected = self.revision if expected_revision is None else expected_revision

        async def attempt() -> dict[str, Any]:
            body = {**self._base(), "expectedRevision": expected, **fields}
            return await self._call(method, body)

        return self._seen(method, (await self._with_retries(method, attempt))["state"])

    async def _call(self, method: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return await self.cloudly.call_agent(method, body, self.call_timeout)

    async def _with_retries(
        self, method: str, attempt: Callable[[], Awaitable[dict[str, Any]]]
    ) -> dict[str, Any]:
        number, not_ready_since = 1, None
        while number <= self.retries + 1:
            connection = self._connection_number()
            try:
                answer = await attempt()
            except CallFailed as exc:
                now = self.clock.monotonic()
                if exc.error_data.get("code") != NotReady.code:
                    not_ready_since = None
                elif self.resend_not_ready:
                    not_ready_since = now if not_ready_since is None else not_ready_since
                    if now - not_ready_since < self.call_timeout:
                        # Not one of the `retries`: the agent is still setting up its session.
                        await self.clock.sleep(self.retry_delay)
                        continue
                if number > self.retries or not exc.error_data.get("retryable"):
                    raise
                self._report(Retrying(method, number, str(exc.error_data.get("code"))))
                await self.clock.sleep(self.retry_delay)
            except _SESSION_ERRORS as exc:
                if number > self.retries:
                    raise
                self._report(Retrying(method, number, type(exc).__name__))
                if connection and self._connection_number() == connection:
                    await self.clock.sleep(self.retry_delay)  # the session survived (a timeout)
                else:
                    await self._reconnected(after=connection)
            else:
                return answer
            number += 1
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _connection_number(self) -> int:
        try:
            return self.cloudly.connection.number
        except SessionClosed:
            return 0

    async def _reconnected(self, *, after: int) -> None:
        """Wait until an open connection newer than `after` has read its cluster document."""
        cloudly = self.cloudly
        async with asyncio.timeout(self.reconnect_timeout):
            while True:
                reads, current = cloudly.count("cluster-config-read"), self._connection_number()
                if current > after and any(
                    event.kind == "cluster-config-read" and event.connection == current
                    for event in cloudly.events
                ):
                    return
                await cloudly.wait_for("cluster-config-read", reads + 1)

    async def _stream_call(
        self,
        body: dict[str, Any],
        spec: ObjectSpec,
        pieces: Iterator[bytes],
        stall_after: int | None = None,
    ) -> dict[str, Any]:
        """The stage call with its stream written concurrently; the call's outcome decides."""
        started, sent = self.clock.monotonic(), 0

        async def write(sink: ByteSink) -> None:
            nonlocal sent
            try:
                for piece in pieces:
                    if stall_after is not None and sent >= stall_after:
                        await asyncio.Event().wait()  # until the call is answered
                    await sink.write(piece)
                    sent += len(piece)
                    elapsed = self.clock.monotonic() - started
                    self._report(StageProgress(spec.path, sent, spec.size, elapsed))
                await sink.close()
            except asyncio.CancelledError:
                await sink.abort()  # the call ended first (refusal, replay): stop the stream
                raise

        marker, sink = self.cloudly.open_send_stream()
        call = asyncio.create_task(self._call(METHOD_STAGE, {**body, "archive": marker}))
        writer = asyncio.create_task(write(sink))
        try:
            # A writer that fails (the stream broke) leaves the verdict to the call's answer.
            await asyncio.wait({call, writer}, return_when=asyncio.FIRST_COMPLETED)
            if not call.done():
                await asyncio.wait({call})
            answer = call.result()
        finally:
            for task in (call, writer):
                task.cancel()
            await asyncio.gather(call, writer, return_exceptions=True)
        elapsed = self.clock.monotonic() - started
        self._report(StageProgress(spec.path, sent, spec.size, elapsed, answered=True))
        return answer

    # --- bookkeeping ----------------------------------------------------------------------

    def _seen(self, method: str, state: dict[str, Any]) -> dict[str, Any]:
        previous = self.state
        self.state, self.revision = state, int(state["revision"])
        if previous is None or (previous["status"], previous["revision"]) != (
            state["status"],
            state["revision"],
        ):
            self._report(StateSeen(method, state["status"], int(state["revision"]), state))
        return state

    def _report(self, event: Progress) -> None:
        if self.on_progress is not None:
            self.on_progress(event)
