"""Exact replay: how a retried request is told apart from a stale one.

Every mutating isolated-restore request carries `expectedRevision`. When it is the current
revision the request proceeds. When it is not, the request is refused with `RevisionConflict`
— unless it is an *exact replay* of the request whose handling produced the current state: then
the agent answers the current state and does nothing again. That is what makes a retry after a
lost answer safe (Cloudly cannot tell "not done" from "done, answer lost").

"Exact" is a digest. `request_digest(method, body)` is the SHA-256 (lower-case hex) of the
canonical JSON of `{"method": method, "request": body}` where the body:

- loses its top-level `restoreGrant`. The grant is re-signed by Cloudly for every call (a retry
  carries a fresh one with a new expiry and signature), so including it would make no retry
  exact; and the digest is persisted, and a grant must never be (not even as a hash that would
  pin one grant to one restore in the state database). Authority is checked per call by
  Corestore against the grant that came with that call, not by the replay rule.
- keeps each VirtualStream marker (`{"_isVirtualStream": true, "streamId": ...}`, at any depth)
  but loses its `streamId`: the id is random per stream and a replayed stage necessarily opens a
  fresh stream. The object descriptor next to it (`path`, `size`, `sha256`) already names the
  bytes exactly.
- keeps everything else, `expectedRevision` included, so a digest names one request at one base
  revision and can match only a genuine retry.

Canonical JSON here: keys sorted by code point, no insignificant whitespace, UTF-8 without
escaping non-ASCII, no NaN/Infinity. It is the agent's private form (the digest never leaves the
agent), so it need not match Cloudly's canonicalisation. Pass the validated request's wire dump
(`model.to_wire()`), so that equivalent encodings hash alike. A value JSON cannot represent (a
`Secret` anywhere but `restoreGrant`, bytes, a set) is a bug in the caller: `TypeError`.

The stored digest belongs to the last *request* that mutated the state; the engine's own progress
writes that follow it (`preparing -> prepared`, `restoring -> verifying -> ready`, ...) keep it.
So a replay of `execute` answered after the restore finished gets the finished state, and a
request that is not the latest one never matches (its digest was replaced).
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Mapping
from typing import Any, Final

from agent.errors import RevisionConflict

__all__ = [
    "GRANT_FIELD",
    "Verdict",
    "canonical_json",
    "check_expected_revision",
    "request_digest",
]

GRANT_FIELD: Final = "restoreGrant"
_MARKER_FLAG: Final = "_isVirtualStream"
_STREAM_ID: Final = "streamId"
_KEEP: Final = object()  # no key is dropped


class Verdict(enum.Enum):
    """What to do with a request after the revision check."""

    PROCEED = "proceed"
    """`expectedRevision` is current: decide the transition and do the work."""
    REPLAY = "replay"
    """An exact replay of the latest request: answer the current state, do nothing."""


def canonical_json(value: Any) -> bytes:
    """`value` as canonical UTF-8 JSON (sorted keys, no whitespace); `TypeError` if not JSON."""
    return json.dumps(
        value,
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    ).encode("utf-8")


def _without_stream_ids(payload: Any) -> Any:
    # Iterative (the body came from the peer): each container is made empty and filled when its
    # turn comes, so no nesting depth reaches the recursion limit.
    work: list[tuple[Any, dict[Any, Any] | list[Any], object]] = []

    def copy(value: Any) -> Any:
        if isinstance(value, Mapping):
            out: dict[Any, Any] = {}
            work.append((value, out, _STREAM_ID if value.get(_MARKER_FLAG) is True else _KEEP))
            return out
        if isinstance(value, list | tuple):
            items: list[Any] = []
            work.append((value, items, _KEEP))
            return items
        return value

    root = copy(payload)
    while work:
        source, target, dropped = work.pop()
        if isinstance(target, dict):
            target.update((k, copy(v)) for k, v in source.items() if k != dropped)
        else:
            target.extend(copy(item) for item in source)
    return root


def request_digest(method: str, body: Mapping[str, Any]) -> str:
    """SHA-256 hex of the canonical request without its grant and without stream ids."""
    stripped = {key: value for key, value in body.items() if key != GRANT_FIELD}
    canonical = canonical_json({"method": method, "request": _without_stream_ids(stripped)})
    return hashlib.sha256(canonical).hexdigest()


def check_expected_revision(
    *,
    expected: int,
    current: int,
    status: str | None,
    last_digest: str | None,
    digest: str,
) -> Verdict:
    """PROCEED when `expected` is current, REPLAY for an exact replay, else `RevisionConflict`.

    `current`/`status`/`last_digest` describe the stored state (0/None/None when absent);
    `digest` is `request_digest()` of the incoming request.
    """
    if expected == current:
        return Verdict.PROCEED
    if last_digest is not None and digest == last_digest:
        return Verdict.REPLAY
    raise RevisionConflict(expected=expected, current=current, status=status)
