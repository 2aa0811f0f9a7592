"""The sections build the parts' settings, and read each default from the part it tunes."""

from __future__ import annotations

import pytest

from agent.config import CorestoreConfig, StateConfig, StreamsConfig
from agent.config.fields import part_default
from agent.retry import RetryPolicy
from agent.session.settings import SessionSettings
from agent.store.retention import DAY_S


def test_part_default_reads_a_plain_default() -> None:
    """A field with a default gives that default."""
    assert part_default(SessionSettings, "ping_interval", float) == 10.0


def test_part_default_refuses_a_field_without_a_default_of_the_kind() -> None:
    """A required field (or one of another type) is a TypeError, not a silent default."""
    with pytest.raises(TypeError, match="url"):
        part_default(SessionSettings, "url", str)


def test_retries_default_to_the_clients_policy() -> None:
    """Left out, `retries` makes the Corestore clients' default number of attempts."""
    assert CorestoreConfig().retry_policy().attempts == RetryPolicy().attempts


def test_retry_policy_takes_retries_and_outage_tolerance() -> None:
    """`retries` sends after the first, riding out `outage_tolerance_s`."""
    policy = CorestoreConfig(retries=5, outage_tolerance_s=7.0).retry_policy()
    assert (policy.attempts, policy.tolerance) == (6, 7.0)


def test_retention_settings_take_the_days() -> None:
    """`retention_days` becomes the store's maximum age."""
    assert StateConfig(retention_days=2).retention_settings().max_age_s == 2 * DAY_S


def test_stream_settings_take_the_streams_section() -> None:
    """The window, its bytes, the idle timeout and the chunk form reach every stream."""
    section = StreamsConfig(
        window=3, window_bytes=2 * 2**20, idle_timeout_s=4.0, chunk_form="base64"
    )
    streams = section.stream_settings()
    assert (streams.window, streams.window_bytes, streams.idle_timeout, streams.chunk_form) == (
        3,
        2 * 2**20,
        4.0,
        "base64",
    )
