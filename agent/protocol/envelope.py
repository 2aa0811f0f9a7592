"""The TypedRequest envelope: its dataclass, the JSON codec and the router's dispatch rule.

Wire shape (typedrequest 3.3.0, see wire.md §1):
`{method, request, response, correlation: {id, phase}, error: {text, data}, retry: {waitForMs,
reason}, localData}`. Unknown envelope keys (`localData`, `serverData`, `authInfo`, ...) are
tolerated on input and dropped: nothing we send ever echoes them (`authInfo` carries a JWT).
Replies carry `localData: null` exactly as the TS router writes it; requests carry none (the
SmartServe adapter writes into `localData` and would fail on `null`).

Decoding is two steps so the driver can answer a frame whose envelope is malformed but still
names a method and a correlation id: `parse_frame` (bytes -> JSON object) and
`envelope_from_json` (object -> `Envelope`); `decode_envelope` does both.

Depth: a frame may nest at most `MAX_DEPTH` arrays and objects (the envelope counts as one);
`envelope_from_json` refuses a deeper one. orjson reads 1,024 levels but writes only 255, so
without the bound a reply echoing a deep request could not be written; with it, every value a
frame brings can be written back. `encode_reply` still falls back to `request: null` should an
echo not encode, so a reply is always sent.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

import orjson

from agent.errors import RemoteProtocolError
from agent.protocol.chunk_frames import split_chunk_frame
from agent.protocol.chunks import EncodedChunk
from agent.protocol.markers import omit_markers

__all__ = [
    "MAX_DEPTH",
    "STREAM_METHOD",
    "Correlation",
    "Envelope",
    "ErrorInfo",
    "FrameKind",
    "RetryAdvice",
    "answerable",
    "classify",
    "decode_envelope",
    "encode_envelope",
    "encode_reply",
    "envelope_from_json",
    "error_reply",
    "nests_deeper",
    "parse_frame",
    "reply",
    "retry_reply",
]

STREAM_METHOD = "##VirtualStream##"
# Arrays and objects one frame may nest, the envelope itself included. Far above any document
# the contracts define, far below the 255 levels orjson writes (docs/wire-notes.md).
MAX_DEPTH: Final = 128
_SCALARS: Final = frozenset({str, int, float, bool, type(None)})


@dataclass(frozen=True, slots=True)
class Correlation:
    """`correlation`: the call id and its phase (`"request"`, `"response"`, or kept as sent)."""

    id: str
    phase: str


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """`error`: a one-sentence text and machine-readable data (`data.code` on our errors)."""

    text: str
    data: Any = None


@dataclass(frozen=True, slots=True)
class RetryAdvice:
    """`retry`: the responder asks the caller to resend the identical frame after a pause."""

    wait_for_ms: float
    reason: str


@dataclass(frozen=True, slots=True)
class Envelope:
    """One TypedRequest frame. `is_reply` makes the encoder write `localData: null`."""

    method: str
    request: Any = None
    response: Any = None
    correlation: Correlation | None = None
    error: ErrorInfo | None = None
    retry: RetryAdvice | None = None
    is_reply: bool = False


class FrameKind(enum.Enum):
    """What the router does with a decoded frame (wire.md §1.2, in this order)."""

    STREAM = "stream"  # method "##VirtualStream##", whatever the correlation
    REQUEST = "request"  # phase "request": run a handler and reply
    RESPONSE = "response"  # phase "response": fulfil a pending call, send nothing
    WEIRD = "weird"  # anything else: log and drop


def classify(env: Envelope) -> FrameKind:
    """The dispatch rule of the TS router."""
    if env.method == STREAM_METHOD:
        return FrameKind.STREAM
    phase = env.correlation.phase if env.correlation is not None else None
    if phase == "request":
        return FrameKind.REQUEST
    if phase == "response":
        return FrameKind.RESPONSE
    return FrameKind.WEIRD


def parse_frame(frame: bytes | str) -> dict[str, Any]:
    """The JSON object of one text frame; raises `RemoteProtocolError` if it is none.

    A `##VirtualStream##` frame in bytes with a Buffer-form or base64 chunk comes back with
    its `chunkData` (in `request` or `response`) as a `RawChunk` (see `chunk_frames`), not
    decoded yet; `decode_chunk` decodes it.
    """
    if isinstance(frame, bytes):
        fast = split_chunk_frame(frame, STREAM_METHOD)
        if fast is not None:
            return fast
    try:
        obj = orjson.loads(frame)
    except orjson.JSONDecodeError as exc:
        raise RemoteProtocolError("frame is not valid UTF-8 JSON") from exc
    if not isinstance(obj, dict):
        raise RemoteProtocolError("frame is not a JSON object")
    return obj


def envelope_from_json(obj: Mapping[str, Any]) -> Envelope:
    """Validate the envelope fields of a parsed frame; raises `RemoteProtocolError`."""
    method = obj.get("method")
    if not isinstance(method, str) or not method:
        raise RemoteProtocolError("envelope.method is not a non-empty string")
    if nests_deeper(obj, MAX_DEPTH):
        raise RemoteProtocolError(f"the frame nests deeper than {MAX_DEPTH} levels")
    return Envelope(
        method=method,
        request=obj.get("request"),
        response=obj.get("response"),
        correlation=_correlation(obj.get("correlation")),
        error=_error(obj.get("error")),
        retry=_retry(obj.get("retry")),
    )


def decode_envelope(frame: bytes | str) -> Envelope:
    """Parse and validate one frame; raises `RemoteProtocolError`."""
    return envelope_from_json(parse_frame(frame))


def answerable(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    """`(method, correlation id)` of a malformed request frame that can still get an error reply."""
    method = obj.get("method")
    corr = obj.get("correlation")
    if not isinstance(method, str) or not method or method == STREAM_METHOD:
        return None
    if not isinstance(corr, dict) or corr.get("phase") != "request":
        return None
    corr_id = corr.get("id")
    if not isinstance(corr_id, str) or not corr_id:
        return None
    return method, corr_id


def nests_deeper(value: Any, limit: int) -> bool:
    """Whether `value` nests more than `limit` arrays and objects (a scalar nests none)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:  # iterative: what is walked came from the peer
        container, depth = stack.pop()
        if not isinstance(container, dict | list):
            continue
        if depth > limit:
            return True
        items = container.values() if isinstance(container, dict) else container
        # A long array of scalars (an index-object chunk, a Buffer array) is passed over by one
        # C-level scan of its types rather than a Python loop over its items.
        if _SCALARS.issuperset(map(type, items)):
            continue
        stack.extend((item, depth + 1) for item in items if isinstance(item, dict | list))
    return False


def encode_envelope(env: Envelope) -> bytes:
    """UTF-8 JSON text of `env`, keys in the order the TS router writes them.

    Raises `TypeError` when a payload holds something JSON cannot carry (a `Secret` included:
    orjson refuses unknown types instead of calling `str()` on them).
    """
    obj: dict[str, Any] = {"method": env.method, "request": env.request, "response": env.response}
    if env.correlation is not None:
        obj["correlation"] = {"id": env.correlation.id, "phase": env.correlation.phase}
    if env.error is not None:
        obj["error"] = {"text": env.error.text, "data": env.error.data}
    if env.retry is not None:
        obj["retry"] = {"waitForMs": env.retry.wait_for_ms, "reason": env.retry.reason}
    if env.is_reply:
        obj["localData"] = None
    try:
        return orjson.dumps(obj, default=_revive)
    except orjson.JSONEncodeError as exc:
        raise TypeError(f"a {env.method} frame is not JSON-serialisable: {exc}") from exc


def encode_reply(env: Envelope) -> bytes:
    """`encode_envelope` of a reply, with `request: null` when the echoed request does not
    encode: a reply always reaches the caller. Raises `TypeError` only when the rest (our
    response) is no JSON."""
    try:
        return encode_envelope(env)
    except TypeError:
        if env.request is None:
            raise
    return encode_envelope(replace(env, request=None))


def reply(env: Envelope, response: Any) -> Envelope:
    """The reply to request `env`: same envelope, `response` set, phase `"response"`.

    The echoed request has its stream markers replaced by `OMITTED_MARKER`.
    """
    assert env.correlation is not None
    return replace(
        env,
        request=omit_markers(env.request),
        response=response,
        correlation=Correlation(env.correlation.id, "response"),
        error=None,
        retry=None,
        is_reply=True,
    )


def error_reply(env: Envelope, text: str, data: Mapping[str, Any]) -> Envelope:
    """The error reply to request `env`: `response` null, `error {text, data}`, never `retry`."""
    return replace(reply(env, None), error=ErrorInfo(text, dict(data)))


def retry_reply(env: Envelope, wait_for_ms: float, reason: str) -> Envelope:
    """The answer asking the caller of request `env` to send it again after `wait_for_ms`.

    `response` null and no `error`: a typedrequest caller that sees `retry` without `error`
    waits and resends the identical request (wire.md §1.4); with both it would crash.
    """
    return replace(reply(env, None), retry=RetryAdvice(wait_for_ms, reason))


def _revive(value: Any) -> Any:
    # Chunk JSON written by encode_chunk is spliced in as it is. A `RawChunk` (peer text cut
    # out by parse_frame, unchecked) is refused like any other non-JSON value.
    if isinstance(value, EncodedChunk):
        return value.to_json()
    raise TypeError(f"Type is not JSON serializable: {type(value).__name__}")


def _correlation(value: Any) -> Correlation | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise RemoteProtocolError("envelope.correlation is not an object")
    corr_id, phase = value.get("id"), value.get("phase")
    if not isinstance(corr_id, str) or not corr_id:
        raise RemoteProtocolError("envelope.correlation.id is not a non-empty string")
    if not isinstance(phase, str):
        raise RemoteProtocolError("envelope.correlation.phase is not a string")
    return Correlation(corr_id, phase)


def _error(value: Any) -> ErrorInfo | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("text"), str):
        raise RemoteProtocolError("envelope.error is not an object with a string text")
    return ErrorInfo(value["text"], value.get("data"))


def _retry(value: Any) -> RetryAdvice | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise RemoteProtocolError("envelope.retry is not an object")
    wait, reason = value.get("waitForMs"), value.get("reason", "")
    if isinstance(wait, bool) or not isinstance(wait, int | float) or not math.isfinite(wait):
        raise RemoteProtocolError("envelope.retry.waitForMs is not a number")
    if wait < 0:
        raise RemoteProtocolError("envelope.retry.waitForMs is negative")
    if not isinstance(reason, str):
        raise RemoteProtocolError("envelope.retry.reason is not a string")
    return RetryAdvice(float(wait), reason)
