"""The agent's X25519 recipient key and its enrollment record, in the state directory.

    <state>/recipient.key    the private key: 32 raw bytes, mode 0600 (the only secret the agent
                             ever writes to disk)
    <state>/recipient.json   the enrollment: {clusterId, recipientId, publicKey, expiresAt,
                             enrolledAt} (not secret; 0600 all the same)
    <state>/recipient.lock   held (flock) by the running agent and by `rotate-key`

`KeyStore.open(directory)` creates the key on first start and reads the same key back on every
later one; `rotate_key(directory)` (`restore-agent rotate-key`, only while no agent runs on that
directory) replaces it and forgets the enrollment, so the next start enrolls again. Both files are
written atomically (`agent.durable.write_atomically`: a temporary file in the same directory,
fsync, rename over the old one, fsync of the directory). A crash leaves the old file or the new
one, never a mix. The key is never logged, never sent, never on argv: `RecipientKey` prints its
public key only and refuses to be pickled.

A key file that is not a regular 32-byte file or that group or others may access stops start-up
(`ConfigError` on `state.directory`, exit code 2): a key someone else could have read must be
rotated, not used. An unreadable enrollment record is only a reason to enroll again.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, NoReturn, final

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from agent.contracts.credentials import b64url
from agent.durable import fsync_directory, write_atomically
from agent.errors import ConfigError

__all__ = [
    "ENROLLMENT_FILE",
    "KEY_FILE",
    "LOCK_FILE",
    "EnrollmentRecord",
    "KeyStore",
    "RecipientKey",
    "check_key_file",
    "rotate_key",
]

KEY_FILE: Final = "recipient.key"
ENROLLMENT_FILE: Final = "recipient.json"
LOCK_FILE: Final = "recipient.lock"

_KEY_BYTES: Final = 32
_MODE: Final = 0o600
_DIR_MODE: Final = 0o700
_MAX_RECORD_BYTES: Final = 64 * 1024
_CONFIG_KEY: Final = "state.directory"


@final
class RecipientKey:
    """The X25519 private key. Prints as its public key; cannot be pickled or copied out."""

    __slots__ = ("_private", "_public")

    def __init__(self, private: X25519PrivateKey) -> None:
        self._private = private
        self._public = private.public_key().public_bytes_raw()

    @classmethod
    def generate(cls) -> RecipientKey:
        """A fresh key from the operating system's randomness."""
        return cls(X25519PrivateKey.generate())

    @property
    def private_key(self) -> X25519PrivateKey:
        """The key object HPKE opens with (its repr shows no key material)."""
        return self._private

    @property
    def public_bytes(self) -> bytes:
        """The 32-byte public key."""
        return self._public

    @property
    def public_key(self) -> str:
        """The public key as it goes on the wire (base64url)."""
        return b64url(self._public)

    def __repr__(self) -> str:
        return f"RecipientKey(public={self.public_key})"

    __str__ = __repr__

    def __reduce__(self) -> NoReturn:
        raise TypeError("a RecipientKey cannot be pickled")

    def __copy__(self) -> RecipientKey:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> RecipientKey:
        return self


@dataclass(frozen=True, slots=True)
class EnrollmentRecord:
    """What Cloudly answered `completeSecretRecipientEnrollment`, for which key and cluster."""

    cluster_id: str
    recipient_id: str
    public_key: str  # base64url, the key this recipient was enrolled with
    expires_at: int | None  # epoch ms; None: no expiry
    enrolled_at: int  # epoch ms

    def usable(self, cluster_id: str, key: RecipientKey, now_ms: int, margin_ms: int) -> bool:
        """Whether this enrollment still serves `key` in `cluster_id` for at least `margin_ms`."""
        return (
            self.cluster_id == cluster_id
            and self.public_key == key.public_key
            and (self.expires_at is None or self.expires_at - now_ms > margin_ms)
        )

    def to_json(self) -> dict[str, Any]:
        """The record file's content."""
        return {
            "clusterId": self.cluster_id,
            "recipientId": self.recipient_id,
            "publicKey": self.public_key,
            "expiresAt": self.expires_at,
            "enrolledAt": self.enrolled_at,
        }

    @classmethod
    def from_json(cls, data: Any) -> EnrollmentRecord:
        """Read a record file's content; ValueError if it is not one."""
        if not isinstance(data, dict) or set(data) != {
            "clusterId",
            "recipientId",
            "publicKey",
            "expiresAt",
            "enrolledAt",
        }:
            raise ValueError("not an enrollment record")
        cluster_id, recipient_id = data["clusterId"], data["recipientId"]
        public_key, expires_at, enrolled_at = (
            data["publicKey"],
            data["expiresAt"],
            data["enrolledAt"],
        )
        texts = (cluster_id, recipient_id, public_key)
        if not all(isinstance(text, str) and text for text in texts):
            raise ValueError("not an enrollment record")
        if not (expires_at is None or type(expires_at) is int) or type(enrolled_at) is not int:
            raise ValueError("not an enrollment record")
        return cls(cluster_id, recipient_id, public_key, expires_at, enrolled_at)


# --- files -------------------------------------------------------------------------------------


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
        fsync_directory(path.parent)


def _read_key(path: Path) -> RecipientKey | None:
    """The key in `path`, None if there is none; ConfigError if the file is unusable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NOCTTY)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(_CONFIG_KEY, f"{path}: cannot be read ({exc.strerror or exc})") from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(_CONFIG_KEY, f"{path}: is not a regular file")
        if info.st_mode & 0o077:
            mode = stat.S_IMODE(info.st_mode)
            raise ConfigError(
                _CONFIG_KEY,
                f"{path}: group or others have access (mode {mode:04o}); the key may have been "
                "read: run `restore-agent rotate-key`",
            )
        raw = os.read(fd, _KEY_BYTES + 1)
    finally:
        os.close(fd)
    if len(raw) != _KEY_BYTES:
        raise ConfigError(_CONFIG_KEY, f"{path}: is not a {_KEY_BYTES}-byte X25519 private key")
    return RecipientKey(X25519PrivateKey.from_private_bytes(raw))


def _write_key(path: Path, key: RecipientKey) -> None:
    write_atomically(path, key.private_key.private_bytes_raw())


def _read_record(path: Path) -> EnrollmentRecord | None:
    try:
        if path.stat().st_size > _MAX_RECORD_BYTES:
            return None
        return EnrollmentRecord.from_json(json.loads(path.read_bytes()))
    except (OSError, ValueError):  # absent or unreadable: enrolling again is always safe
        return None


def _ensure_directory(directory: Path) -> None:
    directory.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)
    if stat.S_IMODE(directory.stat().st_mode) != _DIR_MODE:
        directory.chmod(_DIR_MODE)


def _lock(directory: Path) -> int:
    """An exclusive flock on the directory's lock file; ConfigError if someone holds it."""
    fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, _MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ConfigError(
            _CONFIG_KEY,
            f"{directory}: another restore-agent uses this state directory (stop it first)",
        ) from None
    except BaseException:
        os.close(fd)
        raise
    return fd


class KeyStore:
    """The recipient key and its enrollment record, held for the running agent."""

    def __init__(self, directory: Path, lock_fd: int, key: RecipientKey) -> None:
        self._directory = directory
        self._lock_fd: int | None = lock_fd
        self._key = key
        self._record = _read_record(directory / ENROLLMENT_FILE)

    @classmethod
    def open(cls, directory: Path) -> KeyStore:
        """Lock `directory`, read the key (creating it on first start) and the enrollment."""
        _ensure_directory(directory)
        lock_fd = _lock(directory)
        try:
            path = directory / KEY_FILE
            key = _read_key(path)
            created = key is None
            if key is None:
                key = RecipientKey.generate()
                _write_key(path, key)
            store = cls(directory, lock_fd, key)
            if created:
                store.forget_enrollment()  # a record can only belong to an older key
            return store
        except BaseException:
            os.close(lock_fd)
            raise

    @property
    def key(self) -> RecipientKey:
        """The recipient key."""
        return self._key

    @property
    def enrollment(self) -> EnrollmentRecord | None:
        """The last enrollment recorded, if any (it may belong to another cluster or be
        expired: `EnrollmentRecord.usable` says)."""
        return self._record

    def save_enrollment(self, record: EnrollmentRecord) -> None:
        """Record a completed enrollment (atomically)."""
        write_atomically(
            self._directory / ENROLLMENT_FILE,
            json.dumps(record.to_json(), sort_keys=True).encode() + b"\n",
        )
        self._record = record

    def forget_enrollment(self) -> None:
        """Remove the enrollment record: the next connect enrolls again."""
        _remove(self._directory / ENROLLMENT_FILE)
        self._record = None

    def close(self) -> None:
        """Release the directory's lock."""
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            os.close(fd)


def check_key_file(directory: Path) -> None:
    """Refuse (`ConfigError`) a key file `KeyStore.open` would refuse; read only, create
    nothing (`check-config` and the start-up checks before anything is created)."""
    _read_key(directory / KEY_FILE)


def rotate_key(directory: Path) -> RecipientKey:
    """Replace the recipient key with a new one and forget the enrollment (the next start of
    the agent enrolls the new key). ConfigError while an agent runs on `directory`."""
    _ensure_directory(directory)
    lock_fd = _lock(directory)
    try:
        key = RecipientKey.generate()
        # The record goes first: a crash in between leaves the old key without an enrollment,
        # which only means enrolling it again.
        _remove(directory / ENROLLMENT_FILE)
        _write_key(directory / KEY_FILE, key)
        return key
    finally:
        os.close(lock_fd)
