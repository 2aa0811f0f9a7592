"""VirtualStream markers inside payloads (wire.md §4.1).

A stream travels inside a request or response as `{"_isVirtualStream": true, "streamId": ...}`
at any depth, arrays included. A reply echoes its request with every marker under `.request`
replaced by the `_OBMITTED_VIRTUAL_STREAM` object (spelling as on the wire), so the echo does
not announce the stream a second time.
"""

from __future__ import annotations

from typing import Any

__all__ = ["OMITTED_MARKER", "find_stream_ids", "is_marker", "marker", "omit_markers"]

OMITTED_MARKER: dict[str, Any] = {
    "_OBMITTED_VIRTUAL_STREAM": True,
    "reason": "path is under .request: obmitted for deduplication reasons in response cycle.",
}


def marker(stream_id: str) -> dict[str, Any]:
    """The wire form of stream `stream_id`."""
    return {"_isVirtualStream": True, "streamId": stream_id}


def is_marker(value: Any) -> bool:
    """Whether `value` is a stream marker (a true flag and a non-empty string id)."""
    return (
        isinstance(value, dict)
        and value.get("_isVirtualStream") is True
        and isinstance(value.get("streamId"), str)
        and bool(value["streamId"])
    )


def find_stream_ids(payload: Any) -> list[str]:
    """Stream ids of every marker in `payload`, depth first, in document order."""
    found: list[str] = []
    stack = [payload]
    while stack:  # iterative: a hostile payload nested 10^5 deep must not hit the recursion limit
        value = stack.pop()
        if isinstance(value, dict):
            if is_marker(value):
                found.append(value["streamId"])
            else:
                stack.extend(reversed(list(value.values())))
        elif isinstance(value, list):
            stack.extend(reversed(value))
    return found


def omit_markers(payload: Any) -> Any:
    """`payload` with every marker replaced by `OMITTED_MARKER`; unchanged objects are shared."""
    if not find_stream_ids(payload):
        return payload
    return _omit(payload)


def _omit(payload: Any) -> Any:
    # Iterative, like find_stream_ids: the copy is built top down, each container is created
    # empty and filled when its turn comes, so no nesting depth reaches the recursion limit.
    def copy(value: Any) -> Any:
        if isinstance(value, dict):
            if is_marker(value):
                return dict(OMITTED_MARKER)
            out: dict[str, Any] = {}
            work.append((value, out))
            return out
        if isinstance(value, list):
            items: list[Any] = []
            work.append((value, items))
            return items
        return value

    work: list[tuple[dict[str, Any] | list[Any], dict[str, Any] | list[Any]]] = []
    root = copy(payload)
    while work:
        source, target = work.pop()
        if isinstance(source, dict):
            assert isinstance(target, dict)
            for key, item in source.items():
                target[key] = copy(item)
        else:
            assert isinstance(target, list)
            target.extend(copy(item) for item in source)
    return root
