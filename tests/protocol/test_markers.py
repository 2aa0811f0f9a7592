"""Stream markers inside payloads (wire.md §4.1)."""

from __future__ import annotations

from typing import Any

from agent.protocol.markers import OMITTED_MARKER, find_stream_ids, marker, omit_markers


def test_markers_are_found_at_any_depth_and_in_arrays() -> None:
    """Every marker is found, in document order, whatever the nesting."""
    payload = {"a": marker("s1"), "b": [{"c": marker("s2")}, [marker("s3")]], "d": 1}
    assert find_stream_ids(payload) == ["s1", "s2", "s3"]


def test_near_markers_are_not_markers() -> None:
    """A non-true flag or a missing/empty id is plain data."""
    payload = [
        {"_isVirtualStream": "true", "streamId": "s"},
        {"_isVirtualStream": True},
        {"_isVirtualStream": True, "streamId": ""},
    ]
    assert find_stream_ids(payload) == []


def test_omit_markers_replaces_each_marker_and_keeps_the_rest() -> None:
    """Markers become OMITTED_MARKER; other values stay as they were."""
    out = omit_markers({"a": [marker("s1"), 2], "b": "x"})
    assert out == {"a": [OMITTED_MARKER, 2], "b": "x"}


def test_omit_markers_returns_payloads_without_markers_unchanged() -> None:
    """A payload without markers is returned as is (no copy)."""
    payload = {"a": [1, {"b": 2}]}
    assert omit_markers(payload) is payload


def test_deeply_nested_payload_does_not_hit_the_recursion_limit() -> None:
    """find_stream_ids walks 100 000 levels without recursion."""
    payload: Any = marker("deep")
    for _ in range(100_000):
        payload = [payload]
    assert find_stream_ids(payload) == ["deep"]


def test_omitting_markers_walks_100000_levels_without_recursion() -> None:
    """omit_markers copies a payload nested 100 000 deep (it used to hit RecursionError at
    about 1,000), the marker at the bottom replaced."""
    payload: Any = marker("deep")
    for _ in range(100_000):
        payload = {"a": [payload, 1]}
    out = omit_markers(payload)
    for _ in range(100_000):
        assert out["a"][1] == 1
        out = out["a"][0]
    assert out == OMITTED_MARKER
