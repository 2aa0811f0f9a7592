"""The start-up line the agent logs once its state is open (version, config, Cloudly URL, state,
integrity, health address, watchdog, chunk decoders), then the warnings: what runs, but not as
production should."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import structlog

from agent import __version__
from agent.config import Config
from agent.entry.parts import Parts
from agent.protocol.bytearrays import codec_backends
from agent.store import RevisionStore
from agent.transfers.chunking import DIGESTS_BACKEND

__all__ = ["announce"]

# The composition root's name: the start-up line is its own.
log = structlog.get_logger("agent.entry.app")


def announce(
    config: Config,
    parts: Parts,
    store: RevisionStore,
    config_path: Path | None,
    *,
    tightened: tuple[str, ...],
) -> None:
    """Log the start-up line, then the start-up warnings (`tightened`: what start-up made
    private)."""
    decoders = codec_backends()
    log.info(
        "agent_starting",
        version=__version__,
        config=str(config_path) if config_path is not None else None,
        cloudly_url=config.websocket_url,
        state_directory=str(config.state.directory),
        store_integrity=store.integrity,
        health=config.health.listen,
        watchdog_s=parts.watchdog_s,
        systemd_notify=parts.notifier.enabled,
        chunk_decoders=decoders,
        digests=DIGESTS_BACKEND,
    )
    _warn_about(config, created=parts.created, decoders=decoders, tightened=tightened)


def _warn_about(
    config: Config,
    *,
    created: bool,
    decoders: Mapping[str, str],
    tightened: tuple[str, ...] = (),
) -> None:
    """The start-up warnings: what runs, but not as production should."""
    if tightened:
        log.warning(
            "state_permissions_tightened",
            tightened=list(tightened),
            hint="group or others had access to the state directory or database; the agent "
            "made them private (check-config says so before a start)",
        )
    if created:
        log.warning(
            "state_directory_created",
            state_directory=str(config.state.directory),
            hint="a new store and, with sealed credentials, a new recipient key; under "
            "systemd StateDirectory= creates the directory, so check state.directory",
        )
    if config.cloudly.cleartext_allowed:
        log.warning(
            "cloudly_cleartext",
            cloudly_url=config.websocket_url,
            hint="the machine token and every request cross the network unencrypted "
            "(cloudly.allow_cleartext = true)",
        )
    if decoders.get("buffer") != "native":
        log.warning(
            "chunk_decoder_pure",
            chunk_decoders=decoders,
            hint="this install lacks the native Buffer-form decoder (built without a C "
            "compiler): chunk decoding runs about 3x slower; rebuild the wheel with gcc and "
            "the Python headers",
        )
