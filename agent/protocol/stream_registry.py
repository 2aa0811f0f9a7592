"""`StreamRegistry`: every VirtualStream of one connection, and the routing of stream frames.

Stream frames carry no correlation (wire.md §4.3). An incoming `##VirtualStream##` frame is:
- an ANSWER to one of our cycles when its `response` is a package: matched by `cycleId`;
- one of OUR frames coming back when its `request.cycleId` is a cycle we sent: the peer did not
  serve it (TS echoes frames for unknown streams, and a 3.3.0 responder answers `read` with
  `response: null`), so that stream breaks;
- otherwise a REQUEST for a stream we answer for; unknown stream ids are echoed back with
  `localData: null`, as the TS router does, ONCE per cycle id. The echo carries the package as
  we read it (ids, purpose, flags) and `response: null`, never the frame's `chunkData` or
  other keys: the TS router would send them back as they came, but an answer of ours is JSON
  we wrote, whatever the peer put into its frame.
Anything else is malformed and dropped (stream frames cannot carry an `error`).

Echo suppression: a peer that echoes frames for unknown streams (typedrequest 3.3.0 does, and
so do we) sends our echo straight back, and two such peers would bounce one stray frame for
ever (thousands of frames a second). So an unknown-stream frame gets at most one answer, and a
frame whose cycle id we already echoed is our own answer coming back: it is never answered.
The memory of echoed cycle ids is bounded (`ECHO_MEMORY`, oldest forgotten first); a peer
flooding more distinct stray ids than that in one round trip gets one echo per frame it sends,
never more.

A finished stream is forgotten (a stream we answer for after lingering, one we drive once it
said farewell and its reader took the end), but how it ended is remembered (`past()`, the last
`OVER_MEMORY`), so a late local call by its id is answered as the stream would have been.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Final, Literal

from agent.errors import InvalidState, RemoteProtocolError
from agent.protocol.envelope import Envelope
from agent.protocol.events import StreamBroke, StreamEnded
from agent.protocol.settings import StreamSettings
from agent.protocol.stream_frames import StreamPackage, package_from_json, stream_frame
from agent.protocol.stream_initiator import InitiatorStream
from agent.protocol.stream_responder import ResponderStream, Role, StreamAnswer

__all__ = ["ECHO_MEMORY", "OVER_MEMORY", "FrameResult", "StreamRegistry", "outcome_of"]

ECHO_MEMORY: Final = 1024
# The frames that use up a stream's invitation, by purpose (`FrameResult.used`).
_USES: Final[dict[str, Literal["chunk", "probe"]]] = {"chunk": "chunk", "feedback": "probe"}
# How many forgotten streams' outcomes are remembered, so that a late local call on one (a
# producer back after its stream broke and lingered out) is answered as the stream would have.
OVER_MEMORY: Final = 1024


@dataclass(frozen=True, slots=True)
class FrameResult:
    """What an incoming stream frame did: an answer to send, and the stream it touched."""

    reply: StreamAnswer | None = None
    stream_id: str | None = None
    dropped: str = ""  # why the frame was dropped (for the log), empty if it was not
    # A frame a stream we answer for took that uses up the invitation its last answer sent
    # (the receive budget counts it): a chunk, or a `feedback` probe.
    used: Literal["chunk", "probe"] | None = None
    waits: bool = False  # it waits behind a chunk of its stream being decoded


@dataclass(slots=True)
class StreamRegistry:
    """The streams of one connection, by id, and our outstanding cycles."""

    settings: StreamSettings
    new_id: Callable[[], str]
    # The connection's smallest call round trip at `now`, while fresh (`MinRoundTrip.current`).
    path_rtt: Callable[[float], float | None] = lambda now: None
    responders: dict[str, ResponderStream] = field(default_factory=dict)
    initiators: dict[str, InitiatorStream] = field(default_factory=dict)
    _cycles: dict[str, str] = field(default_factory=dict)  # cycle id -> initiator stream id
    _echoed: dict[str, None] = field(default_factory=dict)  # cycle ids we echoed, oldest first
    # forgotten id -> how it ended
    _over: dict[str, StreamEnded | StreamBroke] = field(default_factory=dict)

    def find(self, stream_id: str) -> ResponderStream | InitiatorStream | None:
        """The registered stream `stream_id`, if any."""
        stream = self.responders.get(stream_id)
        return stream if stream is not None else self.initiators.get(stream_id)

    def past(self, stream_id: str) -> StreamEnded | StreamBroke | None:
        """How forgotten stream `stream_id` ended; None for an id it does not remember."""
        return self._over.get(stream_id)

    def _remember(self, stream: ResponderStream | InitiatorStream) -> None:
        self._over[stream.stream_id] = outcome_of(stream)
        if len(self._over) > OVER_MEMORY:
            del self._over[next(iter(self._over))]

    def open_responder(self, stream_id: str, role: Role, now: float) -> ResponderStream:
        """Register a stream we answer for; raises `RemoteProtocolError` on a duplicate id."""
        if stream_id in self.responders or stream_id in self.initiators:
            raise RemoteProtocolError(f"stream id {stream_id} is already in use")
        stream = ResponderStream(stream_id, role, self.settings, now=now)
        self.responders[stream_id] = stream
        return stream

    def open_initiator(self, role: Role, stream_id: str | None = None) -> InitiatorStream:
        """Register a stream we drive (it starts PENDING): SEND streams get a fresh id, RECEIVE
        streams take the id of the marker the responder sent."""
        if stream_id is None:
            stream_id = self.new_id()
        if stream_id in self.responders or stream_id in self.initiators:
            raise InvalidState(f"stream id {stream_id} is already in use")
        stream = InitiatorStream(
            stream_id, role, self.settings, new_id=self.new_id, path_rtt=self.path_rtt
        )
        self.initiators[stream_id] = stream
        return stream

    def on_frame(self, env: Envelope, now: float) -> FrameResult:
        """Route one incoming `##VirtualStream##` frame."""
        if isinstance(env.response, dict):
            return self._on_answer(env, now)
        try:
            package = package_from_json(env.request)
        except RemoteProtocolError as exc:
            return FrameResult(dropped=str(exc))
        stream_id = self._cycles.pop(package.cycle_id, None)
        if stream_id is not None:
            initiator = self.initiators.get(stream_id)
            if initiator is not None:
                initiator.on_unserved(package.cycle_id)
            return FrameResult(stream_id=stream_id, dropped="our own frame came back unanswered")
        if package.cycle != "request":
            return FrameResult(dropped="stream request with cycle response")
        responder = self.responders.get(package.stream_id)
        if responder is None:
            return self._echo_once(env, package)
        waiting = responder.waiting
        reply = responder.handle(env, package, now)
        return FrameResult(
            reply=reply,
            stream_id=responder.stream_id,
            used=_USES.get(package.main_purpose),
            waits=responder.waiting > waiting,
        )

    def chunk_keeper(self, env: Envelope) -> ResponderStream | None:
        """The stream we answer for that keeps the chunk frame `env` (`keeps_chunks`), which the
        connection draws for before the frame is routed; None for any other frame. Read from
        the frame as it came, before its package is checked: the draw comes first, so a
        malformed chunk frame naming such a stream is drawn for like any other."""
        package = env.request
        if not isinstance(package, dict) or package.get("mainPurpose") != "chunk":
            return None
        stream_id = package.get("streamId")
        stream = self.responders.get(stream_id) if isinstance(stream_id, str) else None
        return stream if stream is not None and stream.keeps_chunks else None

    def _echo_once(self, env: Envelope, package: StreamPackage) -> FrameResult:
        if package.cycle_id in self._echoed:
            return FrameResult(dropped="our echo of an unknown stream's frame came back")
        self._echoed[package.cycle_id] = None
        if len(self._echoed) > ECHO_MEMORY:
            del self._echoed[next(iter(self._echoed))]
        # The package as we read it, without its payload: the echo is JSON whatever the frame
        # carried (an undecoded chunk cut out of it is no JSON we vouch for).
        echo = Envelope(env.method, package.echo(), None, is_reply=True)
        return FrameResult(reply=StreamAnswer(echo), dropped="unknown stream, echoed once")

    def _on_answer(self, env: Envelope, now: float) -> FrameResult:
        try:
            package = package_from_json(env.response)
        except RemoteProtocolError as exc:
            return FrameResult(dropped=str(exc))
        stream_id = self._cycles.pop(package.cycle_id, None)
        stream = self.initiators.get(stream_id) if stream_id is not None else None
        if stream is None:
            return FrameResult(dropped="answer for no outstanding cycle")
        stream.on_reply(package.cycle_id, package, now)
        return FrameResult(stream_id=stream.stream_id)

    def poll(self, stream: InitiatorStream, now: float) -> list[Envelope]:
        """Frames `stream` wants sent now; their cycles become outstanding."""
        frames = stream.poll(now)
        for package in frames:
            self._cycles[package.cycle_id] = stream.stream_id
        return [stream_frame(package) for package in frames]

    def expire(self, now: float) -> list[tuple[str, list[StreamAnswer]]]:
        """Apply the clock to responder streams: `(stream id, answers to send)` per stream that
        changed. Finished registrations are removed after a linger period."""
        changed: list[tuple[str, list[StreamAnswer]]] = []
        for stream in list(self.responders.values()):
            before = stream.state
            answers = stream.expire(now)
            if answers or stream.state is not before:
                changed.append((stream.stream_id, answers))
            if stream.finished(now):
                del self.responders[stream.stream_id]
                self._remember(stream)
        return changed

    def next_wakeup(self) -> float | None:
        """The earliest responder timer (idle timeout, parked read, end of lingering)."""
        times = [t for s in self.responders.values() if (t := s.next_wakeup()) is not None]
        return min(times, default=None)

    def forget_responder(self, stream_id: str) -> None:
        """Drop a stream we answer for (a request that registered it was refused)."""
        self.responders.pop(stream_id, None)

    def forget_initiator(self, stream_id: str) -> None:
        """Drop a finished stream we drove, and its outstanding cycles."""
        stream = self.initiators.pop(stream_id, None)
        if stream is not None:
            self._remember(stream)
        for cycle_id in [c for c, s in self._cycles.items() if s == stream_id]:
            del self._cycles[cycle_id]

    def all_streams(self) -> Iterator[ResponderStream | InitiatorStream]:
        """Every registered stream."""
        yield from self.responders.values()
        yield from self.initiators.values()


def outcome_of(stream: ResponderStream | InitiatorStream) -> StreamEnded | StreamBroke:
    """How `stream`, being over, ended."""
    if stream.broken:
        return StreamBroke(
            stream.stream_id, stream.broken_reason, stream.not_served, stream.malformed
        )
    return StreamEnded(stream.stream_id)
