"""`python -m devstack.systemdcheck run|after-reboot WORKDIR` and `names` (see the package)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from agent.log import configure_logging
from devstack.systemdcheck.checks import CHECKS, after_reboot, run_checks


def main() -> None:
    """Parse the arguments and run the phase they name."""
    parser = argparse.ArgumentParser(prog="python -m devstack.systemdcheck")
    parser.add_argument("phase", choices=("run", "after-reboot", "names"))
    parser.add_argument("workdir", type=Path, nargs="?", default=Path("/srv/check"))
    arguments = parser.parse_args()
    if arguments.phase == "names":
        for name, _, _ in CHECKS:
            print(name)
        return
    workdir: Path = arguments.workdir
    workdir.mkdir(parents=True, exist_ok=True)
    # The stand-ins' own log lines go to a file: the checks' lines are the output.
    log = (workdir / f"standins-{arguments.phase}.log").open("a")
    configure_logging("json", "info", log)
    results = workdir / "results"
    phase = run_checks if arguments.phase == "run" else after_reboot
    try:
        asyncio.run(phase(Path.cwd(), workdir, results))
    except KeyboardInterrupt:
        sys.exit(130)  # Ctrl-C: the host script cleans up and says so


if __name__ == "__main__":
    main()
