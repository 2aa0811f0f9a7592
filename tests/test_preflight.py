"""Specification of `agent.startup.preflight`: the checks `run` and `check-config` share."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest

from agent.config import Config, ShutdownConfig
from agent.errors import ConfigError
from agent.startup.preflight import check, shutdown_budget, tls_context


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


def test_a_ca_credential_is_refused_without_the_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Outside the unit a CA file named as a systemd credential cannot be read: refused, as
    `run` refuses it (there is no check that only one of the two commands makes)."""
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    config = _config(tmp_path, ca_file="${CREDENTIALS_DIRECTORY}/cloudly-ca")
    with pytest.raises(ConfigError, match=r"cloudly\.ca_file: .*CREDENTIALS_DIRECTORY is not set"):
        check(config)


def test_a_token_credential_is_refused_without_the_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The machine token named as a credential, $CREDENTIALS_DIRECTORY unset: the line `run`
    stops with."""
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    config = _config(tmp_path, token_file="${CREDENTIALS_DIRECTORY}/machine-token")
    with pytest.raises(
        ConfigError, match=r"cloudly\.token_file: .*CREDENTIALS_DIRECTORY is not set"
    ):
        check(config)


def test_a_ca_file_without_a_certificate_says_so_in_words(tmp_path: Path) -> None:
    """A CA file with a BEGIN CERTIFICATE block that does not decode: OpenSSL gives no reason
    code, and the line says what is wrong instead of `(None)`."""
    (tmp_path / "ca.pem").write_text(
        "-----BEGIN CERTIFICATE-----\nabc\n-----END CERTIFICATE-----\n"
    )
    with pytest.raises(ConfigError) as caught:
        check(_config(tmp_path, ca_file="ca.pem"))
    assert "(None)" not in str(caught.value)
    assert str(caught.value).endswith(
        "holds no usable PEM CA certificate (a certificate block that does not decode as PEM)"
    )


def test_a_shutdown_that_does_not_fit_the_units_stop_timeout_is_refused(tmp_path: Path) -> None:
    """drain_timeout_s = 200 with close_timeout_s = 60: systemd's TimeoutStopSec=90 would kill
    the agent mid-drain; refused naming the sum and the unit's timeout."""
    config = _config(tmp_path).model_copy(
        update={
            "shutdown": ShutdownConfig(drain_timeout_s=200, close_timeout_s=60),
        }
    )
    with pytest.raises(ConfigError) as caught:
        check(config)
    text = str(caught.value)
    assert text.startswith("config shutdown.drain_timeout_s: a stop may take 567 s")
    assert "not below shutdown.stop_timeout_s 90 (the unit's TimeoutStopSec=)" in text


def test_the_default_shutdown_fits_with_room(tmp_path: Path) -> None:
    """The defaults: 20 + 1 s of drain plus six steps of 5 + 1 s, 57 s, below 90."""
    assert shutdown_budget(_config(tmp_path)) == 57


def test_a_budget_that_reaches_the_stop_timeout_is_refused(tmp_path: Path) -> None:
    """Equal is not below: systemd's kill and the last step would race. The drain is a step
    with its second of grace like the close steps (agent/entry/app.py): 53 + 1 s of drain and six
    steps of 5 + 1 s take 90 s."""
    config = _config(tmp_path).model_copy(
        update={"shutdown": ShutdownConfig(drain_timeout_s=53, close_timeout_s=5)}
    )
    with pytest.raises(ConfigError, match="a stop may take 90 s"):
        shutdown_budget(config)


def test_an_open_state_directory_is_named_as_tightened(tmp_path: Path) -> None:
    """A state directory of mode 0777 and a database of 0644 pass, and the check says that
    start-up makes them 0700 and 0600 (`run` did so quietly)."""
    state = tmp_path / "state"
    state.mkdir()
    state.chmod(0o777)
    (state / "state.sqlite3").write_bytes(b"")
    (state / "state.sqlite3").chmod(0o644)
    checked = check(_config(tmp_path))
    assert checked.tightens == (
        f"state.directory {state}: mode 0777, start-up makes it 0700",
        f"the state database {state / 'state.sqlite3'}: mode 0644, start-up makes it 0600",
    )


def test_a_private_state_directory_tightens_nothing(tmp_path: Path) -> None:
    """0700 and no database yet: nothing to say."""
    (tmp_path / "state").mkdir(mode=0o700)
    assert check(_config(tmp_path)).tightens == ()
