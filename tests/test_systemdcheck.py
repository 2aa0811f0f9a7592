"""The pure parts of the checks under a real systemd (devstack/systemdcheck; the checks
themselves need a booted machine: scripts/test-systemd): reading the README's install steps,
editing the installed config, reading what systemctl and journalctl print."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from agent.config import load_config
from devstack.systemdcheck.checks import CHECKS
from devstack.systemdcheck.lifecycle import _same_line
from devstack.systemdcheck.node import _leftovers
from devstack.systemdcheck.readme import install_steps, set_keys, sh_blocks
from devstack.systemdcheck.service import TEST_NODE_KEYS
from devstack.systemdcheck.systemd import JournalEntry, parse_timespan
from devstack.systemdcheck.topology import SECOND_PROPERTIES, second_config

REPO = Path(__file__).resolve().parent.parent


def test_the_readme_install_block_is_five_numbered_steps() -> None:
    """readme.md's install block cuts into steps 1 to 5: the wheel first, the unit last."""
    steps = install_steps((REPO / "readme.md").read_text())
    assert [step.number for step in steps] == [1, 2, 3, 4, 5]
    assert "--require-hashes --no-deps -r locks/build.txt" in steps[0].script
    assert "pip wheel --no-deps --no-build-isolation" in steps[0].script
    assert "--require-hashes --no-deps -r locks/runtime.txt" in steps[1].script
    assert "pip install --no-deps dist/" in steps[1].script
    assert "pip check" in steps[1].script
    assert "sudo restore-agent check-config --connect" in steps[3].script
    # Checked as the unit runs: its dynamic user, its credential, its state directory, by the
    # command step 2 puts on the PATH (systemd/restore-agent runs check-config so).
    assert "systemd/restore-agent /usr/local/bin/restore-agent" in steps[1].script
    wrapper = (REPO / "systemd" / "restore-agent").read_text()
    for property_ in ("DynamicUser=yes", "LoadCredential=machine-token:", "StateDirectory="):
        assert f"-p {property_}" in wrapper
    assert "systemctl enable --now restore-agent" in steps[4].script


def test_each_step_holds_its_lines_and_nothing_of_the_next() -> None:
    """A step runs from its `# N.` line to the next one."""
    readme = "intro\n## Install on a node\n\n```sh\n# 1. One:\necho a\n# 2. Two\necho b\n```\n"
    one, two = install_steps(readme)
    assert (one.number, one.title, one.script) == (1, "One:", "# 1. One:\necho a\n")
    assert (two.number, two.title, two.script) == (2, "Two", "# 2. Two\necho b\n")


def test_a_readme_without_the_install_section_is_refused() -> None:
    """No section, no steps: the check cannot silently run nothing."""
    with pytest.raises(ValueError, match="no '## Install on a node' section"):
        install_steps("# readme\n## Usage\n")


def test_an_install_block_that_starts_without_a_step_number_is_refused() -> None:
    """Commands before `# 1.` would belong to no step."""
    with pytest.raises(ValueError, match="does not start with a numbered step"):
        install_steps("## Install on a node\n```sh\necho stray\n# 1. One\n```\n")


def test_set_keys_changes_the_key_of_its_section_only() -> None:
    """The same key name in another section stays as it was."""
    text = "[a]\nx = 1\n# x = 9\n[b]\nx = 2\ny = 3\n"
    assert set_keys(text, {("b", "x"): "20"}) == "[a]\nx = 1\n# x = 9\n[b]\nx = 20\ny = 3\n"


def test_set_keys_refuses_a_key_the_text_does_not_set() -> None:
    """A commented-out key is not set: the edit would silently miss."""
    with pytest.raises(ValueError, match=r"\[a\] x is not set"):
        set_keys("[a]\n# x = 1\n", {("a", "x"): "2"})


def test_the_test_nodes_edit_of_the_example_config_loads(tmp_path: Path) -> None:
    """config.example.toml as the README installs it, edited as the checks edit it, is a
    configuration the agent accepts, with the health endpoint on the unit's socket."""
    edits = {("cloudly", "url"): '"http://127.0.0.1:4711"', **TEST_NODE_KEYS}
    path = tmp_path / "config.toml"
    path.write_text(set_keys((REPO / "config.example.toml").read_text(), edits))
    config = load_config(path)
    assert config.cloudly.url == "http://127.0.0.1:4711"
    assert str(config.health.endpoint) == "unix:/run/restore-agent/health.sock"
    assert config.shutdown.drain_timeout_s == 5.0


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30.0),
        ("1min 30s", 90.0),
        ("500ms", 0.5),
        ("5min", 300.0),
        ("1h 2min", 3720.0),
        ("0", 0.0),
    ],
)
def test_a_systemd_time_span_reads_as_seconds(text: str, seconds: float) -> None:
    """`systemctl show` spans (WatchdogUSec=30s, TimeoutStopUSec=1min 30s, 0 when off) in
    seconds."""
    assert parse_timespan(text) == seconds


@pytest.mark.parametrize("text", ["infinity", "", "30", "30s later"])
def test_anything_else_is_not_a_time_span(text: str) -> None:
    """No partial reads: an unexpected form is an error, not a wrong deadline."""
    with pytest.raises(ValueError, match="not a time span"):
        parse_timespan(text)


def test_a_journal_entry_reads_a_message_given_as_bytes() -> None:
    """journalctl -o json writes a MESSAGE that is not UTF-8 as a list of byte values."""
    record = {"MESSAGE": list(b"caf\xc3\xa9 \xff"), "PRIORITY": "4", "_PID": "7"}
    entry = JournalEntry.from_json(record)
    assert (entry.message, entry.priority, entry.pid) == ("café \ufffd", 4, 7)


def test_an_agent_record_is_its_json_line_and_nothing_else() -> None:
    """The agent's JSON log lines parse; systemd's own lines about the unit do not."""
    line = json.dumps({"event": "cloudly_session_lost", "level": "warning"})
    assert JournalEntry(line, 4, 7, "restore-agent").agent_record() == {
        "event": "cloudly_session_lost",
        "level": "warning",
    }
    assert JournalEntry("Started restore-agent.service.", 6, 1, "systemd").agent_record() is None
    assert JournalEntry("{not json", 6, 7, "restore-agent").agent_record() is None


def test_the_fatal_line_matches_as_text_or_as_a_record_but_for_its_time() -> None:
    """The line the agent printed outside the unit is the one in the journal."""
    assert _same_line("restore-agent: config x: bad", "restore-agent: config x: bad")
    assert not _same_line("restore-agent: config x: bad", "restore-agent: config y: bad")
    one = json.dumps({"event": "config_error", "timestamp": "t1", "key": "x"})
    other = json.dumps({"event": "config_error", "timestamp": "t2", "key": "x"})
    assert _same_line(one, other)
    assert not _same_line(one, json.dumps({"event": "config_error", "key": "y"}))


def test_every_check_has_one_name_and_the_reboot_comes_last() -> None:
    """The host script counts the checks by name; the reboot ends the run."""
    names = [name for name, _, _ in CHECKS]
    assert len(names) == len(set(names)) == 25
    assert names[0] == "install"
    assert names[-1] == "reboot"


def test_docs_list_every_check_in_the_order_they_run() -> None:
    """docs/operations.md, "Tested under a real systemd": one row per check, as the table."""
    text = (REPO / "docs" / "operations.md").read_text()
    section = text.split("## Tested under a real systemd", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([a-z0-9-]+)` \|", section, re.MULTILINE)
    assert rows == [name for name, _, _ in CHECKS]


def test_the_topology_check_runs_while_the_unit_is_still_enabled_and_running() -> None:
    """It needs the installed unit running and ready; `runbooks` (the duplicate-agent page's
    fix disables it) comes after it."""
    names = [name for name, _, _ in CHECKS]
    assert names.index("journal-warning") < names.index("topology") < names.index("runbooks")


def test_the_second_agent_differs_from_the_installed_one_only_where_another_node_would(
    tmp_path: Path,
) -> None:
    """Its config loads, with a state directory and a health socket of its own and the same
    Cloudly and token file; it runs as the unit runs its agent (the unit file's lines), with
    directories of its own."""
    edits = {("cloudly", "url"): '"http://127.0.0.1:4711"', **TEST_NODE_KEYS}
    installed = set_keys((REPO / "config.example.toml").read_text(), edits)
    (tmp_path / "installed.toml").write_text(installed)
    (tmp_path / "second.toml").write_text(second_config(installed))
    one, two = load_config(tmp_path / "installed.toml"), load_config(tmp_path / "second.toml")
    assert (two.cloudly.url, two.cloudly.token_file) == (one.cloudly.url, one.cloudly.token_file)
    assert two.cloudly.recipient_check_s == one.cloudly.recipient_check_s
    assert two.state.directory != one.state.directory
    assert str(two.health.endpoint) == "unix:/run/restore-agent-second/health.sock"
    assert str(two.state.directory) == "/var/lib/restore-agent-second"
    unit = (REPO / "systemd" / "restore-agent.service").read_text().splitlines()
    for line in SECOND_PROPERTIES:
        key, _, value = line.partition("=")
        if key in ("StateDirectory", "RuntimeDirectory"):
            assert f"{key}=restore-agent" in unit
            assert value == "restore-agent-second"
        else:
            assert line in unit


def test_what_the_relay_keeps_on_corestore_is_no_leftover_of_a_restore(tmp_path: Path) -> None:
    """After an isolated restore's cleanup, only its own files count as left behind: the
    service data, the archive and the relay's key records (imports, archive restores, the
    journal of applied effects) stay by design."""
    kept = [
        "services/svc/database",
        "archive/svc/b1/record.json",
        "imports/closure-1/meta.json",
        "restores/svc/restore-1.json",
        "applied.jsonl",
    ]
    for name in [*kept, "staging-archives/sa-1/objects/a.bin"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    assert _leftovers(tmp_path) == ["staging-archives/sa-1/objects/a.bin"]


def test_a_sections_shell_blocks_end_at_the_next_heading_of_its_level() -> None:
    """A shell comment inside a block (`# 1. ...`) is no heading."""
    text = "## A\n```sh\n# 1. a step\none\n```\n### A.1\n```sh\ntwo\n```\n## B\n```sh\nthree\n```\n"
    assert sh_blocks(text, "## A") == ["# 1. a step\none\n", "two\n"]
    assert sh_blocks(text, "### A.1") == ["two\n"]


def test_the_runbooks_and_day_two_pages_the_checks_run_have_their_blocks() -> None:
    """The systemd checks run these blocks as written: each section has them."""
    text = (REPO / "docs" / "operations.md").read_text()
    assert "sudo restore-agent status" in sh_blocks(text, "### Runbooks")[0]
    assert (
        "sudo restore-agent rotate-key"
        in sh_blocks(text, "### Rotating credentials, and in which order")[0]
    )
    assert "$NEW_MACHINE_TOKEN" in sh_blocks(text, "### Rotating the machine token")[0]
    upgrade = sh_blocks(text, "## Upgrading and rolling back")
    assert any("--force-reinstall" in block for block in upgrade)
    assert any("sudo restore-agent state rollback" in block for block in upgrade)
