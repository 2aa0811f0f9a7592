"""The scalar rules of the Corestore control API: ids, object paths, digests, grants, chunk size.

Pure. Each rule has a `*_problem` form (returns the reason or None; the reference server turns it
into a 400) and a `check_*` form (raises `LocalProtocolError`: the agent built a bad request).
"""

from __future__ import annotations

import re
from typing import Final

from agent.contracts.backup import MAX_ARCHIVE_PATH_BYTES, archive_path_problem
from agent.contracts.base import MAX_PATH_SEGMENT_ID_LENGTH, path_segment_id_problem
from agent.errors import LocalProtocolError

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "MAX_ARCHIVE_PATH_BYTES",
    "MAX_CHUNK_SIZE",
    "MAX_GRANT_LENGTH",
    "MAX_ID_LENGTH",
    "archive_path_problem",
    "check_archive_path",
    "check_chunk",
    "check_id",
    "check_sha256",
    "id_problem",
    "is_compact_jws",
    "sha256_problem",
]

# One chunk PUT carries at most this many bytes.
MAX_CHUNK_SIZE: Final = 16 * 1024 * 1024
# What one chunk PUT carries unless configured otherwise (staging and closure imports alike).
DEFAULT_CHUNK_SIZE: Final = 4 * 1024 * 1024
MAX_ID_LENGTH: Final = MAX_PATH_SEGMENT_ID_LENGTH
# HTTP servers cap one header line near 8 KiB (aiohttp: 8190 bytes); an RS256 grant binding
# digests of the mappings and the manifest is 1-2 KiB.
MAX_GRANT_LENGTH: Final = 8000

_SHA256: Final = re.compile(r"[0-9a-f]{64}")
_JWS_PART: Final = r"[A-Za-z0-9_-]+"
_COMPACT_JWS: Final = re.compile(rf"{_JWS_PART}\.{_JWS_PART}\.{_JWS_PART}")


def id_problem(value: str) -> str | None:
    """Why `value` cannot be a restore, namespace, archive, mapping or snapshot id, or None.

    The contracts' one `PathSegmentId` rule (`agent.contracts.base`): what Cloudly may send is
    exactly what the routes may carry, so a request the agent accepted never fails here.
    """
    return path_segment_id_problem(value)


def sha256_problem(value: str) -> str | None:
    """Why `value` is not 64 lower-case hex characters, or None."""
    return None if _SHA256.fullmatch(value) else "must be 64 lower-case hex characters"


def is_compact_jws(value: str) -> bool:
    """Whether `value` has the shape of a compact JWS (three non-empty base64url parts)."""
    return len(value) <= MAX_GRANT_LENGTH and _COMPACT_JWS.fullmatch(value) is not None


def check_id(value: str, what: str) -> None:
    """Raise `LocalProtocolError` unless `value` is a valid id (`what` names it, not its value)."""
    problem = id_problem(value)
    if problem:
        raise LocalProtocolError(f"{what} {problem}")


def check_archive_path(path: str) -> None:
    """Raise `LocalProtocolError` unless `path` is a valid object path."""
    problem = archive_path_problem(path)
    if problem:
        raise LocalProtocolError(f"object path {problem}")


def check_sha256(value: str, what: str) -> None:
    """Raise `LocalProtocolError` unless `value` is a sha256 hex digest."""
    problem = sha256_problem(value)
    if problem:
        raise LocalProtocolError(f"{what} {problem}")


def check_chunk(data: bytes | bytearray | memoryview, offset: int, sha256: str) -> None:
    """Raise `LocalProtocolError` unless one chunk PUT may carry `data` at `offset` with its
    `sha256` (a staged object's chunk or a closure import's alike)."""
    if not 0 < len(data) <= MAX_CHUNK_SIZE:
        raise LocalProtocolError(f"a chunk holds 1 to {MAX_CHUNK_SIZE} bytes, not {len(data)}")
    if offset < 0:
        raise LocalProtocolError(f"a chunk offset is >= 0, not {offset}")
    check_sha256(sha256, "chunk sha256")
