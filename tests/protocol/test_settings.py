"""The protocol's knobs: one class per scope, and a setting no stream could run with refused."""

from __future__ import annotations

from typing import Any

import pytest

from agent.errors import InvalidState
from agent.protocol.settings import ConnectionSettings, StreamSettings


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"window": 0}, "window must be at least 1"),
        ({"window_bytes": 0}, "window_bytes must be positive"),
        ({"inline_decode_max": -1}, "inline_decode_max not negative"),
        ({"chunk_form": "hex"}, "unknown chunk_form 'hex'"),
    ],
)
def test_stream_settings_no_stream_could_use_are_refused(
    changes: dict[str, Any], problem: str
) -> None:
    """A window of nothing, a negative decode bound, an unknown chunk form: `InvalidState`."""
    with pytest.raises(InvalidState, match=problem):
        StreamSettings(**changes)


def test_a_connection_must_handle_at_least_one_request() -> None:
    """`max_concurrent_requests` below 1 would refuse every request: `InvalidState`."""
    with pytest.raises(InvalidState, match="max_concurrent_requests"):
        ConnectionSettings(max_concurrent_requests=0)


def test_a_connection_holds_the_settings_its_streams_share() -> None:
    """The defaults are written once: a connection's streams get `StreamSettings()`."""
    assert ConnectionSettings().streams == StreamSettings()
