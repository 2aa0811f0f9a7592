"""`python -m devstack.corestore --data-dir D --port P --bearer-file F [--host H] [--discard]`.

`--discard`: a discarding Corestore for benchmarks (staging chunks verified, judged and thrown
away; the ledger in memory only).

Prints `{"url": ...}` on one line when listening; stops cleanly on SIGTERM/SIGINT (exit 0).
Logs go to stderr (JSON lines, `--log-level`, default warning) so stdout carries only that line:
a parent that reads the first line and nothing more must never block the server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path

from agent.log import configure_logging
from agent.secret import Secret
from devstack.corestore import start


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m devstack.corestore")
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--bearer-file", type=Path, required=True)
    parser.add_argument("--log-level", default="warning")
    parser.add_argument("--discard", action="store_true", help="throw staging bytes away")
    return parser.parse_args(argv)


async def _serve(arguments: argparse.Namespace) -> None:
    bearer = Secret(arguments.bearer_file.read_text().strip())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    handle = await start(
        data_dir=arguments.data_dir,
        bearer=bearer,
        host=arguments.host,
        port=arguments.port,
        discard=arguments.discard,
    )
    try:
        sys.stdout.write(json.dumps({"url": handle.url}) + "\n")
        sys.stdout.flush()
        await stop.wait()
    finally:
        await handle.stop()


def main(argv: list[str] | None = None) -> int:
    """Run until SIGTERM or SIGINT."""
    arguments = _arguments(argv)
    configure_logging("json", arguments.log_level, stream=sys.stderr)
    asyncio.run(_serve(arguments))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
