"""The restore grant: its shape is checked here, its authority only by Corestore.

`restoreGrant` is a compact RS256 JWS Cloudly signs for exactly one operation. The agent cannot
verify the signature (it holds no Cloudly key and must not: that would be a second, weaker
authority next to Corestore's), so it does not decode the claims either — refusing early on
unverified claims would let a forged token steer what the agent refuses. It checks only that the
value *can* be a compact JWS: three non-empty base64url parts, at most `MAX_GRANT_LENGTH`
characters. A malformed grant is refused with `grant-invalid` before anything changes.

The grant stays a `Secret` from validation to the header Corestore receives: it is held in
memory for one request (or for the background work one request started), never written to
SQLite, a log line, an error text or a metric. `request_digest` drops it, so a retry carrying a
fresh grant is still an exact replay.

Length: the grant travels to Corestore in one HTTP header, so the bound is the one the Corestore
routes carry (`agent.corestore.shapes.MAX_GRANT_LENGTH`); a grant the agent cannot carry is
refused before it changes any state rather than after.
"""

from __future__ import annotations

from agent.corestore.shapes import MAX_GRANT_LENGTH, is_compact_jws
from agent.errors import GrantInvalid
from agent.secret import Secret

__all__ = ["MAX_GRANT_LENGTH", "check_grant"]


def check_grant(grant: Secret) -> Secret:
    """`grant` if it has the shape of a compact JWS, else `GrantInvalid` (which never quotes it)."""
    value = grant.reveal()
    if len(value) > MAX_GRANT_LENGTH:
        raise GrantInvalid(f"restoreGrant is longer than {MAX_GRANT_LENGTH} characters")
    if not is_compact_jws(value):
        raise GrantInvalid(
            "restoreGrant is not a compact JWS (three non-empty base64url parts joined by dots)"
        )
    return grant
