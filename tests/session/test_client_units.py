"""The session's pure helpers: Cloudly URL mapping, TLS context choice, identity renewal time."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from agent.errors import AuthenticationFailed, ConfigError
from agent.session.client import renew_delay, tls_context, websocket_url


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("http://cloudly.example:8080", "ws://cloudly.example:8080"),
        ("https://cloudly.example/", "wss://cloudly.example/"),
        ("HTTPS://cloudly.example", "wss://cloudly.example"),
        ("ws://127.0.0.1:1", "ws://127.0.0.1:1"),
        ("wss://cloudly.example/socket", "wss://cloudly.example/socket"),
    ],
)
def test_http_urls_map_to_websocket_urls(given: str, expected: str) -> None:
    """http(s) becomes ws(s); ws(s) stays as it is."""
    assert websocket_url(given) == expected


@pytest.mark.parametrize("given", ["ftp://cloudly.example", "cloudly.example", "https://"])
def test_other_urls_are_a_config_error(given: str) -> None:
    """A URL that is no http(s)/ws(s) URL is refused naming the config key."""
    with pytest.raises(ConfigError, match=r"cloudly\.websocket_url"):
        websocket_url(given)


def test_plain_websocket_needs_no_tls() -> None:
    """ws:// gets no TLS context."""
    assert tls_context("ws://127.0.0.1:1", None) is None


def test_secure_websocket_verifies_certificates_and_hostnames() -> None:
    """wss:// gets a context that verifies the chain and the host name."""
    context = tls_context("wss://cloudly.example", None)
    assert context is not None
    assert context.verify_mode is ssl.CERT_REQUIRED
    assert context.check_hostname is True


def test_unreadable_ca_file_is_a_config_error(tmp_path: Path) -> None:
    """A configured CA file that cannot be loaded stops start-up naming `cloudly.ca_file`."""
    with pytest.raises(ConfigError, match=r"cloudly\.ca_file"):
        tls_context("wss://cloudly.example", tmp_path / "missing.pem")


def test_renewal_happens_the_margin_before_expiry() -> None:
    """An identity valid for an hour is renewed `margin` seconds before it expires."""
    assert renew_delay(expires_at_ms=1_000_000 + 3_600_000, now=1_000.0, margin_s=300.0) == 3300.0


def test_short_lived_identity_is_renewed_at_half_life() -> None:
    """An identity living shorter than the margin is renewed half-way, not at once."""
    assert renew_delay(expires_at_ms=1_060_000, now=1_000.0, margin_s=300.0) == 30.0


def test_identity_issued_already_expired_is_an_authentication_failure() -> None:
    """An identity whose expiry lies in the past cannot be used: AuthenticationFailed."""
    with pytest.raises(AuthenticationFailed, match="already expired"):
        renew_delay(expires_at_ms=999_000, now=1_000.0, margin_s=300.0)
