"""The engine's tunables (`EngineSettings`).

No availability retries live here. The Corestore client resends one idempotent call while
Corestore is unavailable (`agent.retry`, configured by `[corestore] retries` and
`outage_tolerance_s`); the engine never wraps a call in a second loop. A step that still fails
`CorestoreUnavailable` ends the work (`failed`, `cleanup-failed`, or a refused stage) and
Cloudly's replay, or its next cleanup request, resumes it. What the engine does repeat is not
about availability: a chunk Corestore found corrupted in transit is sent again
(`chunk_attempts`), and a commit whose outcome was lost is settled by asking Corestore's
progress (`commit_attempts`); each waits `resend_backoff` (full jitter) before it goes again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.corestore.shapes import DEFAULT_CHUNK_SIZE, MAX_CHUNK_SIZE
from agent.errors import InvalidState
from agent.retry import Backoff

__all__ = ["EngineSettings"]


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """How the engine moves bytes and how patiently it works.

    `chunk_size` is what one chunk PUT carries (1 byte .. Corestore's 16 MiB cap; the config
    file allows 64 KiB .. 16 MiB, tests use less). `max_in_flight` is how many chunks may wait
    between the incoming stream and Corestore: memory per staged object stays below
    `(max_in_flight + 2) * chunk_size` plus the stream window. One attempt of a bulk Corestore
    call (chunk PUT, commit, verification) is bounded by the Corestore clients' own `transfer`
    timeout (`CorestoreConfig.timeouts`), not here.
    """

    chunk_size: int = DEFAULT_CHUNK_SIZE
    max_in_flight: int = 4
    chunk_attempts: int = 3  # sends of one chunk Corestore found corrupted in transit
    commit_attempts: int = 3  # commits of one object whose outcome was unknown
    # The wait before such a chunk or commit goes again (full jitter, as every resend waits).
    resend_backoff: Backoff = field(default_factory=lambda: Backoff(base=0.25, cap=5.0))
    poll_interval: float = 1.0  # between resource-restore status reads
    restore_timeout: float = 3600.0  # one resource restore, start to finish
    progress_interval: float = 5.0  # at most one staging_progress log line per object this often

    def __post_init__(self) -> None:
        if not 0 < self.chunk_size <= MAX_CHUNK_SIZE:
            raise InvalidState(f"chunk_size must be 1 to {MAX_CHUNK_SIZE} bytes")
        for name in ("max_in_flight", "chunk_attempts", "commit_attempts"):
            if getattr(self, name) < 1:
                raise InvalidState(f"{name} must be at least 1")
        for name in ("poll_interval", "progress_interval"):
            if getattr(self, name) < 0:
                raise InvalidState(f"{name} must not be negative")
        if self.restore_timeout <= 0:
            raise InvalidState("restore_timeout must be positive")
