"""A long-running `node tests/contracts/oracle.mjs`: the seeds' TypeScript as a test oracle."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

__all__ = ["ORACLE_SCRIPT", "NodeOracle", "node_executable"]

ORACLE_SCRIPT = Path(__file__).with_name("oracle.mjs")


def node_executable() -> str | None:
    """The `node` on PATH, if any."""
    return shutil.which("node")


class NodeOracle:
    """Asks the transcribed seed functions, one JSON line per question."""

    def __init__(self, node: str) -> None:
        self._process = subprocess.Popen(
            [node, str(ORACLE_SCRIPT)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            encoding="utf-8",
        )

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        """One answer: `{"ok": result}` or `{"threw": name}`."""
        assert self._process.stdin is not None
        assert self._process.stdout is not None
        # ensure_ascii keeps lone surrogates as \\udXXX escapes, which JSON.parse turns back into
        # the same UTF-16 code units.
        self._process.stdin.write(json.dumps(request, ensure_ascii=True) + "\n")
        self._process.stdin.flush()
        line = self._process.stdout.readline()
        if not line:
            raise RuntimeError("the node oracle exited")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def corestore(self, value: Any, path: str | None = None) -> list[str]:
        """`validateClusterNodeCorestore(value[, path])` as Node answers it."""
        request: dict[str, Any] = {"fn": "corestore", "value": value}
        if path is not None:
            request["path"] = path
        answer = self.ask(request)
        assert "ok" in answer, answer
        result: list[str] = answer["ok"]
        return result

    def close(self) -> None:
        """Ends the oracle and waits for it."""
        assert self._process.stdin is not None
        self._process.stdin.close()
        self._process.wait(timeout=10)
        if self._process.stdout is not None:
            self._process.stdout.close()
