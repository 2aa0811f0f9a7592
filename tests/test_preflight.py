"""Specification of `agent.preflight`: the checks `run` and `check-config` share."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from agent.config import Config
from agent.errors import ConfigError
from agent.preflight import check, tls_context


def _config(tmp_path: Path, url: str = "wss://cloudly.example.com", **cloudly: str) -> Config:
    token = tmp_path / "token"
    token.write_text("preflight-machine-token-0f1e\n")
    token.chmod(0o600)
    return Config.model_validate(
        {
            "cloudly": {"url": url, "token_file": str(token), **cloudly},
            "state": {"directory": str(tmp_path / "state")},
        },
        context={"base_dir": tmp_path},
    )


def test_a_good_configuration_passes_and_yields_its_secrets_and_tls(tmp_path: Path) -> None:
    """Everything passes: the token is read once, the wss:// context verifies."""
    checked = check(_config(tmp_path))
    assert checked.secrets is not None
    assert checked.secrets.machine_token.reveal() == "preflight-machine-token-0f1e"
    assert isinstance(checked.tls, ssl.SSLContext)
    assert checked.tls.verify_mode is ssl.CERT_REQUIRED


def test_a_loopback_ws_url_needs_no_tls_context(tmp_path: Path) -> None:
    """ws:// to loopback: no TLS context, and a CA file is not read."""
    config = _config(tmp_path, url="ws://127.0.0.1:9000", ca_file="absent.pem")
    assert tls_context(config) is None


@pytest.mark.parametrize(
    ("content", "reason"),
    [(None, "no such file"), ("not a certificate\n", "holds no usable PEM CA certificate")],
)
def test_an_unusable_ca_file_is_refused(tmp_path: Path, content: str | None, reason: str) -> None:
    """A CA file that is missing or holds no certificate names cloudly.ca_file."""
    if content is not None:
        (tmp_path / "ca.pem").write_text(content)
    with pytest.raises(ConfigError, match=rf"config cloudly\.ca_file: .*ca\.pem: {reason}"):
        check(_config(tmp_path, ca_file="ca.pem"))


def test_a_ca_directory_is_refused(tmp_path: Path) -> None:
    """A directory named as the CA file is refused as such."""
    (tmp_path / "ca.pem").mkdir()
    with pytest.raises(ConfigError, match="is a directory, not a file"):
        check(_config(tmp_path, ca_file="ca.pem"))


def test_a_ca_credential_is_left_unread_without_the_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`check-config` outside the unit: a CA file named as a systemd credential is not read
    (nor refused), as the secrets are not."""
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    config = _config(tmp_path, ca_file="${CREDENTIALS_DIRECTORY}/cloudly-ca")
    checked = check(config, read_secrets=False)
    assert (checked.secrets, checked.tls) == (None, None)
