"""`IUnifiedStreamDataPackage`: the body of every `##VirtualStream##` frame (wire.md §4.3).

Stream frames carry no correlation: a request frame holds the package in `request` (`cycle:
"request"`), the answer holds it in `response` (`cycle: "response"`, same `cycleId`). Keys are
written in the order typedrequest 3.3.0 writes them; absent optional fields are omitted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final, Literal, cast

from agent.errors import RemoteProtocolError
from agent.protocol.envelope import STREAM_METHOD, Envelope

__all__ = [
    "PURPOSES",
    "Purpose",
    "StreamPackage",
    "package_from_json",
    "stream_frame",
    "stream_reply",
]

Purpose = Literal["start", "chunk", "read", "end", "feedback", "keepAlive"]
PURPOSES: Final = frozenset({"start", "chunk", "read", "end", "feedback", "keepAlive"})
_ABSENT: Final = object()


@dataclass(frozen=True, slots=True)
class StreamPackage:
    """One package; `chunk_data` is the raw JSON value (decode with `decode_chunk`)."""

    stream_id: str
    cycle_id: str
    cycle: Literal["request", "response"]
    main_purpose: Purpose
    backpressure: bool | None = None
    next: bool | None = None
    keep_alive: bool | None = None
    chunk_data: Any = None

    def to_json(self) -> dict[str, Any]:
        """The wire object (TS key order, `None` fields left out)."""
        obj: dict[str, Any] = {
            "streamId": self.stream_id,
            "cycleId": self.cycle_id,
            "cycle": self.cycle,
            "mainPurpose": self.main_purpose,
        }
        if self.keep_alive is not None:
            obj["keepAlive"] = self.keep_alive
        if self.next is not None:
            obj["next"] = self.next
        if self.backpressure is not None:
            obj["backpressure"] = self.backpressure
        if self.chunk_data is not None:
            obj["chunkData"] = self.chunk_data
        return obj

    def echo(self) -> dict[str, Any]:
        """The wire object without `chunkData`: what an answer carries back of a request."""
        return replace(self, chunk_data=None).to_json()


def package_from_json(value: Any) -> StreamPackage:
    """Validate a package; raises `RemoteProtocolError` naming the offending field."""
    if not isinstance(value, Mapping):
        raise RemoteProtocolError("stream package is not an object")
    stream_id, cycle_id = value.get("streamId"), value.get("cycleId")
    cycle, purpose = value.get("cycle"), value.get("mainPurpose")
    if not isinstance(stream_id, str) or not stream_id:
        raise RemoteProtocolError("stream package streamId is not a non-empty string")
    if not isinstance(cycle_id, str) or not cycle_id:
        raise RemoteProtocolError("stream package cycleId is not a non-empty string")
    if cycle not in ("request", "response"):
        raise RemoteProtocolError("stream package cycle is neither request nor response")
    # A string first: a set lookup of a peer's object or array would raise TypeError.
    if not isinstance(purpose, str) or purpose not in PURPOSES:
        raise RemoteProtocolError("stream package mainPurpose is unknown")
    return StreamPackage(
        stream_id=stream_id,
        cycle_id=cycle_id,
        cycle=cycle,
        main_purpose=cast(Purpose, purpose),  # one of PURPOSES, checked above
        backpressure=_flag(value, "backpressure"),
        next=_flag(value, "next"),
        keep_alive=_flag(value, "keepAlive"),
        chunk_data=value.get("chunkData"),
    )


def stream_frame(package: StreamPackage) -> Envelope:
    """A stream request frame: no correlation, `response: null`."""
    return Envelope(method=STREAM_METHOD, request=package.to_json(), response=None)


def stream_reply(request: StreamPackage, answer: StreamPackage, *, echo_request: bool) -> Envelope:
    """The answer to the stream frame carrying `request`: `chunk` answers carry `request: null`
    as in TS; the others echo the request package as we read it, without its `chunkData`.

    typedrequest 3.3.0 echoes the frame's whole `request`, but no initiator reads it back (it
    reads `response`); what we echo is what we validated, never the peer's payload, so an
    answer is JSON whatever the peer put into its frame.
    """
    return Envelope(
        method=STREAM_METHOD,
        request=request.echo() if echo_request else None,
        response=answer.to_json(),
        is_reply=True,
    )


def _flag(value: Mapping[str, Any], key: str) -> bool | None:
    flag = value.get(key, _ABSENT)
    if flag is _ABSENT or flag is None:
        return None
    if not isinstance(flag, bool):
        raise RemoteProtocolError(f"stream package {key} is not a boolean")
    return flag
