"""The stand-ins an installed agent runs against outside the tests (scripts/install-check).

`python -m bench.standins WORKDIR` starts a reference Corestore and a stand-in Cloudly on
127.0.0.1 (free ports), writes the agent's config and its machine token (0600) into WORKDIR
(`agent.toml`; the health endpoint on `--health`, by default a unix socket in WORKDIR, so no
port of an agent running here is taken), prints one JSON line with the URLs and the config
path, then waits. Once the agent connects it drives one isolated restore of the demo plan
(prepare, stage every object, execute) to `ready` and leaves it there, so the agent's
`/v1/restores` and `restore-agent status` have a row to show; `--no-restore` skips that. A
`restore-agent check-config --connect` probe before the agent (the README's step 4) is answered
and then ignored: the restore waits for the agent's own session. Stops on SIGTERM/SIGINT.
Not a test and not the product: repository code, like `devstack/`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import signal
import sys
from pathlib import Path

from devstack.archive import demo_plan
from devstack.cloudly import StandInCloudly, cluster_document
from devstack.corestore import start
from devstack.credentials import CredentialAuthority
from devstack.driver import RestoreDriver, stand_in_settings

_CONFIG = """\
[cloudly]
url = "{cloudly_url}"
token_file = "machine-token"
backoff_base_s = 0.2
backoff_cap_s = 2.0
[corestore]
restore_poll_interval_s = 0.05
[state]
directory = "state"
[health]
listen = "{health}"
[log]
format = "json"
"""


def _secret(path: Path, value: str) -> None:
    path.write_text(value + "\n")
    path.chmod(0o600)


async def _main(workdir: Path, health: str, restore: bool, token: str, bearer: str) -> None:
    corestore = await start(data_dir=workdir / "corestore", bearer=bearer)
    plan = demo_plan(big_size=8 * 1024 * 1024)
    document = cluster_document(plan.cluster_id, {plan.node: corestore.url})
    # The production path: the node's bearer reaches the agent sealed to its own key.
    authority = CredentialAuthority(plan.cluster_id, {plan.node: bearer})
    cloudly = StandInCloudly(
        token=token, cluster=document, peer_settings=stand_in_settings(), credentials=authority
    )
    await cloudly.start()
    config = workdir / "agent.toml"
    config.write_text(_CONFIG.format(cloudly_url=cloudly.url, health=health))
    print(json.dumps({"cloudly": cloudly.url, "corestore": corestore.url, "config": str(config)}))
    sys.stdout.flush()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        if restore:
            # The agent's session, not the README's `check-config --connect` probe before it.
            await cloudly.wait_for_agent()
            driver = RestoreDriver(cloudly, plan, piece_size=256 * 1024, poll_interval=0.05)
            await driver.prepare()
            await driver.stage_all()
            await driver.execute()
            state = await driver.wait_until({"ready", "failed"})
            print(json.dumps({"restore": plan.restore_id, "status": state["status"]}))
            sys.stdout.flush()
        await stop.wait()
    finally:
        await cloudly.stop()
        await corestore.stop()


def main() -> None:
    """Parse the arguments and run until stopped."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("workdir", type=Path)
    parser.add_argument(
        "--health",
        default=None,
        help="the agent's [health] listen (default: unix:WORKDIR/health.sock, so no port is "
        "taken from an agent that may run here)",
    )
    parser.add_argument("--no-restore", action="store_true", help="drive no restore")
    arguments = parser.parse_args()
    workdir: Path = arguments.workdir
    token, bearer = f"mt-{secrets.token_urlsafe(24)}", f"cs-{secrets.token_urlsafe(24)}"
    workdir.mkdir(parents=True, exist_ok=True)
    _secret(workdir / "machine-token", token)
    health = arguments.health or f"unix:{(workdir / 'health.sock').absolute()}"
    asyncio.run(_main(workdir, health, not arguments.no_restore, token, bearer))


if __name__ == "__main__":
    main()
