"""The tunables of one connection and of its streams: every protocol knob, named and defaulted
here once.

`StreamSettings` is what every stream of a connection shares; `ConnectionSettings` holds it
(`streams`) next to the connection's own knobs. The configuration's `[streams]` section and
`[cloudly]`'s request bounds take their defaults from these classes, so an operator's
default and the protocol's are the same number.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.errors import InvalidState
from agent.protocol.chunks import ChunkForm

__all__ = ["ConnectionSettings", "StreamSettings"]


@dataclass(frozen=True, slots=True)
class StreamSettings:
    """Tunables shared by every stream of a connection.

    - `window` (chunks) and `window_bytes` bound what one stream we receive may queue before we
      report backpressure (a sender past twice either breaks it), and what a stream we send on
      queues before the producer waits;
    - `inline_decode_max`: the payload size (characters) from which a received chunk is left
      for the driver to decode off the event loop;
    - `idle_timeout`: seconds a stream may go without a frame of its initiator (a stream we
      answer for) or an answer of its responder (a stream we drive) before it breaks; also how
      long a finished stream we answer for stays registered;
    - `park_timeout`: how long a `read` we answer waits for data before it is answered empty
      (long poll), and the period of the keep-alives on a stream we drive: the longest either
      side of a healthy stream stays silent on purpose (keep it well below `idle_timeout`);
    - `probe_interval`: how soon a sender paused by backpressure probes again, and a reader
      whose `read` came back empty reads again;
    - `chunk_form`: how we encode the chunks we send ("buffer" or "base64", see `chunks`);
    - `cycles`: data cycles a stream we drive keeps in flight (None: `window`; 1 is what a
      typedrequest 3.3.0 initiator does: a stand-in Cloudly set so moves like the real one).
    """

    window: int = 16
    window_bytes: int = 8 * 1024 * 1024
    inline_decode_max: int = 64 * 1024
    idle_timeout: float = 10.0
    park_timeout: float = 1.0
    probe_interval: float = 0.05
    chunk_form: ChunkForm = "buffer"
    cycles: int | None = None

    def __post_init__(self) -> None:
        if self.chunk_form not in ("buffer", "base64"):
            raise InvalidState(f"unknown chunk_form {self.chunk_form!r}")
        if self.window < 1:
            raise InvalidState("stream window must be at least 1")
        if self.cycles is not None and self.cycles < 1:
            raise InvalidState("stream cycles must be at least 1 (None: the window)")
        if self.window_bytes < 1 or self.inline_decode_max < 0:
            raise InvalidState(
                "stream window_bytes must be positive, inline_decode_max not negative"
            )


@dataclass(frozen=True, slots=True)
class ConnectionSettings:
    """Tunables of one connection: its streams' (`streams`), how often a call is sent again on
    `retry` advice (`max_retry_attempts`), how many requests are handled at once, by class
    (`agent.protocol.admission`: `max_concurrent_requests` control requests,
    `max_stream_requests` requests that carry or wait for a stream, of those at most
    `max_stream_requests_per_node` for one node), how long a caller turned away for that waits
    (`busy_retry_ms`), and how many bytes of chunk frames our answers invite at once across
    the streams we receive (`receive_budget`, None: no bound; `receive_budget.ReceiveBudget`),
    which grows with the measured bandwidth-delay product up to `receive_budget_max` (None:
    it stays at `receive_budget`)."""

    streams: StreamSettings = field(default_factory=StreamSettings)
    max_retry_attempts: int = 5
    max_concurrent_requests: int = 64
    max_stream_requests: int = 512
    max_stream_requests_per_node: int = 64
    busy_retry_ms: int = 1000
    receive_budget: int | None = 4 * 1024 * 1024
    receive_budget_max: int | None = 64 * 1024 * 1024

    def __post_init__(self) -> None:
        if self.max_concurrent_requests < 1:
            raise InvalidState("max_concurrent_requests must be at least 1")
        if self.max_stream_requests < 1 or self.max_stream_requests_per_node < 1:
            raise InvalidState(
                "max_stream_requests and max_stream_requests_per_node must be at least 1"
            )
        if self.receive_budget is not None and self.receive_budget < 1:
            raise InvalidState("receive_budget must be positive (None: no bound)")
        if self.receive_budget_max is not None and self.receive_budget_max < 1:
            raise InvalidState("receive_budget_max must be positive (None: no growth)")
