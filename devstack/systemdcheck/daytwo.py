"""The checks of day two: docs/operations.md's runbooks and day-two pages run as written on the
installed node, and an upgrade to a build with a new schema migration and the rollback from it.

Each block runs verbatim with `bash -euo pipefail` from a checkout (the runbooks and pages are
written for a shell on the relay node, `restore-agent` the command readme.md's step 2 installs);
a block that exits non-zero fails its check with its output's tail.

    runbooks         every ```sh block under "### Runbooks", in order (the unit is started
                     again after each: the duplicate-agent page's fix disables it)
    token-rotation   "Rotating the machine token" (the stand-in's token as the new one)
    rotate-key       "Rotating credentials, and in which order" as root: the new key is the
                     unit's user's, the agent enrolls it with Cloudly and is ready
    upgrade          version A runs with its work recorded; "The upgrade" from a build B that
                     adds a schema migration: B's version, the database migrated, its copy
                     beside it, the work still listed; "Rolling back": `state rollback` with
                     B's command, then "The upgrade" from A's checkout: A's version, A's
                     schema, the work still listed
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
from pathlib import Path
from typing import Final

from devstack.systemdcheck.node import Node
from devstack.systemdcheck.readme import sh_blocks
from devstack.systemdcheck.systemd import CheckFailed, run

__all__ = ["rotate_key", "runbooks", "token_rotation", "upgrade"]

_OPERATIONS: Final = "docs/operations.md"
_STATE: Final = Path("/var/lib/private/restore-agent")
_DATABASE: Final = _STATE / "state.sqlite3"
_COMMAND: Final = "/usr/local/bin/restore-agent"
# A schema migration only build B has: harmless to every table the agents use.
_PROBE_MIGRATION: Final = "CREATE TABLE upgrade_probe (id INTEGER PRIMARY KEY);\n"


async def _block(node: Node, script: str, *, cwd: Path, env: dict[str, str] | None = None) -> str:
    """Run one documented block as written; its output, or `CheckFailed` with its tail."""
    done = await run(
        "bash", "-euo", "pipefail", "-c", script, cwd=cwd, env={**os.environ, **(env or {})},
        timeout=900,
    )  # fmt: skip
    log = node.workdir / "day-two.log"
    with log.open("a") as handle:
        handle.write(f"$ {script}\n{done.out}\n{done.err}\n(exit {done.code})\n")
    if done.code != 0:
        tail = " | ".join((done.err.strip() or done.out.strip()).splitlines()[-4:])
        first = script.strip().splitlines()[0]
        raise CheckFailed(f"`{first}`... exited {done.code}: {tail}")
    return done.out


def _blocks(node: Node, heading: str) -> list[str]:
    return sh_blocks((node.checkout / _OPERATIONS).read_text(), heading)


async def runbooks(node: Node) -> str:
    """Every runbook block as written, each exit 0 with the agent running and ready."""
    blocks = _blocks(node, "### Runbooks")
    for script in blocks:
        await _block(node, script, cwd=node.checkout)
        await run("systemctl", "enable", "restore-agent")
        await node.start()
    lines = sum(len(b.strip().splitlines()) for b in blocks)
    return f"{len(blocks)} runbook blocks ({lines} lines) exited 0 as written; the unit runs"


async def token_rotation(node: Node) -> str:
    """The planned token rotation as written: check-config --connect, restart, ready."""
    [script] = _blocks(node, "### Rotating the machine token")
    out = await _block(node, script, cwd=node.checkout, env={"NEW_MACHINE_TOKEN": node.stack.token})
    if "cloudly: OK" not in out:
        raise CheckFailed("the rotation's check-config --connect printed no `cloudly: OK`")
    return "the token installed 0600, check-config --connect OK, restarted, status ready"


def _enrolled(node: Node) -> int:
    return sum(1 for event in node.stack.cloudly.events if event.kind == "recipient-enrolled")


async def rotate_key(node: Node) -> str:
    """`rotate-key` run as root, as the page says: the key is the unit's user's, the start
    enrolls it, the agent is ready."""
    [script] = _blocks(node, "### Rotating credentials, and in which order")
    before, key = _enrolled(node), (_STATE / "recipient.key").read_bytes()
    await _block(node, script, cwd=node.checkout)
    owner, held = _STATE.stat().st_uid, (_STATE / "recipient.key").stat()
    if held.st_uid != owner:
        raise CheckFailed(f"recipient.key is uid {held.st_uid}'s, the unit's user is {owner}")
    if (_STATE / "recipient.key").read_bytes() == key:
        raise CheckFailed("the key is the one from before the rotation")
    if _enrolled(node) <= before:
        raise CheckFailed("the stand-in Cloudly saw no new enrollment")
    return f"rotated as root: recipient.key owned by the unit's uid {owner}, enrolled, ready"


async def _version(node: Node) -> str:
    return (await run(_COMMAND, "--version")).expect().out.strip().rpartition(" ")[2]


async def _restore_ids() -> set[str]:
    done = (await run(_COMMAND, "status", "--json")).expect()
    return {row["restoreId"] for row in json.loads(done.out)["restores"]}


def _schema(path: Path) -> int:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        return int(db.execute("SELECT MAX(version) FROM schema_version").fetchone()[0])


def _build_b(node: Node, version_a: str) -> Path:
    """Build B: the checkout with one migration more and a version of its own."""
    b = node.workdir / "build-b"
    shutil.rmtree(b, ignore_errors=True)
    shutil.copytree(
        node.checkout, b, ignore=shutil.ignore_patterns(".venv", "dist", "build", "*.egg-info")
    )
    schema = b / "agent" / "store" / "schema.py"
    text = schema.read_text()
    tuple_line = re.search(r"^MIGRATIONS: Final\[tuple\[str, \.\.\.\]\] = \((.*)\)$", text, re.M)
    if tuple_line is None:
        raise CheckFailed("agent/store/schema.py has no one-line MIGRATIONS tuple to extend")
    extended = tuple_line.group(0).replace(
        tuple_line.group(1), f"{tuple_line.group(1)}, {_PROBE_MIGRATION!r}"
    )
    schema.write_text(text.replace(tuple_line.group(0), extended))
    # No git in the machine: the version B's build carries is written as setup.py would.
    (b / "agent" / "_version.py").write_text(f'VERSION = "{version_a}.b"\n')
    return b


async def upgrade(node: Node) -> str:
    """A -> B (one migration more) as "The upgrade" says, then back to A as "Rolling back"
    says; the work A recorded is listed throughout."""
    blocks = _blocks(node, "## Upgrading and rolling back")
    [upgrade_block] = [b for b in blocks if "--force-reinstall" in b]
    [rollback_block] = [b for b in blocks if "state rollback" in b]
    version_a, schema_a = await _version(node), _schema(_DATABASE)
    work = await _restore_ids()
    if not work:
        raise CheckFailed("no restore is recorded to carry through the upgrade")
    b = _build_b(node, version_a)
    await _block(node, upgrade_block, cwd=b)
    version_b, schema_b = await _version(node), _schema(_DATABASE)
    copies = sorted(_STATE.glob(f"state.sqlite3.schema-{schema_a}-*"))
    if version_b != f"{version_a}.b" or schema_b != schema_a + 1 or not copies:
        raise CheckFailed(
            f"after the upgrade: version {version_b}, schema {schema_b} (from {schema_a}), "
            f"copies {[c.name for c in copies]}"
        )
    if await _restore_ids() != work:
        raise CheckFailed("the upgrade lost recorded work")
    await _block(node, rollback_block, cwd=b)
    await _block(node, upgrade_block, cwd=node.checkout)
    version_back, schema_back = await _version(node), _schema(_DATABASE)
    if (version_back, schema_back) != (version_a, schema_a):
        raise CheckFailed(f"after the rollback: version {version_back}, schema {schema_back}")
    if await _restore_ids() != work:
        raise CheckFailed("the rollback lost recorded work")
    return (
        f"{version_a} (schema {schema_a}) -> {version_b} (schema {schema_b}, copy "
        f"{copies[-1].name}) -> rolled back to {version_a} (schema {schema_a}); "
        f"{len(work)} recorded restores listed throughout, each step as written"
    )
