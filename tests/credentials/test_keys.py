"""The recipient key in the state directory: made once (0600, atomically), read back the same,
never printed, rotated only on purpose, one agent per directory."""

from __future__ import annotations

import copy
import json
import os
import pickle
import stat
from pathlib import Path

import pytest

from agent.credentials import keys
from agent.credentials.keys import (
    ENROLLMENT_FILE,
    KEY_FILE,
    EnrollmentRecord,
    KeyStore,
    RecipientKey,
    rotate_key,
)
from agent.errors import ConfigError


def _record(store: KeyStore, cluster: str = "cluster-1", expires_at: int | None = None) -> None:
    store.save_enrollment(
        EnrollmentRecord(cluster, "recipient-1", store.key.public_key, expires_at, 1_000)
    )


def _private_bytes(key: RecipientKey) -> bytes:
    return key.private_key.private_bytes_raw()


def test_the_first_start_creates_a_private_key_file(tmp_path: Path) -> None:
    """32 raw bytes, mode 0600, in a 0700 directory; no temporary file left behind."""
    state = tmp_path / "state"
    store = KeyStore.open(state)
    store.close()
    path = state / KEY_FILE
    assert path.read_bytes() == _private_bytes(store.key)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    assert sorted(p.name for p in state.iterdir()) == [KEY_FILE, keys.LOCK_FILE]


def test_a_restart_reads_back_the_same_key_and_enrollment(tmp_path: Path) -> None:
    """The key and the recorded enrollment survive a restart unchanged."""
    first = KeyStore.open(tmp_path)
    _record(first)
    first.close()
    second = KeyStore.open(tmp_path)
    second.close()
    assert _private_bytes(second.key) == _private_bytes(first.key)
    assert second.enrollment == first.enrollment
    assert second.enrollment is not None
    assert second.enrollment.recipient_id == "recipient-1"


def test_a_new_key_forgets_an_enrollment_left_from_an_older_one(tmp_path: Path) -> None:
    """The key file was removed by hand: the new key starts without an enrollment."""
    store = KeyStore.open(tmp_path)
    _record(store)
    store.close()
    (tmp_path / KEY_FILE).unlink()
    fresh = KeyStore.open(tmp_path)
    fresh.close()
    assert fresh.enrollment is None
    assert not (tmp_path / ENROLLMENT_FILE).exists()


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660])
def test_a_key_others_may_read_stops_start_up(tmp_path: Path, mode: int) -> None:
    """A key group or others can read may have been read: refused, and the fix named."""
    KeyStore.open(tmp_path).close()
    (tmp_path / KEY_FILE).chmod(mode)
    with pytest.raises(ConfigError, match="rotate-key") as caught:
        KeyStore.open(tmp_path)
    assert caught.value.key == "state.directory"
    assert f"mode {mode:04o}" in str(caught.value)


def test_a_key_file_of_the_wrong_size_stops_start_up(tmp_path: Path) -> None:
    """A truncated key is no key; the bytes are not quoted."""
    path = tmp_path / KEY_FILE
    path.write_bytes(b"k" * 31)
    path.chmod(0o600)
    with pytest.raises(ConfigError, match="is not a 32-byte X25519 private key") as caught:
        KeyStore.open(tmp_path)
    assert "kkkk" not in str(caught.value)


def test_a_symlinked_key_is_refused(tmp_path: Path) -> None:
    """The key is read without following a symlink (it could point anywhere)."""
    target = tmp_path / "elsewhere"
    target.write_bytes(bytes(32))
    target.chmod(0o600)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / KEY_FILE).symlink_to(target)
    with pytest.raises(ConfigError, match="cannot be read"):
        KeyStore.open(state)


def test_a_crash_while_writing_leaves_the_old_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rotation that fails before the rename keeps the old key and leaves no temporary file."""
    store = KeyStore.open(tmp_path)
    store.close()
    old = (tmp_path / KEY_FILE).read_bytes()

    def crash(source: object, target: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(keys.os, "replace", crash)
    with pytest.raises(OSError, match="disk full"):
        rotate_key(tmp_path)
    assert (tmp_path / KEY_FILE).read_bytes() == old
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_one_agent_per_state_directory(tmp_path: Path) -> None:
    """While one agent holds the directory, a second one (or rotate-key) is refused; after it
    closes, the directory is free again."""
    store = KeyStore.open(tmp_path)
    with pytest.raises(ConfigError, match="another restore-agent uses this state directory"):
        KeyStore.open(tmp_path)
    with pytest.raises(ConfigError, match="stop it first"):
        rotate_key(tmp_path)
    store.close()
    KeyStore.open(tmp_path).close()


def test_rotation_makes_a_new_key_and_forgets_the_enrollment(tmp_path: Path) -> None:
    """rotate-key: a different key on disk, no enrollment record; the next start reads it."""
    store = KeyStore.open(tmp_path)
    _record(store)
    store.close()
    rotated = rotate_key(tmp_path)
    assert rotated.public_key != store.key.public_key
    assert not (tmp_path / ENROLLMENT_FILE).exists()
    reopened = KeyStore.open(tmp_path)
    reopened.close()
    assert reopened.key.public_key == rotated.public_key
    assert reopened.enrollment is None
    assert stat.S_IMODE((tmp_path / KEY_FILE).stat().st_mode) == 0o600


def test_the_key_prints_as_its_public_half_and_cannot_be_pickled(tmp_path: Path) -> None:
    """repr/str/format show the public key only; pickling refuses; copies are the same object."""
    store = KeyStore.open(tmp_path)
    store.close()
    key = store.key
    private = _private_bytes(key)
    shown = f"{key} {key!r} {[key]}"
    assert shown.count(f"RecipientKey(public={key.public_key})") == 3
    for form in (private.hex(), repr(private), keys.b64url(private)):
        assert form not in shown
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(key)
    assert copy.copy(key) is key
    assert copy.deepcopy(key) is key


@pytest.mark.parametrize(
    "content",
    [b"not json", b"[]", b'{"clusterId": "c"}', json.dumps({"x": 1}).encode(), b"\xff"],
)
def test_an_unreadable_enrollment_record_only_means_enrolling_again(
    tmp_path: Path, content: bytes
) -> None:
    """A damaged record is treated as absent (enrolling again is always safe)."""
    KeyStore.open(tmp_path).close()
    (tmp_path / ENROLLMENT_FILE).write_bytes(content)
    store = KeyStore.open(tmp_path)
    store.close()
    assert store.enrollment is None


def test_the_record_file_is_private_and_holds_no_key_material(tmp_path: Path) -> None:
    """The enrollment record is 0600 JSON with the public key only."""
    store = KeyStore.open(tmp_path)
    _record(store, expires_at=5_000)
    store.close()
    path = tmp_path / ENROLLMENT_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text()) == {
        "clusterId": "cluster-1",
        "recipientId": "recipient-1",
        "publicKey": store.key.public_key,
        "expiresAt": 5_000,
        "enrolledAt": 1_000,
    }
    assert _private_bytes(store.key).hex() not in path.read_text()


@pytest.mark.parametrize(
    ("cluster", "expires_at", "now", "usable"),
    [
        ("cluster-1", None, 10**15, True),
        ("cluster-1", 200_000, 100_000, True),
        ("cluster-1", 160_000, 100_000, False),
        ("cluster-2", None, 0, False),
    ],
    ids=["no expiry", "expires later", "expires within the margin", "another cluster"],
)
def test_an_enrollment_serves_its_own_key_and_cluster_until_shortly_before_it_expires(
    tmp_path: Path, cluster: str, expires_at: int | None, now: int, usable: bool
) -> None:
    """`usable` needs the same cluster, the same key and more than the margin of life left."""
    store = KeyStore.open(tmp_path)
    store.close()
    record = EnrollmentRecord(cluster, "recipient-1", store.key.public_key, expires_at, 0)
    assert record.usable("cluster-1", store.key, now, 60_000) is usable
    other_key = RecipientKey.generate()
    assert record.usable("cluster-1", other_key, now, 60_000) is False


def test_the_lock_file_does_not_block_a_fresh_process(tmp_path: Path) -> None:
    """A lock left by a killed agent is released by the kernel: the file alone blocks nothing."""
    (tmp_path / keys.LOCK_FILE).write_bytes(b"")
    os.chmod(tmp_path / keys.LOCK_FILE, 0o600)
    KeyStore.open(tmp_path).close()
