"""Specification of `agent.config`: loading, validation messages, secret files."""

from __future__ import annotations

import os
import secrets
import tomllib
from pathlib import Path

import pytest
from pydantic import BaseModel, ValidationError

from agent.config import (
    CloudlyConfig,
    Config,
    CorestoreConfig,
    HealthConfig,
    LogConfig,
    MemoryConfig,
    ShutdownConfig,
    StateConfig,
    StreamsConfig,
    load_config,
    load_secrets,
    read_secret_file,
    websocket_url,
)
from agent.errors import ConfigError
from agent.protocol.settings import ConnectionSettings
from agent.secret import Secret

MiB = 1024 * 1024
EXAMPLE = Path(__file__).resolve().parents[1] / "config.example.toml"

MINIMAL = """\
[cloudly]
url = "https://cloudly.example.com"
token_file = "machine-token"

[corestore]
credential_source = "file"
credential_file = "corestore-credential"
"""


def write_config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "config.toml"
    path.write_text(text, encoding="utf-8")
    return path


def write_secret(path: Path, content: str | bytes, mode: int = 0o600) -> Path:
    data = content.encode() if isinstance(content, str) else content
    path.write_bytes(data)
    path.chmod(mode)
    return path


def config_error(tmp_path: Path, text: str) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        load_config(write_config(tmp_path, text))
    return caught.value


# --- loading a good file ------------------------------------------------------------------------


def test_minimal_file_gets_every_default(tmp_path: Path) -> None:
    """A file with only the required keys gets the documented defaults."""
    config = load_config(write_config(tmp_path, MINIMAL))
    assert config.cloudly.max_frame_bytes == 16 * 1024 * 1024
    assert config.cloudly.compression is False
    assert (config.cloudly.call_timeout_s, config.cloudly.ping_interval_s) == (30.0, 10.0)
    assert config.cloudly.ping_timeout_s == 30.0
    assert (config.cloudly.backoff_base_s, config.cloudly.backoff_cap_s) == (1.0, 60.0)
    assert config.cloudly.stable_after_s == 60.0
    assert config.cloudly.identity_renew_margin_s == 300.0
    assert config.cloudly.tag_name == "restore-agent"
    assert config.cloudly.tag_payload == {}
    assert config.cloudly.ca_file is None
    assert config.corestore.chunk_size == 4 * 1024 * 1024
    assert (config.corestore.max_in_flight, config.corestore.retries) == (4, 3)
    assert (config.corestore.connect_timeout_s, config.corestore.request_timeout_s) == (5.0, 60.0)
    assert config.corestore.transfer_timeout_s == 300.0
    assert config.corestore.restore_poll_interval_s == 1.0
    assert config.state.directory == Path("/var/lib/restore-agent")
    assert config.state.retention_days == 30
    assert (config.streams.window, config.streams.idle_timeout_s) == (16, 10.0)
    assert config.streams.window_bytes == 8 * 1024 * 1024
    assert config.streams.chunk_form == "buffer"
    assert (config.shutdown.drain_timeout_s, config.shutdown.close_timeout_s) == (20.0, 5.0)
    assert (config.log.format, config.log.level) == ("auto", "info")


def test_relative_paths_resolve_against_the_config_directory(tmp_path: Path) -> None:
    """`token_file = "machine-token"` means the file beside the config file."""
    config = load_config(write_config(tmp_path, MINIMAL + '[state]\ndirectory = "state"\n'))
    assert config.cloudly.token_file == tmp_path / "machine-token"
    assert config.corestore.credential_file == tmp_path / "corestore-credential"
    assert config.state.directory == tmp_path / "state"


def test_absolute_paths_are_kept(tmp_path: Path) -> None:
    """An absolute path is used as written."""
    text = MINIMAL.replace('"machine-token"', '"/run/credentials/x/token"')
    config = load_config(write_config(tmp_path, text))
    assert config.cloudly.token_file == Path("/run/credentials/x/token")


@pytest.mark.parametrize(
    ("url", "dialled"),
    [
        ("http://127.0.0.1:8080/", "ws://127.0.0.1:8080/"),
        ("https://cloudly.example.com/typedrequest", "wss://cloudly.example.com/typedrequest"),
        ("ws://localhost:9000", "ws://localhost:9000"),
        ("wss://cloudly.example.com:443/x?y=1", "wss://cloudly.example.com:443/x?y=1"),
    ],
)
def test_websocket_url_maps_http_to_ws(tmp_path: Path, url: str, dialled: str) -> None:
    """http(s) becomes ws(s); ws(s) and the rest of the URL are kept."""
    config = load_config(
        write_config(tmp_path, MINIMAL.replace("https://cloudly.example.com", url))
    )
    assert config.websocket_url == dialled
    assert config.cloudly.url == url


@pytest.mark.parametrize(
    "url",
    ["http://cloudly.example.com", "ws://cloudly.example.com/x", "http://10.0.0.5:8080"],
)
def test_cleartext_to_a_remote_host_is_refused(tmp_path: Path, url: str) -> None:
    """http:// or ws:// to a host that is not loopback would carry the machine token in clear:
    refused under cloudly.url, naming the key that allows it."""
    error = config_error(tmp_path, MINIMAL.replace("https://cloudly.example.com", url))
    assert error.key == "cloudly.url"
    assert "not loopback, would send the machine token and every request unencrypted" in str(error)
    assert "cloudly.allow_cleartext = true" in str(error)


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8080", "ws://127.0.0.2", "http://[::1]:80", "ws://LOCALHOST"]
)
def test_cleartext_to_loopback_needs_no_permission(tmp_path: Path, url: str) -> None:
    """A loopback Cloudly (a stand-in, a local tunnel) may be cleartext; it is not flagged."""
    config = load_config(
        write_config(tmp_path, MINIMAL.replace("https://cloudly.example.com", url))
    )
    assert not config.cloudly.cleartext_allowed


def test_allow_cleartext_lets_the_operator_mean_it(tmp_path: Path) -> None:
    """With cloudly.allow_cleartext = true a remote http:// URL loads, flagged for the
    start-up warning."""
    text = MINIMAL.replace("https://cloudly.example.com", "http://cloudly.example.com")
    config = load_config(
        write_config(tmp_path, text.replace("[cloudly]", "[cloudly]\nallow_cleartext = true"))
    )
    assert config.websocket_url == "ws://cloudly.example.com"
    assert config.cloudly.cleartext_allowed


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
def test_the_session_dials_the_same_mapping(given: str, expected: str) -> None:
    """`websocket_url`, which the session dials: http(s) becomes ws(s); ws(s) stays as it is."""
    assert websocket_url(given) == expected


@pytest.mark.parametrize("given", ["ftp://cloudly.example", "cloudly.example", "https://"])
def test_other_urls_are_a_config_error(given: str) -> None:
    """A URL that is no http(s)/ws(s) URL is refused naming the config key."""
    with pytest.raises(ConfigError, match=r"cloudly\.url"):
        websocket_url(given)


def test_tag_payload_is_passed_on_verbatim(tmp_path: Path) -> None:
    """The tag payload table arrives as the nested JSON-ready value it was written as."""
    text = MINIMAL.replace(
        "[corestore]",
        '[cloudly.tag_payload]\nrole = "restore"\nlimits = [1, 2.5, true, { deep = "x" }]\n\n'
        "[corestore]",
    )
    config = load_config(write_config(tmp_path, text))
    assert config.cloudly.tag_payload == {
        "role": "restore",
        "limits": [1, 2.5, True, {"deep": "x"}],
    }


def test_integers_are_accepted_for_seconds(tmp_path: Path) -> None:
    """`call_timeout_s = 12` is 12.0 seconds."""
    text = MINIMAL.replace('token_file = "machine-token"', 'token_file = "t"\ncall_timeout_s = 12')
    assert load_config(write_config(tmp_path, text)).cloudly.call_timeout_s == 12.0


def test_corestore_transfer_timeout_and_poll_interval_are_read(tmp_path: Path) -> None:
    """`transfer_timeout_s` and `restore_poll_interval_s` are taken as written (integers too)."""
    text = MINIMAL + "transfer_timeout_s = 900\nrestore_poll_interval_s = 0.05\n"
    corestore = load_config(write_config(tmp_path, text)).corestore
    assert (corestore.transfer_timeout_s, corestore.restore_poll_interval_s) == (900.0, 0.05)


def test_the_per_node_transfer_limits_default_to_two_places_and_no_rate(tmp_path: Path) -> None:
    """Left out: two transfers per node at once, no byte rate."""
    corestore = load_config(write_config(tmp_path, MINIMAL)).corestore
    assert (corestore.max_transfers_per_node, corestore.max_bytes_per_s_per_node) == (2, None)


def test_the_per_node_transfer_limits_are_read(tmp_path: Path) -> None:
    """`max_transfers_per_node` and `max_bytes_per_s_per_node` are taken as written."""
    text = MINIMAL + "max_transfers_per_node = 4\nmax_bytes_per_s_per_node = 52428800\n"
    corestore = load_config(write_config(tmp_path, text)).corestore
    assert (corestore.max_transfers_per_node, corestore.max_bytes_per_s_per_node) == (4, 52428800)


def test_the_receive_budget_defaults_to_the_protocols_and_is_bounded(tmp_path: Path) -> None:
    """`[streams] receive_budget_bytes`: 4 MiB when left out, the protocol's default; below
    1 MiB is refused naming the key."""
    config = load_config(write_config(tmp_path, MINIMAL))
    assert config.streams.receive_budget_bytes == ConnectionSettings().receive_budget == 4 * MiB
    text = MINIMAL + "[streams]\nreceive_budget_bytes = 1000\n"
    with pytest.raises(ConfigError) as caught:
        load_config(write_config(tmp_path, text))
    assert str(caught.value) == (
        "config streams.receive_budget_bytes: must be >= 1048576, got 1000"
    )


def test_config_is_frozen(tmp_path: Path) -> None:
    """A loaded configuration cannot be changed."""
    config = load_config(write_config(tmp_path, MINIMAL))
    with pytest.raises(ValidationError):
        config.cloudly.call_timeout_s = 1.0  # type: ignore[misc]


def test_the_byte_budget_defaults_to_64_mib(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path, MINIMAL))
    assert config.memory.budget_bytes == 64 * MiB


def test_a_byte_budget_too_small_for_one_frame_or_a_few_chunks_is_refused(
    tmp_path: Path,
) -> None:
    """The budget must hold a frame as large as the session accepts (twice, with its decoded
    bytes) and four Corestore chunks: else a transfer could never move."""
    error = config_error(tmp_path, MINIMAL + "\n[memory]\nbudget_bytes = 25165824\n")
    assert error.key == "memory.budget_bytes"
    assert "twice cloudly.max_frame_bytes" in str(error)
    fits = MINIMAL.replace(
        'token_file = "machine-token"', 'token_file = "machine-token"\nmax_frame_bytes = 4194304'
    )
    config = load_config(write_config(tmp_path, fits + "\n[memory]\nbudget_bytes = 16777216\n"))
    assert config.memory.budget_bytes == 16 * MiB


# --- the example file ---------------------------------------------------------------------------

SECTIONS: dict[str, type[BaseModel]] = {
    "cloudly": CloudlyConfig,
    "corestore": CorestoreConfig,
    "state": StateConfig,
    "streams": StreamsConfig,
    "memory": MemoryConfig,
    "shutdown": ShutdownConfig,
    "log": LogConfig,
    "health": HealthConfig,
}


def test_example_file_is_valid() -> None:
    """config.example.toml loads without error."""
    assert isinstance(load_config(EXAMPLE), Config)


def test_example_file_documents_every_key() -> None:
    """Every key of every section appears in the example, set or commented out."""
    text = EXAMPLE.read_text(encoding="utf-8")
    data = tomllib.loads(text)
    assert set(data) == set(SECTIONS)
    for section, model in SECTIONS.items():
        for key in model.model_fields:
            written = key in data[section]
            commented = f"# {key} = " in text
            assert written or commented, f"{section}.{key} is not in config.example.toml"


def test_example_file_shows_the_defaults() -> None:
    """Every optional key in the example is set to its default value."""
    example = load_config(EXAMPLE)
    for section, model in SECTIONS.items():
        loaded = getattr(example, section)
        for key, field in model.model_fields.items():
            if not field.is_required():
                assert getattr(loaded, key) == field.get_default(call_default_factory=True), (
                    f"{section}.{key} in config.example.toml is not its default"
                )


# --- refusing a bad file ------------------------------------------------------------------------


def test_missing_file_is_refused(tmp_path: Path) -> None:
    """A missing config file is a ConfigError that names the path."""
    with pytest.raises(ConfigError, match="no such file") as caught:
        load_config(tmp_path / "absent.toml")
    assert str(tmp_path / "absent.toml") in str(caught.value)


def test_directory_is_refused(tmp_path: Path) -> None:
    """A directory given as the config file is refused."""
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path)


def test_unreadable_file_is_refused(tmp_path: Path) -> None:
    """A config path the OS cannot open is refused with the OS's reason."""
    path = write_config(tmp_path, MINIMAL) / "config.toml"
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value) == f"config: {path}: cannot be read (Not a directory)"


def test_invalid_toml_is_refused(tmp_path: Path) -> None:
    """A file that is not TOML is refused with the parser's position."""
    error = config_error(tmp_path, "[cloudly\nurl = 1\n")
    assert "is not valid TOML" in str(error)
    assert "line 1" in str(error)


def test_non_utf8_file_is_refused(tmp_path: Path) -> None:
    """A file that is not UTF-8 is refused."""
    path = tmp_path / "config.toml"
    path.write_bytes(b'[cloudly]\nurl = "\xff"\n')
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(path)


REFUSALS = [
    # (what to replace in MINIMAL or append, the one message expected)
    (("url =", "urll ="), "config cloudly.urll: unknown key"),
    (("", "[extra]\nx = 1\n"), "config extra: unknown section"),
    (('url = "https://cloudly.example.com"\n', ""), "config cloudly.url: required key is missing"),
    (
        ("[corestore]\ncredential_source", "[other]\ncredential_source"),
        "config other: unknown section",
    ),
    (
        ('token_file = "machine-token"', 'token_file = "t"\ncall_timeout_s = "30"'),
        "config cloudly.call_timeout_s: expected a number, got a string",
    ),
    (
        ('token_file = "machine-token"', 'token_file = "t"\ncompression = "yes"'),
        "config cloudly.compression: expected true or false, got a string",
    ),
    (
        ('credential_file = "corestore-credential"', 'credential_file = "c"\nretries = true'),
        "config corestore.retries: expected an integer, got a boolean",
    ),
    (
        ('token_file = "machine-token"', 'token_file = "t"\nmax_frame_bytes = 2097152.0'),
        "config cloudly.max_frame_bytes: expected an integer, got a float",
    ),
    (
        ('token_file = "machine-token"', "token_file = 7"),
        "config cloudly.token_file: expected a path (string), got an integer",
    ),
    (
        ('token_file = "machine-token"', 'token_file = "t"\nmax_frame_bytes = 1024'),
        "config cloudly.max_frame_bytes: must be >= 1048576, got 1024",
    ),
    (
        ('token_file = "machine-token"', 'token_file = "t"\nmax_frame_bytes = 268435457'),
        "config cloudly.max_frame_bytes: must be <= 268435456, got 268435457",
    ),
    (
        ('credential_file = "corestore-credential"', 'credential_file = "c"\nchunk_size = 65535'),
        "config corestore.chunk_size: must be >= 65536, got 65535",
    ),
    (
        ('credential_file = "corestore-credential"', 'credential_file = "c"\nmax_in_flight = 33'),
        "config corestore.max_in_flight: must be <= 32, got 33",
    ),
    (
        (
            'credential_file = "corestore-credential"',
            'credential_file = "c"\nmax_transfers_per_node = 0',
        ),
        "config corestore.max_transfers_per_node: must be >= 1, got 0",
    ),
    (
        (
            'credential_file = "corestore-credential"',
            'credential_file = "c"\nmax_transfers_per_node = 65',
        ),
        "config corestore.max_transfers_per_node: must be <= 64, got 65",
    ),
    (
        (
            'credential_file = "corestore-credential"',
            'credential_file = "c"\nmax_bytes_per_s_per_node = 1000',
        ),
        "config corestore.max_bytes_per_s_per_node: must be >= 1048576, got 1000",
    ),
    (
        ('credential_file = "corestore-credential"', 'credential_file = "c"\nretries = 11'),
        "config corestore.retries: must be <= 10, got 11",
    ),
    (
        (
            'credential_file = "corestore-credential"',
            'credential_file = "c"\ntransfer_timeout_s = 0',
        ),
        "config corestore.transfer_timeout_s: must be > 0, got 0",
    ),
    (
        (
            'credential_file = "corestore-credential"',
            'credential_file = "c"\ntransfer_timeout_s = 86401',
        ),
        "config corestore.transfer_timeout_s: must be <= 86400, got 86401",
    ),
    (
        (
            'credential_file = "corestore-credential"',
            'credential_file = "c"\nrestore_poll_interval_s = 0.001',
        ),
        "config corestore.restore_poll_interval_s: must be >= 0.01, got 0.001",
    ),
    (
        (
            'credential_file = "corestore-credential"',
            'credential_file = "c"\nrestore_poll_interval_s = 61',
        ),
        "config corestore.restore_poll_interval_s: must be <= 60, got 61",
    ),
    (
        (
            'credential_file = "corestore-credential"',
            'credential_file = "c"\nrestore_poll_interval_s = "1"',
        ),
        "config corestore.restore_poll_interval_s: expected a number, got a string",
    ),
    (("", "[streams]\nwindow = 0\n"), "config streams.window: must be >= 1, got 0"),
    (
        ("", "[streams]\nkeepalive_timeout_s = 10.0\n"),
        "config streams.keepalive_timeout_s: renamed to streams.idle_timeout_s (same meaning)",
    ),
    (
        ("", "[streams]\nwindow_bytes = 1000\n"),
        "config streams.window_bytes: must be >= 1048576, got 1000",
    ),
    (
        ("", '[streams]\nchunk_form = "hex"\n'),
        "config streams.chunk_form: must be 'buffer' or 'base64'",
    ),
    (("", '[log]\nformat = "xml"\n'), "config log.format: must be 'auto', 'json' or 'console'"),
    (
        ("", "[shutdown]\ndrain_timeout_s = 0\n"),
        "config shutdown.drain_timeout_s: must be > 0, got 0",
    ),
    (
        ("", "[shutdown]\nclose_timeout_s = nan\n"),
        "config shutdown.close_timeout_s: must be a finite number, got nan",
    ),
    (
        ("", "[shutdown]\nclose_timeout_s = 86401\n"),
        "config shutdown.close_timeout_s: must be <= 86400, got 86401",
    ),
    (
        ("", "[state]\nretention_days = 0\n"),
        "config state.retention_days: must be >= 1, got 0",
    ),
    (
        ("", "[state]\nretention_days = 3651\n"),
        "config state.retention_days: must be <= 3650, got 3651",
    ),
    (
        ("https://", "ftp://"),
        "config cloudly.url: must start with http://, https://, ws:// or wss://",
    ),
    (("https://cloudly.example.com", "https://"), "config cloudly.url: names no host"),
    (
        ("https://cloudly.example.com", "https://h:99999"),
        "config cloudly.url: is not a valid URL (Port out of range 0-65535)",
    ),
    (
        ("https://cloudly.example.com", "https://user:hunter22@cloudly.example.com"),
        "config cloudly.url: must not carry credentials; the machine token goes in token_file",
    ),
    (
        (
            'token_file = "machine-token"',
            'token_file = "t"\nbackoff_base_s = 10\nbackoff_cap_s = 5',
        ),
        "config cloudly.backoff_cap_s: must be >= backoff_base_s (10), got 5",
    ),
    (
        ("https://cloudly.example.com", "https://cloudly.example.com/#x"),
        "config cloudly.url: must not have a #fragment",
    ),
    (
        ("[corestore]", "[cloudly.tag_payload]\nlimits = [1, inf]\n[corestore]"),
        "config cloudly.tag_payload: holds inf at limits[1], which JSON cannot carry",
    ),
    (
        ('token_file = "machine-token"', 'token_file = ""'),
        "config cloudly.token_file: must not be empty",
    ),
    (
        ('token_file = "machine-token"', 'token_file = "t"\ntag_name = ""'),
        "config cloudly.tag_name: must not be empty",
    ),
    (
        ("[corestore]", "[cloudly.tag_payload]\nwhen = { at = 2024-01-01T00:00:00Z }\n[corestore]"),
        "config cloudly.tag_payload: holds a TOML date/time at when.at, which JSON cannot carry",
    ),
]


@pytest.mark.parametrize(("edit", "message"), REFUSALS)
def test_bad_value_is_refused_with_one_message_naming_the_key(
    tmp_path: Path, edit: tuple[str, str], message: str
) -> None:
    """Each way a key can be wrong is one ConfigError naming the dotted key and the reason."""
    old, new = edit
    text = MINIMAL.replace(old, new, 1) if old else MINIMAL + new
    assert text != MINIMAL
    assert str(config_error(tmp_path, text)) == message


def test_missing_section_is_named(tmp_path: Path) -> None:
    """A config without [cloudly] names the section."""
    text = "[corestore]" + MINIMAL.split("[corestore]")[1]
    assert str(config_error(tmp_path, text)) == "config cloudly: required section is missing"


# --- where the Corestore credential comes from ---------------------------------------------------


@pytest.mark.parametrize(
    "corestore",
    ["", "[corestore]\nretries = 2\n", '[corestore]\ncredential_source = "sealed"\n'],
    ids=["no section", "no key", "explicit"],
)
def test_a_config_naming_no_credential_source_gets_the_sealed_path(
    tmp_path: Path, corestore: str
) -> None:
    """Production configs name no source: each node's credential is sealed by Cloudly, and no
    Corestore credential file is read."""
    text = MINIMAL.split("[corestore]")[0] + corestore
    config = load_config(write_config(tmp_path, text))
    assert (config.corestore.credential_source, config.corestore.credential_file) == (
        "sealed",
        None,
    )
    write_secret(tmp_path / "machine-token", "token-value\n")
    assert load_secrets(config).corestore_credential is None
    assert load_secrets(config).all() == (Secret("token-value"),)


@pytest.mark.parametrize(
    ("corestore", "message"),
    [
        (
            '[corestore]\ncredential_file = "c"\n',
            'config corestore.credential_file: is only used with credential_source = "file" '
            '(the default "sealed" fetches each node\'s credential from Cloudly)',
        ),
        (
            '[corestore]\ncredential_source = "file"\n',
            'config corestore.credential_file: is required with credential_source = "file"',
        ),
        (
            '[corestore]\ncredential_source = "environment"\n',
            "config corestore.credential_source: must be 'sealed' or 'file'",
        ),
    ],
    ids=["file without the file source", "file source without a file", "unknown source"],
)
def test_a_credential_source_and_file_that_disagree_are_refused(
    tmp_path: Path, corestore: str, message: str
) -> None:
    """`credential_file` belongs to the file source alone, and the file source needs one."""
    text = MINIMAL.split("[corestore]")[0] + corestore
    assert str(config_error(tmp_path, text)) == message


def test_section_that_is_not_a_table_is_refused(tmp_path: Path) -> None:
    """`log = 3` is refused as not a table."""
    error = config_error(tmp_path, "log = 3\n" + MINIMAL)
    assert str(error) == "config log: expected a table, got an integer"


def test_key_error_carries_key_and_reason_separately(tmp_path: Path) -> None:
    """ConfigError exposes the dotted key and the reason for callers."""
    error = config_error(tmp_path, MINIMAL + "[streams]\nwindow = 300\n")
    assert (error.key, error.reason) == ("streams.window", "must be <= 256, got 300")


def test_refusal_never_echoes_a_string_value(tmp_path: Path) -> None:
    """A string in the wrong place (maybe a pasted secret) is not quoted in the message."""
    pasted = "s3cr3t-" + secrets.token_hex(8)
    text = MINIMAL.replace(
        'token_file = "machine-token"', f'token_file = "t"\nping_timeout_s = "{pasted}"'
    )
    error = config_error(tmp_path, text)
    assert pasted not in str(error)
    text = MINIMAL.replace("https://cloudly.example.com", f"https://u:{pasted}@cloudly.example.com")
    assert pasted not in str(config_error(tmp_path, text))


# --- secret files -------------------------------------------------------------------------------


def test_secret_file_strips_one_trailing_newline(tmp_path: Path) -> None:
    """`token\\n` reads as `token`."""
    secret = read_secret_file(write_secret(tmp_path / "t", "tok-123456789\n"), "cloudly.token_file")
    assert isinstance(secret, Secret)
    assert secret.reveal() == "tok-123456789"


def test_secret_file_strips_a_trailing_crlf(tmp_path: Path) -> None:
    """A file saved with a CRLF line ending reads without it."""
    secret = read_secret_file(write_secret(tmp_path / "t", "tok-123456789\r\n"), "k")
    assert secret.reveal() == "tok-123456789"


def test_secret_file_without_newline_is_read_as_is(tmp_path: Path) -> None:
    """A file without a trailing newline is read whole."""
    assert read_secret_file(write_secret(tmp_path / "t", "abc"), "k").reveal() == "abc"


def test_owner_read_only_secret_file_is_accepted(tmp_path: Path) -> None:
    """Mode 0400 (how systemd provides credentials) is accepted."""
    assert read_secret_file(write_secret(tmp_path / "t", "abc\n", 0o400), "k").reveal() == "abc"


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("", "is empty"),
        ("\n", "is empty"),
        ("abc\n\n", "must hold a single line"),
        ("abc\ndef\n", "must hold a single line"),
        (" abc\n", "has leading or trailing whitespace"),
        ("abc \n", "has leading or trailing whitespace"),
        (b"\xff\xfe\n", "is not UTF-8 text"),
        ("x" * (64 * 1024 + 1), "is larger than 64 KiB"),
    ],
)
def test_bad_secret_content_is_refused(tmp_path: Path, content: str | bytes, reason: str) -> None:
    """Empty, multi-line, padded, binary or huge secret files are refused, naming the key."""
    path = write_secret(tmp_path / "t", content)
    with pytest.raises(ConfigError) as caught:
        read_secret_file(path, "corestore.credential_file")
    assert caught.value.key == "corestore.credential_file"
    assert str(caught.value) == f"config corestore.credential_file: {path}: {reason}"


def test_secret_content_is_not_quoted_in_the_refusal(tmp_path: Path) -> None:
    """A refused secret file's content never appears in the error."""
    value = secrets.token_hex(16)
    path = write_secret(tmp_path / "t", f"{value}\nsecond line\n")
    with pytest.raises(ConfigError) as caught:
        read_secret_file(path, "cloudly.token_file")
    assert value not in str(caught.value)


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o660, 0o610, 0o601])
def test_secret_file_others_may_access_is_refused(tmp_path: Path, mode: int) -> None:
    """Any group or other permission bit on a secret file is refused, naming key and mode."""
    path = write_secret(tmp_path / "t", "abc\n", mode)
    with pytest.raises(ConfigError) as caught:
        read_secret_file(path, "cloudly.token_file")
    assert str(caught.value) == (
        f"config cloudly.token_file: {path}: group or others have access (mode {mode:04o}); "
        "use 0600 or 0400"
    )


def test_missing_secret_file_is_refused(tmp_path: Path) -> None:
    """A missing secret file is refused, naming the key and the path."""
    with pytest.raises(ConfigError) as caught:
        read_secret_file(tmp_path / "absent", "cloudly.token_file")
    assert str(caught.value) == f"config cloudly.token_file: {tmp_path / 'absent'}: no such file"


def test_unopenable_secret_file_is_refused(tmp_path: Path) -> None:
    """A secret path the OS cannot open is refused with the OS's reason."""
    path = write_secret(tmp_path / "t", "abc") / "below-a-file"
    with pytest.raises(ConfigError) as caught:
        read_secret_file(path, "k")
    assert str(caught.value) == f"config k: {path}: cannot be read (Not a directory)"


def test_directory_as_secret_file_is_refused(tmp_path: Path) -> None:
    """A directory is not a secret file."""
    directory = tmp_path / "d"
    directory.mkdir(mode=0o700)
    with pytest.raises(ConfigError, match="is not a regular file"):
        read_secret_file(directory, "k")


def test_fifo_as_secret_file_is_refused_without_blocking(tmp_path: Path) -> None:
    """A named pipe is refused at once instead of waiting for a writer."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(ConfigError, match="is not a regular file"):
        read_secret_file(fifo, "k")


def test_load_secrets_reads_both_files(tmp_path: Path) -> None:
    """load_secrets returns the machine token and the Corestore credential."""
    write_secret(tmp_path / "machine-token", "token-value\n")
    write_secret(tmp_path / "corestore-credential", "credential-value\n")
    loaded = load_secrets(load_config(write_config(tmp_path, MINIMAL)))
    assert loaded.machine_token.reveal() == "token-value"
    assert loaded.corestore_credential.reveal() == "credential-value"


def test_load_secrets_names_the_failing_key(tmp_path: Path) -> None:
    """A bad Corestore credential file is reported under corestore.credential_file."""
    write_secret(tmp_path / "machine-token", "token-value\n")
    write_secret(tmp_path / "corestore-credential", "credential-value\n", 0o644)
    with pytest.raises(ConfigError) as caught:
        load_secrets(load_config(write_config(tmp_path, MINIMAL)))
    assert caught.value.key == "corestore.credential_file"


# --- [health] ------------------------------------------------------------------------------------


def test_the_health_endpoint_defaults_to_a_loopback_port(tmp_path: Path) -> None:
    """Without [health] the endpoint listens on 127.0.0.1:9733."""
    config = load_config(write_config(tmp_path, MINIMAL))
    assert str(config.health.endpoint) == "127.0.0.1:9733"
    assert config.health.max_loop_lag_s == 2.0


@pytest.mark.parametrize(
    ("listen", "shown"),
    [
        ("127.0.0.1:0", "127.0.0.1:0"),
        ("127.0.0.53:9100", "127.0.0.53:9100"),
        ("[::1]:9733", "[::1]:9733"),
        ("unix:/run/restore-agent/health.sock", "unix:/run/restore-agent/health.sock"),
    ],
)
def test_loopback_addresses_and_unix_sockets_are_accepted(
    tmp_path: Path, listen: str, shown: str
) -> None:
    """Any 127.0.0.0/8 address, ::1, or an absolute unix socket path."""
    config = load_config(write_config(tmp_path, MINIMAL + f'[health]\nlisten = "{listen}"\n'))
    assert str(config.health.endpoint) == shown


@pytest.mark.parametrize(
    ("listen", "reason"),
    [
        ("0.0.0.0:9733", "must be a loopback address (127.0.0.0/8 or ::1): nothing else listens"),
        ("10.1.2.3:9733", "must be a loopback address (127.0.0.0/8 or ::1): nothing else listens"),
        ("[::]:9733", "must be a loopback address (127.0.0.0/8 or ::1): nothing else listens"),
        ("localhost:9733", "the host must be an IP address (127.0.0.1 or ::1), not a name"),
        ("127.0.0.1", "must be HOST:PORT (a loopback IP and a port) or unix:/PATH"),
        ("127.0.0.1:70000", "must be HOST:PORT (a loopback IP and a port) or unix:/PATH"),
        ("unix:health.sock", "a unix socket must be an absolute path (unix:/run/...)"),
    ],
)
def test_anything_but_loopback_is_refused(tmp_path: Path, listen: str, reason: str) -> None:
    """The health endpoint is the agent's only listener: it never listens beyond the host."""
    error = config_error(tmp_path, MINIMAL + f'[health]\nlisten = "{listen}"\n')
    assert str(error) == f"config health.listen: {reason}"


def test_the_metrics_listener_is_off_unless_named(tmp_path: Path) -> None:
    assert load_config(write_config(tmp_path, MINIMAL)).health.metrics_endpoint is None


def test_the_metrics_listener_takes_the_nodes_address(tmp_path: Path) -> None:
    """`metrics_listen` serves /metrics alone, on an address Prometheus reaches: not loopback."""
    text = MINIMAL + '[health]\nmetrics_listen = "10.1.2.3:9734"\n'
    assert str(load_config(write_config(tmp_path, text)).health.metrics_endpoint) == "10.1.2.3:9734"


@pytest.mark.parametrize(
    ("listen", "reason"),
    [
        ("unix:/run/metrics.sock", "must be HOST:PORT (the node's IP address and a port)"),
        ("node-1:9734", "the host must be an IP address (the node's, e.g. 10.0.0.5), not a name"),
        ("10.1.2.3", "must be HOST:PORT (the node's IP address and a port)"),
    ],
)
def test_a_metrics_listener_that_is_no_ip_and_port_is_refused(
    tmp_path: Path, listen: str, reason: str
) -> None:
    error = config_error(tmp_path, MINIMAL + f'[health]\nmetrics_listen = "{listen}"\n')
    assert str(error) == f"config health.metrics_listen: {reason}"


# --- secrets as systemd credentials --------------------------------------------------------------


CREDENTIALS = MINIMAL.replace('"machine-token"', '"${CREDENTIALS_DIRECTORY}/machine-token"')


def test_a_credential_is_read_from_the_directory_systemd_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`${CREDENTIALS_DIRECTORY}/NAME` is NAME in $CREDENTIALS_DIRECTORY (LoadCredential=)."""
    credentials = tmp_path / "credentials"
    credentials.mkdir()
    write_secret(credentials / "machine-token", "token-from-systemd-0123\n")
    write_secret(tmp_path / "corestore-credential", "corestore-cred\n")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(credentials))
    config = load_config(write_config(tmp_path, CREDENTIALS))
    assert str(config.cloudly.token_file) == "${CREDENTIALS_DIRECTORY}/machine-token"
    assert load_secrets(config).machine_token.reveal() == "token-from-systemd-0123"


def test_a_credential_without_credentials_directory_names_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Started outside its unit: a ConfigError naming the key and what to do."""
    monkeypatch.delenv("CREDENTIALS_DIRECTORY", raising=False)
    config = load_config(write_config(tmp_path, CREDENTIALS))
    with pytest.raises(ConfigError) as caught:
        load_secrets(config)
    assert str(caught.value) == (
        "config cloudly.token_file: ${CREDENTIALS_DIRECTORY}/machine-token: "
        "$CREDENTIALS_DIRECTORY is not set (start the agent from its systemd unit, which sets "
        "it with LoadCredential=, or name a file)"
    )


@pytest.mark.parametrize(
    ("token_file", "reason"),
    [
        (
            "${CREDENTIALS_DIRECTORY}/a/b",
            "must be ${CREDENTIALS_DIRECTORY}/NAME, one credential name",
        ),
        (
            "${CREDENTIALS_DIRECTORY}/..",
            "must be ${CREDENTIALS_DIRECTORY}/NAME, one credential name",
        ),
        ("${HOME}/token", "may name no variable but ${CREDENTIALS_DIRECTORY}, as its first part"),
    ],
)
def test_other_variables_and_nested_credential_names_are_refused(
    tmp_path: Path, token_file: str, reason: str
) -> None:
    """Only the one variable, only as the first part, followed by exactly one name."""
    text = MINIMAL.replace('"machine-token"', f'"{token_file}"')
    assert str(config_error(tmp_path, text)) == f"config cloudly.token_file: {reason}"
