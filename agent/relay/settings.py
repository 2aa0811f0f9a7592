"""The relay's tunables (`RelaySettings`), read from `[corestore]` like the engine's.

A closure moves in chunks of `chunk_size` (each Corestore import PUT carries one, each export
read asks for one). `transfer_timeout` bounds each closure call to Cloudly (its answer; the
bytes are bounded by the session's stall deadline): the same knob that bounds one bulk Corestore
call, `[corestore] transfer_timeout_s`. `progress_interval` paces the `closure_sent` /
`closure_received` log lines.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from agent.corestore.shapes import DEFAULT_CHUNK_SIZE, MAX_CHUNK_SIZE
from agent.errors import InvalidState

if TYPE_CHECKING:
    from agent.config import CorestoreConfig

__all__ = ["RelaySettings"]


@dataclass(frozen=True, slots=True)
class RelaySettings:
    """How the relay moves a database closure."""

    chunk_size: int = DEFAULT_CHUNK_SIZE
    transfer_timeout: float = 300.0  # one closure call to Cloudly
    progress_interval: float = 5.0  # at most one closure progress line per transfer this often

    def __post_init__(self) -> None:
        if not 0 < self.chunk_size <= MAX_CHUNK_SIZE:
            raise InvalidState(f"chunk_size must be 1 to {MAX_CHUNK_SIZE} bytes")
        if self.transfer_timeout <= 0:
            raise InvalidState("transfer_timeout must be positive")
        if self.progress_interval < 0:
            raise InvalidState("progress_interval must not be negative")

    @classmethod
    def from_config(cls, corestore: CorestoreConfig) -> RelaySettings:
        """The settings `[corestore]` asks for (`chunk_size`, `transfer_timeout_s`)."""
        return cls(chunk_size=corestore.chunk_size, transfer_timeout=corestore.transfer_timeout_s)
