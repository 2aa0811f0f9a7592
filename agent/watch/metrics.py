"""Every metric the agent exposes, defined once, on a registry the app owns.

`Metrics` is the only code that imports `prometheus_client` (tests/test_layers.py checks it).
It implements every hook of `agent.observe` (the parts call those, typed, and never see a
metric object) and, at scrape time, `refresh()` copies what other parts already hold as
data (the session state, last pong and readiness from `AgentStatus`, the restores and relay
jobs by status from the store) into gauges. Each `Metrics()` has its own `CollectorRegistry`,
never the library's global default, so two agents in one test process do not share a sample;
the library's process and platform collectors are registered on it too.

    restore_agent_build_info{version}                     1
    restore_agent_ready                                   1 when /readyz says ready, else 0
    restore_agent_session_state{state}                    1 for the current state, else 0
    restore_agent_cloudly_connects_total{kind}            first | reconnect (authenticated)
    restore_agent_cloudly_losses_total{cause,permanent}   failed attempts and lost sessions
    restore_agent_cloudly_pong_latency_seconds            the last keepalive round trip
                                                          (absent before a pong)
    restore_agent_cloudly_last_connect_timestamp_seconds  when the session last connected
                                                          (absent: never)
    restore_agent_cloudly_unreachable_since_timestamp_seconds
                                                          since when Cloudly is unreachable
                                                          (absent: no outage)
    restore_agent_requests_total{method,code}             Cloudly's requests by outcome code
    restore_agent_request_duration_seconds{method}        their handling time (histogram)
    restore_agent_requests_in_flight                      being handled now
    restore_agent_request_class_in_flight{class}          requests holding a seat of their
                                                          class: control | stream (a status
                                                          answered from memory holds none)
    restore_agent_request_class_deferred_total{class}     requests answered `retry` because
                                                          their class (or their node's share
                                                          of it) was full
    restore_agent_restores{status}                        node states in the store by status
    restore_agent_restores_oldest_seconds{status}         since the least recently changed
                                                          of them changed (0: none)
    restore_agent_jobs{kind,status}                       relay jobs in the store
    restore_agent_jobs_oldest_seconds{kind,status}        the same for them
    restore_agent_retention_deleted_total{what}           old finished records retention
                                                          forgot: restore | job
    restore_agent_retention_freed_bytes_total             database bytes retention gave back
                                                          to the file system
    restore_agent_retention_failures_total                retention passes that failed
    restore_agent_state_database_vacuum_failures_total{reason}
                                                          the one VACUUM of an older file:
                                                          skipped | failed
    restore_agent_state_database_bytes                    the database file and its WAL
    restore_agent_state_writable                          1 while the state disk takes writes,
                                                          0 after it refused one
    restore_agent_state_write_failures_total{cause}       writes the disk refused: disk-full |
                                                          read-only | io-error
    restore_agent_state_recovered_timestamp_seconds{how}  when the state was salvaged | reset
                                                          (0: not since this install)
    restore_agent_state_reconcile_pending                 1 while reconciliation with the
                                                          nodes' Corestore is due
    restore_agent_reconcile_orphans_total{what}           what Corestore held that the state
                                                          did not know, taken into cleanup:
                                                          restore | import
    restore_agent_recipient_retirements_total             times Cloudly retired the agent's
                                                          unexpired recipient
    restore_agent_duplicate_agent                         1 while another agent seems to
                                                          enroll with the same token
    restore_agent_staged_bytes_total                      chunk bytes Corestore accepted
    restore_agent_verified_bytes_total                    bytes of objects proven complete
    restore_agent_chunk_retries_total{reason}             unavailable | integrity
    restore_agent_stream_bytes_total{direction}           VirtualStream payload (rate() =
                                                          throughput)
    restore_agent_corestore_request_duration_seconds{route,outcome}
                                                          each HTTP attempt (histogram)
    restore_agent_corestore_credential_rejections_total   Corestore refused a node's control
                                                          credential, also after a refetch
    restore_agent_corestore_unavailable_since_seconds{node}
                                                          since when (epoch seconds) the node's
                                                          Corestore gave no usable answer; 0
                                                          while it answers
    restore_agent_corestore_storage_full{node}            1 while the node's Corestore says
                                                          its disk is full
    restore_agent_store_mutation_duration_seconds{op,outcome}
                                                          each compare-and-swap (histogram)
    restore_agent_event_loop_lag_seconds                  timer lateness (histogram)
    restore_agent_transfers_moving{node}                  transfers moving bytes to or from
                                                          the node's Corestore now
    restore_agent_transfers_queued{node}                  transfers waiting for one of the
                                                          node's places (max_transfers_per_node)
    restore_agent_transfer_wait_duration_seconds{kind}    how long a transfer waited its turn
                                                          (histogram; 0 when it did not wait)
    restore_agent_byte_budget_bytes                       [memory] budget_bytes
    restore_agent_byte_budget_held_bytes                  bytes drawn from it now
    restore_agent_byte_budget_waiting                     draws waiting for room in it
    restore_agent_byte_budget_wait_duration_seconds       how long a draw waited (histogram)
    restore_agent_memory_trims_total                      the allocator asked to give memory back
    restore_agent_memory_trimmed_bytes_total              RSS those requests gave back
    restore_agent_relay_answers_total{kind,answer,reason} relay requests by how the request
                                                          rule answered them (recorded: from
                                                          the record, nothing ran) and why
    process_* (resident and virtual memory, CPU seconds, open and max fds, start time),
    python_info                                           the library's process and platform
                                                          collectors

Histograms of how long something took or waited end in `_duration_seconds` (Prometheus'
naming convention); the loop lag is a lateness, not the duration of some work, and keeps its
name. A gauge whose fact may not exist yet (the pong latency before the first pong, the last
connect before the first, the outage's start while connected) is absent then, not 0: a
collector (`_SessionGauges`) yields it only when the status holds it.

No `_created` series: they double the series count and no dashboard or alert here reads them
(`disable_created_metrics()`, a process-wide switch of the library, which is the agent's alone
in its process).

Label values are bounded: methods are the routes the agent serves (the connection refuses
any other before a handler runs), codes the wire error codes, causes the session's fault
words, routes and ops the Corestore route and state-machine names, kinds and statuses those of
the relay job table, nodes the cluster's node ids the agent moved bytes for.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric

from agent import __version__
from agent.contracts.isolatedrestore import NODE_STATUSES
from agent.domain.job_machine import JOB_KINDS, JOB_STATUSES, answer_reasons
from agent.observe import Direction
from agent.protocol.admission import REQUEST_CLASSES
from agent.store.faults import CAUSES
from agent.store.records import StatusSummary
from agent.watch.status import SessionState, StatusSnapshot

__all__ = ["CONTENT_TYPE", "Metrics"]

CONTENT_TYPE: Final = CONTENT_TYPE_LATEST
_NS: Final = "restore_agent"
# The route whose resends and integrity refusals are chunk retries (agent.corestore.routes).
_CHUNK_ROUTE: Final = "put-chunk"

# Seconds. Corestore calls range from a health check (ms) to a chunk PUT or a verification
# (tens of seconds); store mutations are one fsync'd SQLite statement; loop lag above 0.1 s
# already means something blocks the loop.
_CORESTORE_BUCKETS: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
_STORE_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)
_LAG_BUCKETS: Final = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5)
_REQUEST_BUCKETS: Final = (0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300)
# A transfer waits for its node's earlier ones: nothing, or up to whole transfers (minutes).
_WAIT_BUCKETS: Final = (0.001, 0.1, 1, 10, 30, 60, 300, 900, 3600)


class _SessionGauges:
    """The session's gauges that exist only while their fact does, read from the snapshot the
    last scrape's `refresh()` saw (a collector: a plain Gauge always has a value)."""

    def __init__(self) -> None:
        self.snapshot: StatusSnapshot | None = None

    def describe(self) -> list[Metric]:
        """Nothing to check at registration: the names are the module's own."""
        return []

    def collect(self) -> Iterator[Metric]:
        """Each gauge whose fact the snapshot holds."""
        snapshot = self.snapshot
        if snapshot is None:
            return
        facts = (
            (
                "cloudly_pong_latency_seconds",
                "Round trip of the last keepalive ping answered by Cloudly (absent before one).",
                snapshot.pong_latency,
            ),
            (
                "cloudly_last_connect_timestamp_seconds",
                "When the Cloudly session last connected, epoch seconds (absent: never).",
                snapshot.last_connected_at,
            ),
            (
                "cloudly_unreachable_since_timestamp_seconds",
                "Since when Cloudly has been unreachable: the end of the last session, or the "
                "agent's start (epoch seconds; absent while there is no outage).",
                snapshot.unreachable_since,
            ),
        )
        for name, documentation, value in facts:
            if value is not None:
                yield GaugeMetricFamily(f"{_NS}_{name}", documentation, value=value)


class Metrics:
    """The agent's metrics on their own registry; implements every `agent.observe` hook."""

    def __init__(self) -> None:
        disable_created_metrics()  # type: ignore[no-untyped-call]  # unannotated upstream
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        # The library's own collectors, on this registry rather than its global default.
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        build = Gauge(f"{_NS}_build_info", "The agent's version.", ["version"], registry=r)
        build.labels(version=__version__).set(1)
        self._ready = Gauge(
            f"{_NS}_ready", "1 when the agent is ready (/readyz answers 200), else 0.", registry=r
        )
        self._state = Gauge(
            f"{_NS}_session_state", "1 for the Cloudly session's current state.", ["state"],
            registry=r,
        )  # fmt: skip
        self._connects = Counter(
            f"{_NS}_cloudly_connects", "Authenticated Cloudly sessions.", ["kind"], registry=r
        )
        self._losses = Counter(
            f"{_NS}_cloudly_losses",
            "Failed connection attempts and lost sessions, by cause.",
            ["cause", "permanent"],
            registry=r,
        )
        self._session_gauges = _SessionGauges()
        r.register(self._session_gauges)
        self._requests = Counter(
            f"{_NS}_requests", "Requests from Cloudly, by method and outcome code.",
            ["method", "code"], registry=r,
        )  # fmt: skip
        self._request_seconds = Histogram(
            f"{_NS}_request_duration_seconds", "Time to answer a request from Cloudly.", ["method"],
            buckets=_REQUEST_BUCKETS, registry=r,
        )  # fmt: skip
        self._in_flight = Gauge(
            f"{_NS}_requests_in_flight", "Requests from Cloudly being handled.", registry=r
        )
        self._class_in_flight = Gauge(
            f"{_NS}_request_class_in_flight",
            "Requests from Cloudly holding a seat of their class (control, stream).",
            ["class"], registry=r,
        )  # fmt: skip
        self._class_deferred = Counter(
            f"{_NS}_request_class_deferred",
            "Requests from Cloudly answered retry because their class was full.",
            ["class"], registry=r,
        )  # fmt: skip
        self._restores = Gauge(
            f"{_NS}_restores", "Isolated-restore node states in the store, by status.",
            ["status"], registry=r,
        )  # fmt: skip
        self._restores_oldest = Gauge(
            f"{_NS}_restores_oldest_seconds",
            "Seconds since the least recently changed node state of this status changed (0: none).",
            ["status"],
            registry=r,
        )
        self._jobs = Gauge(
            f"{_NS}_jobs", "Relay jobs (service backups and restores) in the store.",
            ["kind", "status"], registry=r,
        )  # fmt: skip
        self._jobs_oldest = Gauge(
            f"{_NS}_jobs_oldest_seconds",
            "Seconds since the least recently changed relay job of this kind and status changed "
            "(0: none).",
            ["kind", "status"],
            registry=r,
        )
        self._relay_answers = Counter(
            f"{_NS}_relay_answers",
            "Relay backup and restore requests by how the request rule answered them: start, "
            "resume, retry (the work ran), join, recorded (nothing ran), conflict, busy; reason: "
            "what the request met, or for a restore meeting its service's ended run, where that "
            "run's answer went (answer-confirmed, answer-on-this-connection: Cloudly holds it; "
            "answer-lost-with-its-connection, answer-never-given, "
            "answer-unconfirmed-before-restart: it may be lost).",
            ["kind", "answer", "reason"],
            registry=r,
        )
        self._retention_deleted = Counter(
            f"{_NS}_retention_deleted",
            "Old finished records retention forgot: restore (a node state with its plan and "
            "staging rows) or job (a relay job).",
            ["what"],
            registry=r,
        )
        self._retention_freed = Counter(
            f"{_NS}_retention_freed_bytes",
            "Bytes of the state database retention gave back to the file system.",
            registry=r,
        )
        self._retention_failures = Counter(
            f"{_NS}_retention_failures",
            "Retention passes that failed (the store failed or closed); the next pass, an hour "
            "later, tries again.",
            registry=r,
        )
        self._vacuum_failures = Counter(
            f"{_NS}_state_database_vacuum_failures",
            "The one VACUUM that switches a database an older agent made to giving pages back "
            "did not run at start: skipped (no room for a copy) or failed.",
            ["reason"],
            registry=r,
        )
        self._database_bytes = Gauge(
            f"{_NS}_state_database_bytes",
            "The state database file and its WAL on disk, in bytes.",
            registry=r,
        )
        self._staged = Counter(
            f"{_NS}_staged_bytes", "Chunk bytes Corestore accepted with a matching sha256.",
            registry=r,
        )  # fmt: skip
        self._verified = Counter(
            f"{_NS}_verified_bytes",
            "Bytes of staged objects proven complete (size, sha256, Corestore's commit).",
            registry=r,
        )
        self._chunk_retries = Counter(
            f"{_NS}_chunk_retries",
            "Chunk PUTs sent again: Corestore unavailable, or the chunk refused for its digest.",
            ["reason"],
            registry=r,
        )
        self._stream_bytes = Counter(
            f"{_NS}_stream_bytes", "VirtualStream payload bytes, by direction.", ["direction"],
            registry=r,
        )  # fmt: skip
        self._corestore = Histogram(
            f"{_NS}_corestore_request_duration_seconds",
            "One HTTP attempt at the node's Corestore, by route and answer.",
            ["route", "outcome"],
            buckets=_CORESTORE_BUCKETS,
            registry=r,
        )
        self._credential_rejections = Counter(
            f"{_NS}_corestore_credential_rejections",
            "Calls Corestore refused for the node's control credential, also after it was "
            "fetched again (or with none other to try).",
            registry=r,
        )
        self._corestore_down = Gauge(
            f"{_NS}_corestore_unavailable_since_seconds",
            "Since when (epoch seconds) the node's Corestore gave no usable answer (no answer, "
            "or 5xx, 408, 429); 0 while it answers.",
            ["node"],
            registry=r,
        )
        self._mutations = Histogram(
            f"{_NS}_store_mutation_duration_seconds",
            "One compare-and-swap of the revision store, by operation and outcome.",
            ["op", "outcome"],
            buckets=_STORE_BUCKETS,
            registry=r,
        )
        self._lag = Histogram(
            f"{_NS}_event_loop_lag_seconds",
            "How late a timer fired on the event loop.",
            buckets=_LAG_BUCKETS,
            registry=r,
        )
        self._transfers_moving = Gauge(
            f"{_NS}_transfers_moving",
            "Transfers (stages, closure exports and imports) moving bytes to or from the node's "
            "Corestore now.",
            ["node"],
            registry=r,
        )
        self._transfers_queued = Gauge(
            f"{_NS}_transfers_queued",
            "Transfers waiting their turn for one of the node's places (max_transfers_per_node).",
            ["node"],
            registry=r,
        )
        self._transfer_wait = Histogram(
            f"{_NS}_transfer_wait_duration_seconds",
            "How long a transfer waited in its node's queue before it moved (0: not at all).",
            ["kind"],
            buckets=_WAIT_BUCKETS,
            registry=r,
        )
        self._budget = Gauge(
            f"{_NS}_byte_budget_bytes",
            "The byte budget every transfer draws from ([memory] budget_bytes).",
            registry=r,
        )
        self._budget_held = Gauge(
            f"{_NS}_byte_budget_held_bytes",
            "Bytes drawn from the byte budget now (frames, chunks and bodies transfers hold).",
            registry=r,
        )
        self._budget_waiting = Gauge(
            f"{_NS}_byte_budget_waiting",
            "Draws waiting for room in the byte budget (transfers held back).",
            registry=r,
        )
        self._budget_wait = Histogram(
            f"{_NS}_byte_budget_wait_duration_seconds",
            "How long a draw from the byte budget waited for room (0: not at all).",
            buckets=_WAIT_BUCKETS,
            registry=r,
        )
        self._trims = Counter(
            f"{_NS}_memory_trims",
            "Times the allocator was asked to give free memory back after the transfers ended.",
            registry=r,
        )
        self._trimmed = Counter(
            f"{_NS}_memory_trimmed_bytes",
            "Resident memory those requests gave back to the system.",
            registry=r,
        )
        self._writable = Gauge(
            f"{_NS}_state_writable",
            "1 while the node's state disk takes the agent's writes, 0 after it refused one "
            "(full, read-only, failing) until one gets through again.",
            registry=r,
        )
        self._write_failures = Counter(
            f"{_NS}_state_write_failures",
            "Writes of the state the disk refused, by cause.",
            ["cause"],
            registry=r,
        )
        self._recovered = Gauge(
            f"{_NS}_state_recovered_timestamp_seconds",
            "When the state this agent runs on was salvaged or reset (epoch seconds; 0: not "
            "since it was made).",
            ["how"],
            registry=r,
        )
        self._reconcile_pending = Gauge(
            f"{_NS}_state_reconcile_pending",
            "1 while reconciliation of a salvaged or reset state with the nodes' Corestore is "
            "due, else 0.",
            registry=r,
        )
        self._orphans = Counter(
            f"{_NS}_reconcile_orphans",
            "What a node's Corestore held that the salvaged or reset state did not know, taken "
            "into cleanup work: restore (scratch and staging) or import (a closure import).",
            ["what"],
            registry=r,
        )
        self._corestore_full = Gauge(
            f"{_NS}_corestore_storage_full",
            "1 while the node's Corestore answers that its disk is full.",
            ["node"],
            registry=r,
        )
        self._retirements = Counter(
            f"{_NS}_recipient_retirements",
            "Times Cloudly answered unknown-recipient for the agent's unexpired recipient "
            "(retired: another enrollment for the cluster, or Cloudly forgot it).",
            registry=r,
        )
        self._duplicate = Gauge(
            f"{_NS}_duplicate_agent",
            "1 while another agent seems to enroll with this cluster's machine token (the "
            "agent's recipient retired again and again), else 0.",
            registry=r,
        )
        self._writable.set(1)
        for cause in CAUSES:
            self._write_failures.labels(cause=cause)
        for how in ("salvaged", "reset"):
            self._recovered.labels(how=how).set(0)
        for what in ("restore", "import"):
            self._orphans.labels(what=what)
        for state in SessionState:
            self._state.labels(state=state.value).set(0)
        for status in NODE_STATUSES:
            self._restores.labels(status=status).set(0)
            self._restores_oldest.labels(status=status).set(0)
        for kind in JOB_KINDS:
            for job_status in JOB_STATUSES:
                self._jobs.labels(kind=kind, status=job_status).set(0)
                self._jobs_oldest.labels(kind=kind, status=job_status).set(0)
        for job_kind, verdict, reason in answer_reasons():
            self._relay_answers.labels(kind=job_kind, answer=verdict.value, reason=reason)
        for what in ("restore", "job"):
            self._retention_deleted.labels(what=what)
        for reason in ("unavailable", "integrity"):
            self._chunk_retries.labels(reason=reason)
        for reason in ("skipped", "failed"):
            self._vacuum_failures.labels(reason=reason)
        for direction in ("in", "out"):
            self._stream_bytes.labels(direction=direction)
        for request_class in REQUEST_CLASSES:
            self._class_in_flight.labels(request_class)
            self._class_deferred.labels(request_class)

    # --- scrape time ------------------------------------------------------------------------

    def refresh(
        self,
        snapshot: StatusSnapshot,
        summary: StatusSummary | None,
        *,
        ready: bool,
        now_ms: int,
    ) -> None:
        """Copy the gauges' facts from the status, the readiness verdict and the store's
        summary (None: the store could not be read, its last numbers stay)."""
        self._ready.set(1 if ready else 0)
        for state in SessionState:
            self._state.labels(state=state.value).set(1 if state is snapshot.state else 0)
        self._in_flight.set(snapshot.in_flight)
        self._session_gauges.snapshot = snapshot
        if summary is None:
            return
        self._database_bytes.set(summary.database_bytes)
        for status in NODE_STATUSES:
            count, oldest = summary.restores.get(status, (0, now_ms))
            self._restores.labels(status=status).set(count)
            self._restores_oldest.labels(status=status).set(_age(now_ms, oldest, count))
        for kind in JOB_KINDS:
            for job_status in JOB_STATUSES:
                count, oldest = summary.jobs.get((kind, job_status), (0, now_ms))
                self._jobs.labels(kind=kind, status=job_status).set(count)
                self._jobs_oldest.labels(kind=kind, status=job_status).set(
                    _age(now_ms, oldest, count)
                )

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)

    # --- agent.observe hooks ----------------------------------------------------------------

    def session_connected(self, *, reconnect: bool) -> None:
        """Count an authenticated session."""
        self._connects.labels(kind="reconnect" if reconnect else "first").inc()

    def session_lost(self, *, cause: str, permanent: bool) -> None:
        """Count a failed attempt or a lost session by cause."""
        self._losses.labels(cause=cause, permanent="true" if permanent else "false").inc()

    def request_handled(self, *, method: str, code: str, seconds: float) -> None:
        """Count a request by outcome and time it."""
        self._requests.labels(method=method, code=code).inc()
        self._request_seconds.labels(method=method).observe(seconds)

    def requests_seated(self, *, request_class: str, count: int) -> None:
        """Set the class's seated requests."""
        self._class_in_flight.labels(request_class).set(count)

    def requests_deferred(self, *, request_class: str, count: int) -> None:
        """Count requests their class turned away."""
        self._class_deferred.labels(request_class).inc(count)

    def stream_bytes(self, *, direction: Direction, count: int) -> None:
        """Count stream payload bytes."""
        self._stream_bytes.labels(direction=direction).inc(count)

    def store_mutation(self, *, op: str, outcome: str, seconds: float) -> None:
        """Time a compare-and-swap."""
        self._mutations.labels(op=op, outcome=outcome).observe(seconds)

    def chunk_recorded(self, *, length: int) -> None:
        """Count staged bytes."""
        self._staged.inc(length)

    def object_written(self, *, size: int) -> None:
        """Count verified bytes."""
        self._verified.inc(size)

    def retention_deleted(self, *, what: str, count: int) -> None:
        """Count records retention forgot."""
        self._retention_deleted.labels(what=what).inc(count)

    def relay_answered(self, *, kind: str, answer: str, reason: str) -> None:
        """Count how a relay request was answered, and why."""
        self._relay_answers.labels(kind=kind, answer=answer, reason=reason).inc()

    def retention_freed(self, *, count: int) -> None:
        """Count bytes retention gave back."""
        self._retention_freed.inc(count)

    def retention_failed(self) -> None:
        """Count a failed retention pass."""
        self._retention_failures.inc()

    def vacuum_failed(self, *, reason: str) -> None:
        """Count the start-up VACUUM that was skipped or failed."""
        self._vacuum_failures.labels(reason=reason).inc()

    def corestore_answer(self, *, route: str, outcome: str, seconds: float) -> None:
        """Time a Corestore attempt; an integrity refusal of a chunk is a chunk retry."""
        self._corestore.labels(route=route, outcome=outcome).observe(seconds)
        if route == _CHUNK_ROUTE and outcome == "integrity":
            self._chunk_retries.labels(reason="integrity").inc()

    def credential_rejected(self) -> None:
        """Count a control credential Corestore refused for good."""
        self._credential_rejections.inc()

    def corestore_unavailable(self, *, node: str, since: float | None) -> None:
        """Set since when the node's Corestore is unavailable (0: it answers)."""
        self._corestore_down.labels(node=node).set(since or 0)

    def corestore_resend(self, *, route: str) -> None:
        """A resend of the chunk route is a chunk retry."""
        if route == _CHUNK_ROUTE:
            self._chunk_retries.labels(reason="unavailable").inc()

    def state_write_failed(self, *, cause: str) -> None:
        """Count a refused write; the state is not writable."""
        self._write_failures.labels(cause=cause).inc()
        self._writable.set(0)

    def state_writable(self) -> None:
        """A write got through again."""
        self._writable.set(1)

    def corestore_full(self, *, node: str, full: bool) -> None:
        """Whether the node's Corestore says its disk is full."""
        self._corestore_full.labels(node=node).set(1 if full else 0)

    def state_recovered(self, *, how: str, at: float) -> None:
        """When the state was salvaged or reset."""
        self._recovered.labels(how=how).set(at)

    def reconcile_pending(self, *, pending: bool) -> None:
        """Whether reconciliation with the nodes' Corestore is due."""
        self._reconcile_pending.set(1 if pending else 0)

    def orphans_adopted(self, *, what: str, count: int) -> None:
        """Count what reconciliation took into cleanup."""
        self._orphans.labels(what=what).inc(count)

    def recipient_retired(self) -> None:
        """Count a retirement of the agent's recipient."""
        self._retirements.inc()

    def duplicate_agent(self, *, text: str | None) -> None:
        """Whether another agent seems to use the same token."""
        self._duplicate.set(0 if text is None else 1)

    def loop_lag(self, *, seconds: float) -> None:
        """Record how late the loop was."""
        self._lag.observe(seconds)

    def transfers_changed(self, *, node: str, moving: int, queued: int) -> None:
        """Set the node's moving and queued transfers."""
        self._transfers_moving.labels(node=node).set(moving)
        self._transfers_queued.labels(node=node).set(queued)

    def transfer_waited(self, *, kind: str, seconds: float) -> None:
        """Record a transfer's wait for its turn."""
        self._transfer_wait.labels(kind=kind).observe(seconds)

    def budget_changed(self, *, limit: int, held: int, waiting: int) -> None:
        """Set the byte budget's size, drawn bytes and waiters."""
        self._budget.set(limit)
        self._budget_held.set(held)
        self._budget_waiting.set(waiting)

    def budget_waited(self, *, seconds: float) -> None:
        """Record a draw's wait for room."""
        self._budget_wait.observe(seconds)

    def memory_trimmed(self, *, released: int) -> None:
        """Count a trim and what it gave back."""
        self._trims.inc()
        self._trimmed.inc(max(0, released))


def _age(now_ms: int, oldest_ms: int, count: int) -> float:
    """Seconds since `oldest_ms`, 0 when there is no row (or the clock went back)."""
    return max(0, now_ms - oldest_ms) / 1000 if count else 0.0
