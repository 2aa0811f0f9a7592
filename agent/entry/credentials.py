"""Where the agent's Corestore bearers come from (docs/credentials.md): sealed by Cloudly to the
agent's recipient key, enrolled by a session connect step (`sealed_credentials`), with the
periodic check that Cloudly still seals to that key (`check_recipient`); or the one bearer of
a file, the development option (`fixed_credentials`)."""

from __future__ import annotations

from collections.abc import Callable

import structlog

from agent.clock import Clock
from agent.config import Config, Secrets
from agent.corestore.credentials import FixedCredentials
from agent.credentials.contest import RecipientWatch
from agent.credentials.enrollment import Enrollment
from agent.credentials.keys import KeyStore
from agent.credentials.provider import SealedCredentials
from agent.errors import AgentError, ConfigError
from agent.session.client import CloudlySession
from agent.watch.status import AgentStatus, SessionState

__all__ = ["check_recipient", "fixed_credentials", "sealed_credentials"]

# The composition root's name: these lines are part of its start-up.
log = structlog.get_logger("agent.entry.app")


def sealed_credentials(
    config: Config,
    keys: KeyStore | None,
    session: Callable[[], CloudlySession],
    watch: RecipientWatch,
    clock: Clock,
) -> tuple[Enrollment, SealedCredentials] | None:
    """The key's enrollment and the per-node sealed credentials; None for the file option."""
    if keys is None:
        return None
    log.info("recipient_key_loaded", public_key=keys.key.public_key)
    timeout = config.cloudly.call_timeout_s
    enrollment = Enrollment(keys, call_timeout=timeout, clock=clock)
    provider = SealedCredentials(
        key=keys.key,
        enrollment=enrollment,
        caller=session,
        cluster_view=lambda: session().cluster_view,
        call_timeout=timeout,
        watch=watch,
    )
    return enrollment, provider


def fixed_credentials(secrets: Secrets) -> FixedCredentials:
    """The development option: the one bearer of `corestore.credential_file` for every node."""
    if secrets.corestore_credential is None:
        raise ConfigError(
            "corestore.credential_file", 'is required with credential_source = "file"'
        )
    log.warning(
        "corestore_credential_from_file",
        hint='a development option: production configs leave credential_source at "sealed"',
    )
    return FixedCredentials(secrets.corestore_credential)


async def check_recipient(
    provider: SealedCredentials, status: AgentStatus, interval: float, clock: Clock
) -> None:
    """Every `interval` while connected, whether Cloudly still seals to the agent's recipient:
    a second agent with the same token retires it (agent/credentials/contest.py). After a
    retirement the next check comes after a fifth of it: a second agent shows sooner."""
    delay = interval
    while True:
        await status.wait_until(lambda snapshot: snapshot.state is SessionState.CONNECTED)
        await clock.sleep(delay)
        if status.state is SessionState.CONNECTED:
            try:
                enrolled = await provider.check_recipient()
            except AgentError as exc:  # a broken session: the next connect checks again
                log.debug("recipient_check_failed", error=str(exc))
                enrolled = None
            delay = interval / 5 if enrolled is False else interval
