"""The relay's tunables (`RelaySettings`), read from `[corestore]` and `[cloudly]`.

A closure moves in chunks of `chunk_size` (each Corestore import PUT carries one, each export
read asks for one). No bound grows with a closure's size: its bytes are bounded by progress
(the session's stall deadline, `[streams] stall_timeout_s`), and `answer_timeout` bounds only
Cloudly's answer to each closure call, a single request: the restore call's (the descriptor
and a marker), the backup call's once its stream is over. It is the knob of every call to
Cloudly, `[cloudly] call_timeout_s`. `progress_interval` paces the `closure_sent` /
`closure_received` log lines.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.corestore.shapes import DEFAULT_CHUNK_SIZE, MAX_CHUNK_SIZE
from agent.errors import InvalidState

__all__ = ["RelaySettings"]


@dataclass(frozen=True, slots=True)
class RelaySettings:
    """How the relay moves a database closure."""

    chunk_size: int = DEFAULT_CHUNK_SIZE
    answer_timeout: float = 30.0  # Cloudly's answer to one closure call
    progress_interval: float = 5.0  # at most one closure progress line per transfer this often

    def __post_init__(self) -> None:
        if not 0 < self.chunk_size <= MAX_CHUNK_SIZE:
            raise InvalidState(f"chunk_size must be 1 to {MAX_CHUNK_SIZE} bytes")
        if self.answer_timeout <= 0:
            raise InvalidState("answer_timeout must be positive")
        if self.progress_interval < 0:
            raise InvalidState("progress_interval must not be negative")
