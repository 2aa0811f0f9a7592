"""A Corestore 503 storm during execute: the agent, with its default settings, rides it out.

One isolated restore (`devstack.archive.demo_plan`, a small volume) is prepared and staged;
then, at the first resource-status poll of its execute, the reference Corestore answers 503 to
every such poll for `--storm-s` seconds (default 60). The agent runs as its own process with
the production defaults ([corestore] retries 3, outage_tolerance_s 120; only the endpoints, the
file credential and the state directory are set), a stand-in Cloudly drives it. Printed: the
timeline (storm start and end, the polls Corestore answered 503, what `/readyz` said during the
storm and after: its `conditions`) and the restore's final status, which should be `ready`.

    .venv/bin/python -m bench.storm [--storm-s 60] [--keep]

Real time on purpose (the storm is a length of wall time); the agent's tests inject clocks.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import structlog

from agent.corestore.routes import RouteName
from bench._staging_world import (
    BEARER,
    NODE,
    TOKEN,
    agent_process,
    quiet_stand_in_logs,
    say,
    work_directory,
)
from devstack.archive import demo_plan
from devstack.cloudly import StandInCloudly, cluster_document
from devstack.corestore import start
from devstack.driver import RestoreDriver

__all__ = ["main"]

MiB = 2**20


def _readyz(address: str) -> dict[str, Any]:
    """`/readyz`'s body (503 while not ready: still a body)."""
    try:
        with urllib.request.urlopen(f"http://{address}/readyz", timeout=5) as answer:
            body: dict[str, Any] = json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        body = json.loads(refused.read())
    return body


def _health_address(log: Path) -> str:
    """The agent's health address, from its `health_listening` log line."""
    for line in log.read_text(errors="replace").splitlines():
        if "health_listening" in line:
            return str(json.loads(line)["address"])
    raise RuntimeError(f"no health_listening line in {log}")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """The storm, the restore, what readiness said."""
    quiet_stand_in_logs()
    # The in-process reference Corestore logs a debug line per request: not a figure.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    with work_directory("storm", args.dir, keep=args.keep) as work:
        async with await start(data_dir=work / "corestore", bearer=BEARER) as corestore:
            plan = demo_plan("cluster-1", NODE, big_size=8 * MiB)
            document = cluster_document(plan.cluster_id, {NODE: corestore.url})
            async with (
                StandInCloudly(token=TOKEN, cluster=document) as cloudly,
                agent_process(
                    "agent", ["agent", "run"], work / "agent", cloudly, chunk_mib=4, window=16
                ) as child,
            ):
                address = _health_address(child.log_path)
                driver = RestoreDriver(cloudly, plan, call_timeout=600.0)
                await driver.prepare()
                await driver.stage_all()
                # The storm begins with the execute: every resource-status poll answers 503.
                started = time.monotonic()
                corestore.faults.fail_for(RouteName.RESOURCE_STATUS, args.storm_s)
                await driver.execute()
                await asyncio.sleep(args.storm_s / 2)
                during = await asyncio.to_thread(_readyz, address)
                state = await driver.wait_until({"ready", "failed"}, timeout=600.0)
                ended = time.monotonic() - started
                after = await asyncio.to_thread(_readyz, address)
                retried = sum(
                    1
                    for line in child.log_path.read_text(errors="replace").splitlines()
                    if '"retrying"' in line and "resource-status" in line
                )
    return {
        "storm_s": args.storm_s,
        "status": state["status"],
        "last_error": state.get("lastErrorCode"),
        "settled_after_storm_began_s": round(ended, 1),
        "resource_status_polls": corestore.faults.hits[RouteName.RESOURCE_STATUS],
        "resends_logged": retried,
        "conditions_during": during.get("conditions"),
        "conditions_after": after.get("conditions"),
    }


def main(argv: list[str] | None = None) -> int:
    """Run and print what happened (one JSON object)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--storm-s", type=float, default=60.0, help="the storm's length")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    parser.add_argument("--dir", type=Path, help="where the work directory goes")
    args = parser.parse_args(argv)
    say(f"a {args.storm_s:g} s 503 storm on resource-status during execute")
    print(json.dumps(asyncio.run(run(args)), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
